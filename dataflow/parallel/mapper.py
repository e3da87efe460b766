"""The parallel map: ordering, strictness, buffering and error policy, written once.

:class:`ParallelMapData` pulls datapoints from its source in the consuming thread, hands them in
chunks to an *executor* and yields the results. Everything a user can rely on about a parallel
dataflow (exactly-once per pass in strict mode, source order when ordered, what happens on an
error, the bound on buffered datapoints) is decided here, so threads, processes and any later
executor behave the same. An executor only runs chunks; its contract is :class:`Executor`.

Worker side, :func:`run_chunk` is the one loop that applies the map function to a chunk; every
executor's worker calls it.
"""
import collections
import copy
import logging
import time
import traceback
import types
import weakref

import numpy as np

from ..base import DataFlowReentrantGuard, ProxyDataFlow
from ..rng import set_datapoint_key
from ..stats import ParallelStats
from . import cvthreads
from .autotune import AutoTuner

__all__ = ["ParallelMapData", "Executor", "run_chunk", "WorkerError", "WorkerTraceback",
           "OK", "DROP", "ERR"]

logger = logging.getLogger("dataflow")

CLOSED_WHILE_ITERATING = "the dataflow was closed while it was being iterated"

# Kinds of result a worker reports for one datapoint.
OK, DROP, ERR = 0, 1, 2

# Chunks are sized so that one takes about this long in a worker: long enough that the per-chunk
# hand-over cost (and the consumer's CPU time, which competes with the workers) stays small,
# short enough that work stays spread over workers. 10 ms measured best on ~1 ms Python maps.
_CHUNK_SECONDS = 0.01
_MAX_CHUNK = 64
# ... and so that a chunk's results hold at most about this many bytes of arrays: a worker's
# results of one chunk are alive together, and large ones must stay few to be reused while hot
# (and, for processes, fit in one message of shared memory: transport.MESSAGE_BYTES).
_CHUNK_BYTES = 4 << 20


def _array_bytes(value):
    """Bytes of the numpy arrays in a result: the result itself, or its items one level down
    (a list, tuple or dict of arrays and other values)."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, (list, tuple)):
        return 0
    return sum(v.nbytes for v in value if isinstance(v, np.ndarray))


class WorkerTraceback(Exception):
    """Carries the formatted traceback of an exception raised in a worker. It is set as the
    ``__cause__`` of the re-raised exception, so it prints above the consumer's traceback."""

    def __init__(self, text):
        super().__init__(text)
        self.text = text

    def __str__(self):
        return "\n\n" + self.text


class WorkerError:
    """What a worker reports when the map function failed on one datapoint.

    ``exc`` is the exception raised (or a ``TypeError`` for a result that is not a datapoint),
    ``tb`` its formatted traceback, ``where`` a description of the function and datapoint, and
    ``fatal`` is true for contract violations (a generator returned, an unserialisable result),
    which are raised whatever the error policy says.
    """
    __slots__ = ("exc", "tb", "where", "fatal")

    def __init__(self, exc, tb, where, fatal=False):
        self.exc, self.tb, self.where, self.fatal = exc, tb, where, fatal

    @classmethod
    def from_exception(cls, exc, where, fatal=False):
        return cls(exc, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                   where, fatal)

    def to_exception(self):
        """The exception to raise in the consumer: the original type, with the worker's
        traceback as its cause and a note naming the function and datapoint."""
        exc = self.exc
        exc.__traceback__ = None       # the worker's frames are in the cause, not repeated
        exc.__cause__ = WorkerTraceback(self.tb)
        if hasattr(exc, "add_note"):
            note = f"(raised in {self.where})"
            if note not in getattr(exc, "__notes__", ()):
                exc.add_note(note)
        return exc


# What a map function may return (tensorpack's datapoints are lists or dicts; a bare array is
# common enough to accept too).
_DATAPOINT_TYPES = (list, tuple, dict, np.ndarray)


def func_name(func):
    func = getattr(func, "__wrapped__", func)
    return getattr(func, "__qualname__", None) or type(func).__name__


def _bad_result(func, index, result):
    if isinstance(result, (types.GeneratorType, types.AsyncGeneratorType)):
        what = "a generator"
    else:
        what = f"an object of type {type(result).__name__!r}"
    return TypeError(f"map function {func_name(func)} returned {what} for datapoint #{index}; "
                     f"it must return a datapoint (a list, tuple, dict or numpy array) or None to "
                     f"drop it")


def run_chunk(func, run, items, stop=None):
    """Apply ``func`` to each ``(seq, index, datapoint)`` of ``items``, datapoints ``index`` of
    source run ``run`` (the key of their random streams, see :func:`dataflow.rng.datapoint_rng`).

    Returns ``(results, busy_seconds)`` where ``results`` holds one ``(seq, kind, value)`` per item
    handled: ``(seq, OK, datapoint)``, ``(seq, DROP, None)`` for a ``None`` result, or
    ``(seq, ERR, WorkerError)``. An exception never escapes for a single datapoint. If ``stop`` (a
    ``threading.Event``) becomes set, the rest of the chunk is abandoned.
    """
    out = []
    t0 = time.perf_counter()
    cvthreads.apply_pending()       # the map function may have imported cv2 since the last chunk
    for seq, index, dp in items:
        set_datapoint_key((run, index))
        try:
            r = func(dp)
        except Exception as e:
            out.append((seq, ERR, WorkerError.from_exception(
                e, f"map function {func_name(func)} on datapoint #{index}")))
        else:
            if r is None:
                out.append((seq, DROP, None))
            elif isinstance(r, _DATAPOINT_TYPES):
                out.append((seq, OK, r))
            else:
                e = _bad_result(func, index, r)
                out.append((seq, ERR, WorkerError(e, f"TypeError: {e}\n",
                                                  f"datapoint #{index}", fatal=True)))
        if stop is not None and stop.is_set():
            break
    set_datapoint_key(None)
    return out, time.perf_counter() - t0


class Executor:
    """What :class:`ParallelMapData` needs from a pool of workers.

    * ``kind``: a short name, shown as the dataflow's ``.executor``.
    * ``submit(run, items)``: queue a chunk, a list of ``(seq, index, datapoint)`` from source
      run ``run``, for :func:`run_chunk`; never blocks for long (the mapper bounds how many
      datapoints are outstanding).
    * ``get(timeout)``: block until some results are back; return ``(results, busy_seconds)``
      as :func:`run_chunk` does. Every submitted item comes back exactly once, in any order and
      any grouping, unless ``get`` raises (a dead worker, say), or ``TimeoutError`` once a
      datapoint has been in a worker for ``timeout`` seconds (``None``: wait as long as it
      takes). Work held longer than ``dataflow.config.hang_timeout()`` is logged as hung.
    * ``close()``: stop the workers promptly (well under 100 ms) and release everything;
      idempotent, safe to call from a finalizer or at interpreter exit.
    """
    kind = None

    def submit(self, run, items):
        raise NotImplementedError

    def get(self):
        raise NotImplementedError

    def close(self):
        raise NotImplementedError


class InlineExecutor(Executor):
    """Runs each chunk at once, in the consuming thread: serial execution behind the same mapper
    (debug mode, where a debugger must be able to step into the map function, or an error
    policy without workers)."""
    kind = "serial"

    def __init__(self, make_func):
        self._func = make_func(0)
        self._results = collections.deque()

    def submit(self, run, items):
        self._results.append(run_chunk(self._func, run, items))

    def get(self, timeout=None):
        return self._results.popleft()

    def close(self):
        self._results.clear()


class _Pass:
    """The state that outlives one ``__iter__`` pass: what is in flight and, in non-strict mode,
    the position in the endless source."""

    def __init__(self):
        self.next_seq = 0          # sequence number of the next datapoint sent
        self.outstanding = {}      # seq -> index in its source run, for items not back yet
        self.held = {}             # ordered mode: seq -> (kind, value, index), waiting for turn
        self.ready = collections.deque()   # (seq, kind, value, index) to be handled in order
        self.expect = 0            # ordered mode: next seq to hand over
        self.source = None         # non-strict: the running source iterator
        self.index = 0             # non-strict: position in the current source run
        self.run_len = None        # non-strict, unknown length: datapoints in one source run
        self.per_item = None       # moving average of a worker's seconds per datapoint
        self.timed = 0             # batches of results that per_item has seen
        self.warm_up = 0           # batches to see before sizing chunks (fixed at the first, so
                                   # that workers added later do not restart the warm-up)
        self.item_bytes = 0        # moving average of the bytes of arrays in a result
        self.run = -1              # number of the current run of the source (keys random ops)


class ParallelMapData(ProxyDataFlow):
    """Base of every parallel map dataflow: ``map_func`` applied to ``ds`` by ``num_workers``
    workers of the executor that the subclass makes in :meth:`_make_executor`.

    Guarantees (for every executor):

    * ``strict=False`` (tensorpack's default): the source is repeated forever and each pass yields
      the results of ``len(ds)`` source datapoints, a reordering of
      ``RepeatedData(MapData(ds, map_func), -1)``; datapoints in flight carry over to the next pass.
    * ``strict=True``: each pass yields exactly what ``MapData(ds, map_func)`` yields, each
      datapoint once, then stops. A source without ``__len__`` works; so does a ``buffer_size``
      larger than the source.
    * ``ordered=True``: results come in source order (a slow datapoint holds back the later ones).
    * ``None`` from ``map_func`` drops the datapoint.
    * At most ``buffer_size`` datapoints are in workers or waiting to be yielded.
    * Errors: see ``on_error`` and ``max_errors`` in the subclasses' docstrings.
    """
    executor = None
    #: whether ``num_workers="auto"`` is accepted (the executor must add and retire workers)
    _autotune_ok = True

    def __init__(self, ds, num_workers, map_func, *, buffer_size=200, strict=False,
                 ordered=False, on_error="raise", max_errors=None, timeout=None):
        super().__init__(ds)
        if map_func is None or not callable(map_func):
            raise TypeError(f"map_func must be callable, got {map_func!r}")
        # "auto": start small and let an AutoTuner resize the pool while it runs.
        self._tuner = None
        if isinstance(num_workers, str) and num_workers == "auto" and self._autotune_ok:
            self._tuner = AutoTuner()
            num_workers = self._tuner.workers
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
            raise ValueError("the number of workers must be a positive int"
                             + (' or "auto"' if self._autotune_ok else "")
                             + f", got {num_workers!r}")
        if not isinstance(buffer_size, int) or isinstance(buffer_size, bool) or buffer_size < 1:
            raise ValueError(f"buffer_size must be a positive int, got {buffer_size!r}")
        if on_error not in ("raise", "skip", "replace"):
            raise ValueError(f"on_error must be 'raise', 'skip' or 'replace', got {on_error!r}")
        if max_errors is not None:
            if isinstance(max_errors, bool) or not isinstance(max_errors, (int, float)) or \
                    max_errors < 0 or (isinstance(max_errors, float) and max_errors > 1):
                raise ValueError("max_errors must be None, an int >= 0 (errors per pass) or a "
                                 f"float in [0, 1] (fraction of a pass), got {max_errors!r}")
        if timeout is not None and (isinstance(timeout, bool) or
                                    not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ValueError(f"timeout must be None or a positive number, got {timeout!r}")
        self.timeout = timeout
        self.num_workers = num_workers
        self.map_func = map_func
        self.buffer_size = buffer_size
        self.strict = bool(strict)
        self.ordered = bool(ordered)
        self.on_error = on_error
        self.max_errors = max_errors
        self.num_skipped = 0       # datapoints dropped by on_error="skip" since reset_state
        self.num_replaced = 0      # datapoints replaced by on_error="replace" since reset_state
        self._guard = DataFlowReentrantGuard()
        self._exec = None
        self._finalizer = None
        self._state = None
        self._pstats = ParallelStats()     # what dataflow.stats() reports for the workers

    # -- life cycle -------------------------------------------------------------------------
    def _make_executor(self):
        """Start and return the workers (an :class:`Executor`) of kind ``self.executor``."""
        raise NotImplementedError

    def _reset_source(self):
        self.ds.reset_state()

    def reset_state(self):
        """(Re)start: reset the source, start fresh workers, forget anything in flight."""
        self._stop()
        self._reset_source()
        self._state = _Pass()
        self.num_skipped = self.num_replaced = 0
        if self._tuner is not None:
            self.num_workers = self._tuner.restart()
        self._exec = self._make_executor()
        self._finalizer = weakref.finalize(self, self._exec.close)

    def close(self):
        """Stop the workers and release their resources, then close the source; idempotent.
        Also done on garbage collection and at interpreter exit. ``reset_state()`` starts
        again."""
        self._stop()
        super().close()

    def _stop(self):
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._exec = None
        self._state = None

    # -- iteration --------------------------------------------------------------------------
    def _source_len(self):
        try:
            return len(self.ds)
        except (NotImplementedError, TypeError):
            return None

    def __iter__(self):
        with self._guard:
            if self._exec is None:
                self.reset_state()
            if self.strict:
                yield from self._strict_pass()
            else:
                yield from self._endless_pass()

    def _warming_up(self):
        """Whether chunk sizes are still unknown. The first datapoints of a worker pay one-time
        costs (imports, caches, its first shared memory): until each of the first workers could
        have reported twice, datapoints go one at a time and the estimate is the fastest batch
        so far."""
        st = self._state
        return st.per_item is None or st.timed < st.warm_up

    def _chunk_size(self):
        st = self._state
        if self._warming_up():
            return 1
        by_time = int(_CHUNK_SECONDS / max(st.per_item, 1e-7))
        by_bytes = int(_CHUNK_BYTES // st.item_bytes) if st.item_bytes else _MAX_CHUNK
        return max(1, min(_MAX_CHUNK, by_time, by_bytes))

    def _send(self, source, index, room):
        """Send up to ``room`` datapoints from ``source`` in chunks, numbering them from ``index``
        on. Returns ``(next_index, exhausted)``."""
        st, ex = self._state, self._exec
        if ex is None:
            raise RuntimeError(CLOSED_WHILE_ITERATING)
        chunk = self._chunk_size()
        while room > 0:
            n = min(room, chunk)
            if n < chunk and len(st.outstanding) >= chunk * self.num_workers:
                # Workers have enough to do: wait for room for a whole chunk rather than
                # sending the scraps freed by the last few results.
                return index, False
            items = []
            for dp in source:
                items.append((st.next_seq + len(items), index, dp))
                index += 1
                if len(items) == n:
                    break
            if items:
                ex.submit(st.run, items)      # may raise (a datapoint that cannot be sent)
                st.next_seq += len(items)
                for seq, i, _ in items:
                    st.outstanding[seq] = i
            if len(items) < n:
                return index, True
            room -= n
        return index, False

    def _room(self):
        st = self._state
        if st is None:                 # close() while a pass was suspended
            raise RuntimeError(CLOSED_WHILE_ITERATING)
        room = self.buffer_size - len(st.outstanding) - len(st.held) - len(st.ready)
        if self._warming_up():
            # One datapoint per worker (and one spare each) until the first results tell how
            # big chunks should be; the buffer fills right after.
            room = min(room, 2 * self.num_workers - len(st.outstanding))
        return room

    def _receive(self, first_seq):
        """Wait for one batch of results and queue them for handling. Results of datapoints sent
        before ``first_seq`` (a strict pass that the consumer abandoned) are discarded."""
        st, ex = self._state, self._exec
        if ex is None:
            raise RuntimeError(CLOSED_WHILE_ITERATING)
        t0 = time.perf_counter()
        results, busy = ex.get(self.timeout)
        t1 = time.perf_counter()
        self._pstats.received(t1 - t0, len(results), busy,
                              len(st.outstanding) + len(st.held) + len(st.ready))
        if self._tuner is not None and self._tuner.observe(t1, t1 - t0, len(results), busy):
            self._autotune(t1)
        if results:
            per_item = busy / len(results)
            st.timed += 1
            if st.per_item is None:
                st.per_item, st.warm_up = per_item, 2 * self.num_workers
            elif st.timed <= st.warm_up:
                st.per_item = min(st.per_item, per_item)
            else:
                st.per_item = 0.8 * st.per_item + 0.2 * per_item
            kind, value = results[0][1], results[0][2]      # one sample per batch
            if kind == OK:
                st.item_bytes = 0.8 * st.item_bytes + 0.2 * _array_bytes(value) \
                    if st.item_bytes else _array_bytes(value)
        for seq, kind, value in results:
            st.outstanding.pop(seq)
            if seq < first_seq:
                continue
            if self.ordered:
                st.held[seq] = (kind, value)
            else:
                st.ready.append((kind, value))
        if self.ordered:
            while st.expect in st.held:
                st.ready.append(st.held.pop(st.expect))
                st.expect += 1

    def _autotune(self, now):
        """Apply the tuner's decision: one worker more or fewer, in the running pool. Executors
        that cannot resize (serial, Ray) keep their size."""
        ex = self._exec
        if not callable(getattr(ex, "add_worker", None)):
            return
        delta = self._tuner.decide(now, in_flight=len(self._state.outstanding))
        if delta > 0:
            ex.add_worker()
        elif delta < 0:
            ex.retire_worker()
        self.num_workers = ex.num_workers

    def _strict_pass(self):
        st = self._state
        first = st.next_seq
        st.held.clear()
        st.ready.clear()
        st.expect = first
        policy = _ErrorPolicy(self, self._source_len())
        source, index, exhausted = iter(self.ds), 0, False
        st.run += 1
        while True:
            while st.ready:
                kind, value = st.ready.popleft()
                if kind == OK and policy.simple:
                    yield value
                else:
                    yield from policy.handle(kind, value)
            if not exhausted:
                index, exhausted = self._send(source, index, self._room())
            # Outstanding seqs are in send order, so the last one tells whether any of this
            # pass is still out.
            if exhausted and not st.held and \
                    not (st.outstanding and next(reversed(st.outstanding)) >= first):
                break
            self._receive(first)
        policy.finish()

    def _fill_endless(self):
        """Non-strict mode: keep the buffer full from the source, restarting it when it ends."""
        st = self._state
        room = self._room()
        while room > 0:
            if st.source is None:
                st.source, st.index = iter(self.ds), 0
                st.run += 1
            before = st.index
            st.index, exhausted = self._send(st.source, st.index, room)
            if st.index == before and not exhausted:
                return                  # the workers have enough; wait for whole chunks
            room -= st.index - before
            if exhausted:
                if st.index == 0:
                    raise ValueError(f"the source of {type(self).__name__} yielded no datapoint "
                                     "in a whole pass, so it cannot be repeated")
                if st.run_len is None:
                    st.run_len = st.index
                st.source = None

    def _endless_pass(self):
        st = self._state
        target = self._source_len()
        if target is None:
            target = st.run_len        # known once the source has ended one run
        policy = _ErrorPolicy(self, target)
        handled = 0
        while target is None or handled < target:
            self._fill_endless()
            if target is None and st.run_len is not None:
                target = policy.total = st.run_len
                continue
            if not st.ready:
                self._receive(0)
            while st.ready and (target is None or handled < target):
                kind, value = st.ready.popleft()
                handled += 1
                if kind == OK and policy.simple:
                    yield value
                else:
                    yield from policy.handle(kind, value)
        policy.finish()


class _ErrorPolicy:
    """``on_error`` and ``max_errors`` applied to the results of one pass, in hand-over order."""

    def __init__(self, owner, total):
        self.owner = owner
        self.total = total            # datapoints in the pass, when known
        self.simple = owner.on_error != "replace"   # OK results need no bookkeeping
        self.seen = 0
        self.errors = 0
        self.pending = 0              # replacements owed until a good result exists
        self.last_good = None
        self.last_error = None

    def handle(self, kind, value):
        """Yield what the consumer gets for one result; raise when the policy says so."""
        self.seen += 1
        if kind == OK:
            self.last_good = value
            yield value
            while self.pending:
                self.pending -= 1
                yield copy.deepcopy(value)
        elif kind == ERR:
            yield from self._error(value)

    def _over_limit(self):
        limit = self.owner.max_errors
        if limit is None:
            return False
        if isinstance(limit, float):
            n = self.total if self.total is not None else self.seen
            return self.errors > limit * n
        return self.errors > limit

    def _error(self, err):
        owner = self.owner
        if err.fatal or owner.on_error == "raise":
            raise err.to_exception()
        self.errors += 1
        if self._over_limit():
            exc = err.to_exception()
            if hasattr(exc, "add_note"):
                exc.add_note(f"({self.errors} errors in this pass exceed "
                             f"max_errors={owner.max_errors!r})")
            raise exc
        self.last_error = err
        if owner.on_error == "skip":
            owner.num_skipped += 1
            logger.warning("skipped %s after %s: %s", err.where, type(err.exc).__name__, err.exc)
            return
        owner.num_replaced += 1
        logger.warning("replaced %s after %s: %s", err.where, type(err.exc).__name__, err.exc)
        if self.last_good is None:
            self.pending += 1
        else:
            yield copy.deepcopy(self.last_good)

    def finish(self):
        """End of pass: replacements still owed mean no map call ever succeeded."""
        if self.pending:
            exc = self.last_error.to_exception()
            if hasattr(exc, "add_note"):
                exc.add_note(f"(on_error='replace' found no successful datapoint to replace "
                             f"{self.pending} failed ones with)")
            raise exc
