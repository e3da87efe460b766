"""The parallel map: ordering, strictness, buffering and error policy, written once.

:class:`ParallelMapData` pulls datapoints from its source in the consuming thread, hands them in
chunks to an *executor* and yields the results. Everything a user can rely on about a parallel
dataflow (exactly-once per pass in strict mode, source order when ordered, what happens on an
error, the bound on buffered datapoints) is decided here, so threads, processes and any later
executor behave the same. An executor only runs chunks; its contract is
:class:`~.protocol.Executor`, and the worker side's loop is :func:`~.protocol.run_chunk`
(both in :mod:`.protocol`, re-exported here).
"""
import collections
import copy
import logging
import threading
import time
import weakref

import numpy as np

from .. import checkpoint as _ckpt
from .._helpers import (MAX_WORKERS, add_note, check_flag, check_int, check_positive_number,
                       dataflow_length, empty_pass_error, is_int, pass_progress)
from ..base import DataFlowReentrantGuard, ProxyDataFlow, random_stage
from ..stats import ParallelStats, tell_label, tell_parallel
from .autotune import AutoTuner
# The shared vocabulary; the names that used to be defined here stay importable from here.
from .protocol import (CLOSED_WHILE_ITERATING, DROP, ERR, OK,  # noqa: F401
                       RESET_WHILE_ITERATING, Executor, InlineExecutor, WorkerError,
                       WorkerTraceback, func_name, run_chunk, staged)

__all__ = ["ParallelMapData", "Executor", "run_chunk", "WorkerError", "WorkerTraceback",
           "OK", "DROP", "ERR"]

logger = logging.getLogger("dataflow")

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


class _Pass:
    """The state that outlives one ``__iter__`` pass: what is in flight, in non-strict mode the
    position in the endless source, and the estimates that size the chunks (seconds and bytes
    per datapoint, the warm-up)."""

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
        self.run_progress = 0      # non-strict: pass_progress of the source when its run began
        # checkpoint bookkeeping (see ParallelMapData._get_position)
        self.lo = 0                # the first seq of the pass (results of lower seqs are not its)
        self.skip_send = set()     # after a resume: seqs not to send again (handed over before)
        self.marks = collections.deque()   # (seq, run, index, source position) per chunk sent
        self.track = None          # True, or why the source cannot say where it is
        self.npass = 0             # non-strict: the pass being, or next to be, iterated
        self.handled = 0           # non-strict: results handed over in that pass
        self.in_pass = False
        self.floor = 0             # non-strict: results of lower seqs are discarded (a load)
        self.source_error = None   # what the source raised: raised once all it gave is out
        self.begun = 0             # strict: passes begun, to tell an iterator's from a newer one


def _exiting_in_a_daemon_thread():
    """Whether this is a daemon thread while the interpreter runs its exit hooks (which close
    every dataflow): the main thread is marked stopped, and no other thread that the exit
    waits for is alive (while one is, it may still wait for this thread, which must then end)."""
    main = threading.main_thread()
    return threading.current_thread().daemon and not main.is_alive() and \
        not any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not main)


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

    _shown_as = None     # the name errors give this map (a subclass the user never wrote)
    executor = None
    #: whether ``num_workers="auto"`` is accepted (the executor must add and retire workers)
    _autotune_ok = True
    #: a map of a user function: its datapoints' random streams are keyed (see base.random_stage)
    keys_random_streams = True
    _random_stage = 0

    def __init__(self, ds, num_workers, map_func, *, buffer_size=200, strict=False,
                 ordered=False, on_error="raise", max_errors=None, timeout=None):
        super().__init__(ds)
        self._random_stage = random_stage(ds)       # see rng.map_key
        if map_func is None or not callable(map_func):
            raise TypeError(f"map_func must be callable, got {map_func!r}")
        # "auto": start small and let an AutoTuner resize the pool while it runs.
        self._tuner = None
        if isinstance(num_workers, str) and num_workers == "auto" and self._autotune_ok:
            self._tuner = AutoTuner()
            num_workers = self._tuner.workers
        if not is_int(num_workers) or not 1 <= num_workers <= MAX_WORKERS:
            raise ValueError(f"the number of workers must be an int from 1 to {MAX_WORKERS}"
                             + (' or "auto"' if self._autotune_ok else "")
                             + f", got {num_workers!r}")
        num_workers = int(num_workers)
        buffer_size = check_int("buffer_size", buffer_size, 1)
        if on_error not in ("raise", "skip", "replace"):
            raise ValueError(f"on_error must be 'raise', 'skip' or 'replace', got {on_error!r}")
        if max_errors is not None:
            if isinstance(max_errors, bool) or not isinstance(max_errors, (int, float)) or \
                    max_errors < 0 or (isinstance(max_errors, float) and max_errors > 1):
                raise ValueError("max_errors must be None, an int >= 0 (errors per pass) or a "
                                 f"float in [0, 1] (fraction of a pass), got {max_errors!r}")
        self.timeout = check_positive_number("timeout", timeout, allow_none=True)
        self.num_workers = num_workers
        self.map_func = map_func
        self.buffer_size = buffer_size
        self.strict = check_flag("strict", strict)
        self.ordered = check_flag("ordered", ordered)
        self.on_error = on_error
        self.max_errors = max_errors
        self.num_skipped = 0       # datapoints dropped by on_error="skip" since reset_state
        self.num_replaced = 0      # datapoints replaced by on_error="replace" since reset_state
        self._guard = DataFlowReentrantGuard()
        self._exec = None
        self._finalizer = None
        self._state = None
        self._carry = None                 # after close(): (run, npass) the next pass goes on from
        self._closed_position = None       # after close(): the position state_dict() gives
        self._resume = None                # a position loaded by load_state_dict, not yet used
        self._policy = None                # the _ErrorPolicy of the pass being iterated
        self._pstats = ParallelStats()     # what dataflow.stats() reports for the workers
        tell_parallel(self, self)
        tell_label(self, map_func)

    # -- statistics (what this mapper reports to dataflow.stats) ------------------------------
    def stats_figures(self, wall):
        """The ``"parallel"`` entry of :func:`dataflow.stats` for this mapper."""
        return _parallel_figures(self, wall)

    def stats_reset(self):
        """Start the figures of :meth:`stats_figures` again from zero."""
        _reset_parallel(self)

    # -- life cycle -------------------------------------------------------------------------
    def _staged_func(self):
        """What the executor's workers run: ``map_func`` with this map's random stage (see
        :func:`dataflow.rng.map_key`)."""
        return staged(self.map_func, self._random_stage)

    def _make_executor(self):
        """Start and return the workers (an :class:`Executor`) of kind ``self.executor``."""
        raise NotImplementedError

    def _reset_source(self):
        self.ds.reset_state()

    # Whether the iteration after close() resets the source too: a map's source goes on where
    # it is (as serial MapData's); a runner's copies are made again (see copies.CopiesRunner)
    _restarts_source = False

    def reset_state(self):
        """(Re)start: reset the source, start fresh workers, forget anything in flight; the
        next pass is pass 0 again (as serial ``MapData``'s)."""
        self._carry = None
        self._start(reset_source=True)

    def _start(self, reset_source):
        """Start fresh workers and a new :class:`_Pass`. After ``close()`` (``reset_source``
        false: the iteration that follows a ``close()`` starts them), the source goes on where
        it is and the passes keep their numbers (the keys of random ops), as serial
        ``MapData``'s do: a ``with df:`` block per epoch draws each epoch's own numbers."""
        self._stop()
        self._closed_position = None
        if reset_source:
            self._reset_source()
        self._state = st = _Pass()
        if self._carry is not None:
            st.run, st.npass = self._carry
        self.num_skipped = self.num_replaced = 0
        self._worker_base = {}          # the figures of a new pool start at zero
        if self._tuner is not None:
            self.num_workers = self._tuner.restart()
        self._exec = self._make_executor()
        self._finalizer = weakref.finalize(self, self._exec.close)

    def close(self):
        """Stop the workers and release their resources, then close the source; idempotent.
        Also done on garbage collection and at interpreter exit. ``reset_state()`` starts
        again; so does the next iteration, which goes on with the next pass (an open pass is
        abandoned), as serial ``MapData`` does."""
        st = self._state
        if st is not None:
            # the numbers of the next pass: a strict pass is one run of the source; a non-strict
            # one reads on from a new run too (what was in flight is gone)
            self._carry = (st.run, st.npass + (1 if st.in_pass and not self.strict else 0))
            # and the position, as a state_dict() now would give it: an open pass can still be
            # resumed from a state taken after close(), as serial MapData's can
            try:
                self._closed_position = self._get_position()
            except Exception:           # a source that cannot say where it is: raised then
                self._closed_position = None
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
        return dataflow_length(self.ds)

    def __iter__(self):
        # The pass begins at iter(), not at the first next() (as MapData's, see
        # checkpoint.PassPosition): a pass left unfinished (its iterator dropped) is abandoned
        # now, so that a state taken before the first next() is that of the new pass.
        # A strict pass also begins its run of the source here, as MapData does, so that one
        # made and dropped unstarted (by JoinData, RandomMixData, ...) counts, and the runs
        # (the keys of random ops) stay those of serial MapData. Not while another iteration
        # holds the guard (that one would be disturbed, and this one is refused at next()),
        # nor to continue a loaded pass (at the first next(); one loaded between passes
        # begins here).
        st = self._state
        if self._resume is None and st is not None and st.in_pass:
            self._abandon()
        begun = None
        loaded_open = self._resume is not None and self._resume.get("open", True)
        if self.strict and not loaded_open and st is not None and self._exec is not None \
                and not self._guard.locked():
            begun = self._begin_strict()
        return self._passes(self._exec is not None, begun)

    def _passes(self, started, begun):
        """The pass; ``started``: the workers were running at ``iter()``, so if they are gone
        now, ``close()`` came before the first ``next()`` and the pass cannot begin (starting
        them again would leave workers running after the user's ``close()``). ``begun``: the
        strict pass as :meth:`__iter__` began it, or None."""
        with self._guard:
            if self._exec is None:
                if started:
                    raise RuntimeError(CLOSED_WHILE_ITERATING)
                # the first iteration, or one after close(): after close() the source and the
                # pass numbers go on (see _start)
                self._start(reset_source=self._carry is None or self._restarts_source)
            try:
                if self.strict:
                    st = self._state
                    if begun is None or begun[0] is not st or begun[1] != st.begun:
                        # reset_state(), or another iter() that began a pass, came in between
                        if st.in_pass and self._resume is None:
                            self._abandon()
                        begun = self._begin_strict()
                    yield from self._strict_pass(*begun)
                else:
                    yield from self._endless_pass()
            except RuntimeError as e:
                if str(e) == CLOSED_WHILE_ITERATING and _exiting_in_a_daemon_thread():
                    # closed by the interpreter's exit under a background thread's loop: that
                    # thread is stopped with the interpreter in a moment; a traceback printed
                    # at every exit would only alarm (it cannot be acted on)
                    threading.Event().wait()
                raise
            except BaseException as e:
                if not isinstance(e, (Exception, GeneratorExit)):
                    # KeyboardInterrupt (Ctrl-C) comes at any instruction: maybe between
                    # handing work to or from the workers and recording it. The bookkeeping can
                    # no longer be trusted (a loop run again waited for ever for lost results,
                    # or failed on results it never recorded): stop the workers as close()
                    # does; the next iteration starts them again, on the next pass.
                    self.close()
                raise

    def _check_current(self, st):
        """An iteration whose state ``reset_state()`` (or ``close()``) replaced cannot go on:
        its datapoints are not in the new workers (it would wait for them forever)."""
        if self._state is not st:
            raise RuntimeError(CLOSED_WHILE_ITERATING if self._state is None else
                               RESET_WHILE_ITERATING)

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
            if st.track is True:
                self._mark(index)
            items = []
            seq, skip = st.next_seq, st.skip_send
            try:
                for dp in source:
                    if skip and seq in skip:      # handed over before the resume: not again
                        skip.discard(seq)
                        seq += 1
                        index += 1
                        continue
                    items.append((seq, index, dp))
                    seq += 1
                    index += 1
                    if len(items) == n:
                        break
            except Exception as e:
                # The source failed: what it gave before goes to the workers as usual, and the
                # error is raised once their results are handed over (_raise_source_error),
                # as a serial map raises it after the datapoints before it.
                st.source_error = e
            if items:
                ex.submit(st.run, items)      # may raise (a datapoint that cannot be sent)
                for s, i, _ in items:
                    st.outstanding[s] = i
            st.next_seq = seq
            if len(items) < n or st.source_error is not None:
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
                # One batch raises the estimate at most 8-fold: a worker's slow first datapoint
                # (imports, caches) can still arrive after the warm-up when another worker
                # reported first, and taken whole it would shrink chunks to 1 for dozens of
                # batches. A real slowdown is still followed within a few batches.
                st.per_item = 0.8 * st.per_item + 0.2 * min(per_item, 8 * st.per_item)
            kind, value = results[0][1], results[0][2]      # one sample per batch
            if kind == OK:
                nbytes = self._result_bytes(value)
                st.item_bytes = 0.8 * st.item_bytes + 0.2 * nbytes if st.item_bytes else nbytes
        for seq, kind, value in results:
            st.outstanding.pop(seq)
            if seq < first_seq:
                continue
            if self.ordered:
                st.held[seq] = (seq, kind, value)
            else:
                st.ready.append((seq, kind, value))
        if self.ordered:
            while st.expect in st.held:
                st.ready.append(st.held.pop(st.expect))
                st.expect += 1

    def _result_bytes(self, value):
        """Bytes of the arrays in one result (a runner unwraps its results first)."""
        return _array_bytes(value)

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

    def _begin_strict(self):
        """Begin a strict pass (a run of the source); returns what :meth:`_strict_pass` goes
        on with."""
        st = self._state
        st.source_error = None         # one left by a pass that ended on another error
        first = st.next_seq
        st.held.clear()
        st.ready.clear()
        st.expect = first
        before = 0                     # results of this pass handed over before a resume
        policy = self._policy = _ErrorPolicy(
            self, st, self._source_len(), lambda owner: before + owner._handed_since(first))
        source, index = self._begin_run(first), 0
        if self._resume is not None:
            r, self._resume = self._resume, None
            st.run, index = r["run"] - 1, r["index"]
            before = index
            policy.restore(r)
        st.run += 1
        st.in_pass = True
        st.begun += 1
        return st, st.begun, first, policy, source, index

    def _strict_pass(self, st, number, first, policy, source, index):
        """The strict pass that :meth:`_begin_strict` began (``number``: which one, see
        :meth:`_passes`)."""
        exhausted = False
        while True:
            self._check_current(st)
            while st.ready:
                if self._state is not st:       # closed or reset while this pass was out
                    self._check_current(st)
                seq, kind, value = st.ready.popleft()     # handed over (see _watermark)
                if kind == OK and policy.simple:
                    yield value
                else:
                    yield from policy.handle(kind, value)
            # resumed after a yield: closed or reset meanwhile, the executor and state are new
            # ones, which must get nothing of this pass (it waited for ever for what it sent)
            self._check_current(st)
            if not exhausted:
                index, exhausted = self._send(source, index, self._room())
            # Outstanding seqs are in send order, so the last one tells whether any of this
            # pass is still out.
            if exhausted and not st.held and \
                    not (st.outstanding and next(reversed(st.outstanding)) >= first):
                break
            self._receive(first)
        self._raise_source_error(st)
        st.in_pass = False
        policy.finish()

    def _raise_source_error(self, st):
        """Raise what the source raised, now that the results of what it gave before are
        handed over."""
        e, st.source_error = st.source_error, None
        if e is not None:
            raise e

    def _fill_endless(self):
        """Non-strict mode: keep the buffer full from the source, restarting it when it ends."""
        st = self._state
        room = self._room()
        while room > 0:
            if st.source is None:
                st.source, st.index = iter(self.ds), 0
                st.run += 1
                st.run_progress = pass_progress(self.ds)
            before = st.index
            st.index, exhausted = self._send(st.source, st.index, room)
            if st.source_error is not None:
                return                  # nothing more is sent (see _endless_pass)
            if st.index == before and not exhausted:
                return                  # the workers have enough; wait for whole chunks
            # what was sent: after a resume, the index also passes over datapoints handed over
            # before it (skip_send), which take no room (counted as room, they could use it all
            # up, leaving the consumer waiting with nothing sent)
            room = self._room()
            if exhausted:
                if st.index == 0:
                    if pass_progress(self.ds) == st.run_progress:
                        raise empty_pass_error(type(self).__name__, self.ds)
                    st.source = None    # it keeps datapoints for a later run: start one
                    continue
                if st.run_len is None:
                    st.run_len = st.index
                st.source = None

    def _endless_pass(self):
        st = self._state
        st.source_error = None         # one left by a pass that ended on another error
        target = self._source_len()
        if target is None:
            target = st.run_len        # known once the source has ended one run
        r = self._resume
        if r is not None and target is not None and r.get("open", True) and \
                r["handled"] >= target:
            # loaded after the pass's last result: it ends here, having read nothing, and the
            # next pass resumes the source where the state says (as _abandon does)
            self._resume = dict(r, handled=0, open=False)
            self._resume["pass"] = r["pass"] + 1
            return
        policy = self._policy = _ErrorPolicy(self, st, target, lambda owner: st.handled)
        if self._resume is not None:
            # results still out from before the load (a live pipeline) are discarded
            st.floor = st.expect = st.next_seq
            st.ready.clear()
            st.held.clear()
            st.source = self._begin_run(st.next_seq)
            r, self._resume = self._resume, None
            st.npass, st.index, st.run = r["pass"], r["index"], r["run"]
            handled = r["handled"]
            policy.restore(r)
        else:
            if st.in_pass:             # the previous pass was abandoned
                st.npass += 1
            if st.track is None:
                st.track = self._trackable()
            handled = 0
        st.handled, st.in_pass = handled, True
        while target is None or handled < target:
            self._check_current(st)
            self._fill_endless()
            if target is None and st.run_len is not None:
                target = policy.total = st.run_len
                continue
            if not st.ready:
                if st.source_error is not None and not st.outstanding:
                    self._raise_source_error(st)
                self._receive(st.floor)
            while st.ready and (target is None or handled < target):
                if self._state is not st:       # closed or reset while this pass was out
                    self._check_current(st)
                seq, kind, value = st.ready.popleft()     # handed over (see _watermark)
                handled += 1
                st.handled = handled
                if kind == OK and policy.simple:
                    yield value
                else:
                    yield from policy.handle(kind, value)
        st.npass, st.handled, st.in_pass = st.npass + 1, 0, False
        policy.finish()

    # -- checkpoint -------------------------------------------------------------------------
    # The position is that of a map (dataflow.common.MapData writes the same keys): ``run`` and
    # ``index`` of the first source datapoint whose result was not handed over yet (the
    # watermark), ``src`` the source's position ``skip`` datapoints before it (at the start
    # of the chunk it was sent in, recorded when the chunk was sent), ``done`` the ranges of
    # later datapoints (relative to the watermark) already handed over, which an unordered
    # map has; ``pass`` and ``handled``: this dataflow's pass and results handed over in it.
    # Results that workers finished but the consumer did not take are not in it: a resume
    # computes them again. Nothing here asks a worker anything.
    def _begin_run(self, first):
        """The source iterator of a pass (after a resume: just before its watermark)."""
        st = self._state
        if st.track is None:
            st.track = self._trackable()
        st.lo = first
        st.marks.clear()
        r = self._resume
        if r is None:
            st.skip_send = set()
            if self.strict:
                self.ds._abandon()     # a new pass of ds (see DataFlow._abandon)
            return iter(self.ds)
        st.skip_send = {first + o for a, b in r["done"] for o in range(a, b)}
        return _ckpt.skipped(self.ds, r["skip"])

    def _trackable(self):
        get = getattr(self.ds, "_get_position", None)
        if get is None:
            return NotImplementedError(f"{type(self).__name__}: its source "
                                       f"({type(self.ds).__name__}) cannot say where it is")
        return _ckpt.rereadable(self.ds, self._shown_as or type(self).__name__)

    def _mark(self, index):
        """Record where the source is before the chunk that starts at ``index``."""
        st = self._state
        marks = st.marks
        lo = self._watermark()
        while len(marks) > 1 and marks[1][0] <= lo:
            marks.popleft()
        marks.append((st.next_seq, st.run, index, self.ds._get_position()))

    # What was handed over is not recorded per datapoint (a set of the seqs handed over out of
    # order cost the consumer 6% of its instructions on tiny datapoints): a seq of this pass
    # (from st.lo on) below next_seq was handed over unless it is still pending -- out in a
    # worker (outstanding), waiting for its turn (held) or to be handed over (ready: popping it
    # hands it over). Seqs in skip_send were handed over before a resume.
    def _watermark(self):
        """The first seq of this pass not handed over yet (cost: the results pending)."""
        st = self._state
        base, lo = st.lo, st.next_seq
        for s in st.outstanding:            # in send order: the first of this pass is the lowest
            if s >= base:
                lo = s
                break
        for s in st.held:
            if base <= s < lo:
                lo = s
        for s, _, _ in st.ready:
            if base <= s < lo:
                lo = s
        if lo == st.next_seq:
            while lo in st.skip_send:
                lo += 1
        return lo

    def _handed_since(self, first):
        """Results of seqs from ``first`` on handed over so far (asked only when an error is
        counted against a fraction of a pass of unknown length)."""
        lo = self._watermark()
        return lo - first + len(self._done_after(lo))

    def _done_after(self, lo):
        """The seqs above ``lo`` handed over already (an unordered map has them)."""
        st = self._state
        done = [s for s in st.skip_send if s > lo]
        if self.ordered:        # results are handed over in seq order: none above lo yet
            return done
        pending = set(st.outstanding)
        pending.update(st.held)
        pending.update(s for s, _, _ in st.ready)
        done.extend(s for s in range(lo + 1, st.next_seq) if s not in pending)
        return done

    def _get_position(self):
        if self._resume is not None:
            return self._resume
        if self._state is None and self._closed_position is not None:
            return self._closed_position
        position = self._position()
        if self.on_error != "raise":
            position["errors"] = self._error_counts()
        if not self.ordered:
            # a reader that reads this map again from a recorded position would not get the
            # same datapoints in the same order (checkpoint.rereadable refuses it)
            position[_ckpt.UNORDERED] = self._shown_as or type(self).__name__
        return position

    def _error_counts(self):
        """What the error policy has counted: ``skipped``/``replaced`` since ``reset_state``
        and, within the open pass, its ``errors``, ``seen`` and ``pending`` replacements (what
        ``max_errors`` is checked against), so that a resumed pass enforces it as an
        uninterrupted one would."""
        counts = {"skipped": self.num_skipped, "replaced": self.num_replaced}
        st, policy = self._state, self._policy
        if policy is not None and st is not None and st.in_pass:
            counts.update(policy.counts())
        return counts

    def _position(self):
        st = self._state
        if st is not None and st.track is not None and st.track is not True:
            raise st.track
        strict = self.strict
        if st is None or (strict and not st.in_pass) or not st.marks:
            # nothing sent in this pass: the source is where the next pass starts
            if st is None:
                # never started: pass 0 (after close(), _get_position gives what close() took)
                run, npass = 0, 0
            elif strict:
                run = npass = st.run + 1 if not st.in_pass else st.run
            else:
                run, npass = st.run + 1, st.npass
            if self._trackable() is not True:
                raise self._trackable()
            return {"pass": npass, "run": run, "index": 0, "skip": 0, "done": [],
                    "handled": 0 if st is None or strict else st.handled,
                    "open": False if st is None or strict else st.in_pass,
                    "src": self.ds._get_position()}
        lo = self._watermark()
        mark = st.marks[0]
        for m in st.marks:
            if m[0] > lo:
                break
            mark = m
        seq0, run, index0, src = mark
        skip = lo - seq0
        return {"pass": st.run if strict else st.npass, "run": run, "index": index0 + skip,
                "skip": skip, "done": _ckpt.ranges(s - lo for s in self._done_after(lo)),
                "handled": index0 + skip if strict else st.handled, "open": st.in_pass,
                "src": src}

    def _set_position(self, position):
        self._resume = position
        self.ds._set_position(position["src"])

    def _abandon(self):
        """A strict pass dropped unfinished: the next starts the next run of the source; a
        non-strict one: the next pass begins, with what is in flight carried over."""
        r = self._resume
        if r is not None:
            if r.get("open", True):
                if self.strict:
                    if r.get("skip"):
                        # the source on to the loaded pass's watermark, where the dropped pass
                        # had read it: a source that runs on across its passes
                        # (LocallyShuffleData) continues from there
                        _ckpt.close_iterator(_ckpt.skipped(self.ds, r["skip"]))
                    self.ds._abandon()
                    # the next pass begins where the source now is (not where it was loaded)
                    self._resume = dict(r, run=r["run"] + 1, index=0, skip=0, done=[],
                                        handled=0, open=False, src=self.ds._get_position())
                    self._resume["pass"] = self._resume["run"]
                else:
                    self._resume = dict(r, handled=0, open=False)
                    self._resume["pass"] = r["pass"] + 1
            return
        st = self._state
        if st is None or not st.in_pass:
            return
        st.in_pass = False
        if self.strict:
            self.ds._abandon()
        else:
            st.npass, st.handled = st.npass + 1, 0

    def _fingerprint_name(self):
        # an ordered strict map yields what MapData does, whatever the executor
        return "MapData" if self.strict and self.ordered else "ParallelMapData"

    def _fingerprint_params(self):
        if self.strict and self.ordered:
            return {}
        return {"strict": self.strict, "ordered": self.ordered}


class _ErrorPolicy:
    """``on_error`` and ``max_errors`` applied to the results of one pass, in hand-over order."""

    def __init__(self, owner, state, total, handed):
        # a proxy: the owner holds this policy, and a cycle would keep a dropped map (its
        # workers, sockets and shared memory) alive until the garbage collector ran
        self.owner = weakref.proxy(owner)
        self.state = state            # the owner's _Pass of this pass
        self.total = total            # datapoints in the pass, when known
        self.handed = handed          # owner -> results of the pass handed over so far
        self.simple = owner.on_error != "replace"   # OK results need no bookkeeping
        self.seen = 0
        self.errors = 0
        self.pending = 0              # replacements owed until a good result exists
        self.last_good = None
        self.last_error = None

    def counts(self):
        """The per-pass counts a position records (see ``ParallelMapData._error_counts``)."""
        return {"errors": self.errors, "seen": self.seen, "pending": self.pending}

    def restore(self, position):
        """Continue the counts of a loaded position (a pass resumed mid-way). A replacement
        owed before the first good result of the resumed pass copies that result: the last
        good result before the state is a datapoint, which a state never holds."""
        counts = position.get("errors")
        if not counts:
            return
        owner = self.owner
        owner.num_skipped = int(counts.get("skipped", 0))
        owner.num_replaced = int(counts.get("replaced", 0))
        if position.get("open", True):
            self.errors = int(counts.get("errors", 0))
            self.seen = int(counts.get("seen", 0))
            self.pending = int(counts.get("pending", 0))

    def handle(self, kind, value):
        """Yield what the consumer gets for one result; raise when the policy says so."""
        self.seen += 1
        if kind == OK:
            self.last_good = value
            yield value
            while self.pending:
                self.owner._check_current(self.state)    # closed or reset while it was out
                self.pending -= 1
                yield copy.deepcopy(value)
        elif kind == ERR:
            yield from self._error(value)

    def _over_limit(self):
        limit = self.owner.max_errors
        if limit is None:
            return False
        if isinstance(limit, float):
            # of the results handed over so far (``seen`` counts only those the policy saw:
            # with "skip" it sees errors alone)
            n = self.total if self.total is not None else self.handed(self.owner)
            return self.errors > limit * n
        return self.errors > limit

    def _error(self, err):
        owner = self.owner
        if err.fatal or owner.on_error == "raise":
            raise err.to_exception()
        self.errors += 1
        if self._over_limit():
            exc = err.to_exception()
            add_note(exc, f"({self.errors} errors in this pass exceed "
                          f"max_errors={owner.max_errors!r})")
            raise exc
        self.last_error = err
        if owner.on_error == "skip":
            owner.num_skipped += 1
            owner._pstats.skipped += 1
            logger.warning("skipped %s after %s: %s", err.where, type(err.exc).__name__, err.exc)
            return
        owner.num_replaced += 1
        owner._pstats.replaced += 1
        logger.warning("replaced %s after %s: %s", err.where, type(err.exc).__name__, err.exc)
        if self.last_good is None:
            self.pending += 1
        else:
            yield copy.deepcopy(self.last_good)

    def finish(self):
        """End of pass: replacements still owed mean no map call ever succeeded."""
        if self.pending:
            exc = self.last_error.to_exception()
            add_note(exc, f"(on_error='replace' found no successful datapoint to replace "
                          f"{self.pending} failed ones with)")
            raise exc


def _parallel_figures(m, wall):
    """The ``"parallel"`` entry of a stage run by mapper ``m``."""
    ps = getattr(m, "_pstats", None)
    ex = getattr(m, "_exec", None)
    out = {"executor": getattr(ex, "kind", None) or m.executor,
           "workers": getattr(ex, "num_workers", None) or m.num_workers,
           "buffer_size": m.buffer_size,
           "strict": m.strict, "ordered": m.ordered}
    if ps is not None:
        now = ps.snapshot()
        if ps.base is not None:
            now = tuple(x - b for x, b in zip(now, ps.base))
        wait_s, batches, results, busy_s, occ, skipped, replaced = now
        out.update({
            "results": results,
            "batches": batches,
            "wait_s": round(wait_s, 6),
            "wait_fraction": round(wait_s / wall, 4) if wall else None,
            "buffer_occupancy": round(occ / batches / m.buffer_size, 4) if batches else None,
            "buffer_max": ps.occupancy_max,
            "worker_busy_s": round(busy_s, 6),
            "errors_skipped": skipped,
            "errors_replaced": replaced,
        })
    workers = []
    figures = getattr(ex, "worker_stats", None)
    if callable(figures):
        base = getattr(m, "_worker_base", None) or {}
        now = time.monotonic()
        for w in figures():
            b_busy, b_t = base.get(w["key"], (0.0, None))
            start = w["started"] if b_t is None else max(w["started"], b_t)
            span = max(1e-9, (w["ended"] or now) - start)
            busy = w["busy_s"] - b_busy
            workers.append({"id": w["id"], "busy_s": round(busy, 6),
                            "busy_fraction": round(min(1.0, max(0.0, busy / span)), 4),
                            "state": w["state"]})
            if "shm_bytes" in w:
                workers[-1]["shm_bytes"] = w["shm_bytes"] - base.get(("shm", w["key"]), 0)
            if "pool_bytes" in w:
                workers[-1]["pool_bytes"] = w["pool_bytes"]
    out["worker_stats"] = workers
    live = [w for w in workers if w["state"] == "running"]
    out["busy_fraction"] = (round(sum(w["busy_fraction"] for w in live) / len(live), 4)
                            if live else None)
    out["restarts"] = getattr(ex, "restarts", 0)
    if any("shm_bytes" in w for w in workers) or getattr(ex, "shm_bytes", None) is not None:
        total = getattr(ex, "shm_bytes", None)
        if total is None:
            total = sum(w.get("shm_bytes", 0) for w in workers)
        else:
            total -= (getattr(m, "_worker_base", None) or {}).get("shm_total", 0)
        out["shm_bytes"] = total
    tuner = getattr(m, "_tuner", None)
    if tuner is not None:
        out["autotune"] = tuner.describe()
    return out


def _reset_parallel(m):
    ps = getattr(m, "_pstats", None)
    if ps is not None:
        ps.reset()
    base = {}
    ex = getattr(m, "_exec", None)
    figures = getattr(ex, "worker_stats", None)
    if callable(figures):
        now = time.monotonic()
        for w in figures():
            base[w["key"]] = (w["busy_s"], now)
            if "shm_bytes" in w:
                base[("shm", w["key"])] = w["shm_bytes"]
        if getattr(ex, "shm_bytes", None) is not None:
            base["shm_total"] = ex.shm_bytes
    m._worker_base = base
