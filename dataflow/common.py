"""Common dataflow transformations: map, batch, repeat, mix, join, shuffle, cache, inspect.

Names, signatures and semantics follow ``tensorpack.dataflow.common`` (0.11); the few deliberate
differences are bug fixes and are noted in the class docstrings.
"""
import inspect
import itertools
from types import GeneratorType
import logging
import sys
import threading
import time
import weakref
from collections import defaultdict, deque
from collections.abc import Mapping
from copy import copy

import numpy as np

from . import checkpoint as _ckpt
from . import rng as _rng
from .rng import get_rng  # noqa: F401 (tensorpack's module has it)
from ._helpers import (MAX_WORKERS, add_note, check_flag, check_int, component,
                       dataflow_length, empty_pass_error, func_name, is_int, pass_progress,
                       position_mid_pass, progress_bar, repeat_forever)
from .base import (DataFlow, DataFlowReentrantGuard, EndlessError, ProxyDataFlow, RNGDataFlow,
                   as_dataflows, mark_branches, random_stage)
from .collate import aggregate_batch, batch_numpy
from .raw import _guard_of, _require_rng
from .stats import print_stats as _print_stats, reset_stats as _reset_stats, stats_enabled
from .stats import tell_label as _tell_stats_label, tell_parallel as _tell_stats_parallel

__all__ = ["TestDataSpeed", "PrintData", "BatchData", "BatchDataByShape", "FixedSizeData",
           "MapData", "MapDataComponent", "RepeatedData", "RepeatedDataPoint",
           "RandomChooseData", "RandomMixData", "JoinData", "ConcatData", "SelectComponent",
           "LocallyShuffleData", "CacheData"]

logger = logging.getLogger(__name__)

_EMPTY = object()



class TestDataSpeed(ProxyDataFlow):
    """Measure how fast a dataflow produces datapoints.

    :meth:`start` takes ``warmup`` datapoints untimed, then times ``size`` datapoints (starting new
    passes over ``ds`` when one ends), shows progress (a tqdm bar when tqdm is installed,
    otherwise a line every ``print_interval`` seconds), prints the speed and returns it in
    datapoints per second. Iterating this dataflow runs the test first, then yields the
    datapoints of ``ds``.

    At the end it prints the statistics of the pipeline over the timed datapoints (the table of
    :func:`dataflow.print_stats`, which names the bottleneck stage); set ``show_stats = False``
    on the class or the instance to skip it.
    """

    __test__ = False  # not a pytest test class, despite its name

    #: seconds between progress lines when tqdm is not available
    print_interval = 2.0
    #: print the pipeline's statistics (dataflow.print_stats) after the test
    show_stats = True

    def __init__(self, ds, size=5000, warmup=0):
        """
        Args:
            ds (DataFlow): the dataflow to test.
            size (int): number of datapoints to time.
            warmup (int): number of datapoints to take before timing.
        """
        super().__init__(ds)
        self.test_size = check_int("TestDataSpeed: size", size, 1, whole_floats=True)
        self.warmup = check_int("TestDataSpeed: warmup", warmup, 0, whole_floats=True)
        self._reset_called = False

    def reset_state(self):
        self._reset_called = True
        super().reset_state()

    def __iter__(self):
        self.start()
        yield from self.ds

    def _endless(self):
        """The datapoints of ``ds``, pass after pass."""
        return repeat_forever(self.ds, "TestDataSpeed")

    def start(self):
        """Run the test; returns the speed in datapoints per second (a float)."""
        if not self._reset_called:
            self.ds.reset_state()
            self._reset_called = True
        itr = self._endless()
        try:
            for _ in range(self.warmup):
                next(itr)
            _reset_stats(self.ds)          # the statistics cover the timed datapoints
            # optional dependency: a progress bar when tqdm is installed
            pbar = progress_bar(total=self.test_size, leave=True, smoothing=0.2,
                                dynamic_ncols=True)
            if pbar is not None:
                with pbar:
                    t0 = time.perf_counter()
                    for _ in range(self.test_size):
                        next(itr)
                        pbar.update()
                    elapsed = time.perf_counter() - t0
            else:
                t0 = last = time.perf_counter()
                for i in range(self.test_size):
                    next(itr)
                    now = time.perf_counter()
                    if now - last >= self.print_interval:
                        last = now
                        print(f"TestDataSpeed: {i + 1}/{self.test_size} datapoints, "
                              f"{(i + 1) / (now - t0):.2f} datapoints/s", flush=True)
                elapsed = time.perf_counter() - t0
        finally:
            itr.close()
        speed = self.test_size / max(elapsed, 1e-9)
        print(f"TestDataSpeed: {self.test_size} datapoints in {elapsed:.3f}s, "
              f"{speed:.2f} datapoints/s", flush=True)
        if self.show_stats and stats_enabled():
            _print_stats(self.ds, wall=elapsed)
        return speed

    def start_test(self):
        """Alias of :meth:`start` (older tensorpack name)."""
        return self.start()


def _check_multiprocessing(who, flag):
    """``python_multiprocessing`` as a bool (numpy's included), else ``TypeError``: a string such
    as ``"yes"`` or ``"False"`` would be taken by its truth."""
    if isinstance(flag, (bool, np.bool_)):
        return bool(flag)
    raise TypeError(f"{who}: python_multiprocessing must be True or False, got {flag!r}")


def _check_workers(who, n):
    """``n`` if it is a valid ``num_parallel_workers`` (None, ``"auto"`` or an int from 0 to
    ``MAX_WORKERS``), else ``ValueError``."""
    if n is None or (n == "auto" if isinstance(n, str) else is_int(n) and 0 <= n <= MAX_WORKERS):
        return n
    raise ValueError(f'{who}: num_parallel_workers must be None, "auto" or an int >= 0 (at most '
                     f"{MAX_WORKERS}), got {n!r}")


class BatchData(ProxyDataFlow):
    """Stack ``batch_size`` consecutive datapoints into one.

    The batch has the same structure (list or dict) as the datapoints; component ``k`` of the batch
    is the list of the components ``k`` (``use_list=True``) or, by default, their numpy batch, see
    :meth:`aggregate_batch`. With ``remainder=False`` every batch has exactly ``batch_size``
    datapoints and a final incomplete batch is dropped; with ``remainder=True`` it is produced.

    Differences from tensorpack (bug fixes): Python bools batch to a ``bool`` array (tensorpack
    gives int32); components that cannot be stacked (inconsistent shapes) raise ``ValueError``
    naming the component and the shapes seen (tensorpack logs and opens an IPython shell);
    ``batch_size > len(ds)`` with ``remainder=False`` raises ``ValueError`` (tensorpack asserts);
    components of a type numpy cannot batch are kept as lists (tensorpack raises TypeError).
    """

    def __init__(self, ds, batch_size, remainder=False, use_list=False, *, per_batch_map=None,
                 num_parallel_workers=None, python_multiprocessing=False):
        """
        Args:
            ds (DataFlow): a dataflow of lists/tuples or dicts.
            batch_size (int): number of datapoints per batch.
            remainder (bool): also produce the last, smaller batch of each pass.
            use_list (bool): batch components into lists instead of numpy arrays.
            per_batch_map (batch -> batch | None, or a list of them): applied to every batch,
                in order, like :class:`MapData`'s ``func``; with ``num_parallel_workers`` it
                runs where the run-in-thread table says (see ``python_multiprocessing``), and
                batches keep their order.
        """
        super().__init__(ds)
        # (a whole float is taken, as tensorpack's int(batch_size) took it; None named here)
        self.batch_size = check_int("BatchData: batch_size", batch_size, 1, whole_floats=True)
        if not remainder:
            n = dataflow_length(ds)
            if n is not None and self.batch_size > n:
                raise ValueError(
                    f"BatchData: batch_size={self.batch_size} is larger than the dataflow "
                    f"({n} datapoints) and remainder=False, so no batch would ever be produced. "
                    "Use a smaller batch_size or remainder=True.")
        self.remainder = check_flag("BatchData: remainder", remainder)
        self.use_list = check_flag("BatchData: use_list", use_list)
        self._mapped = None
        _check_workers("BatchData", num_parallel_workers)
        python_multiprocessing = _check_multiprocessing("BatchData", python_multiprocessing)
        if per_batch_map is not None:
            self._mapped = MapData(_Batches(self), per_batch_map,
                                   num_parallel_workers=num_parallel_workers,
                                   python_multiprocessing=python_multiprocessing)
        self.executor = "serial" if self._mapped is None else self._mapped.executor
        _tell_stats_label(self, str(self.batch_size))
        if self._mapped is not None:
            _tell_stats_parallel(self, self._mapped)

    def reset_state(self):
        if self._mapped is not None:
            self._mapped.reset_state()
        else:
            self.ds.reset_state()

    def close(self):
        """Stop the workers of ``per_batch_map``, if any, and close the source."""
        if self._mapped is not None:
            self._mapped.close()
        else:
            super().close()

    # Between batches nothing is held: the position is the input's, and whether the last,
    # smaller batch of the pass (made after the input ended) was returned; with
    # per_batch_map, the position of that map.
    _tail = False
    _resume_tail = False
    _resuming = False

    def _get_position(self):
        if self._mapped is not None:
            return self._mapped._get_position()
        return {"tail": self._tail or self._resume_tail, "src": self.ds._get_position()}

    def _set_position(self, position):
        if self._mapped is not None:
            return self._mapped._set_position(position)
        self._resume_tail, self._resuming = bool(position["tail"]), True
        self.ds._set_position(position["src"])

    def _abandon(self):
        if self._mapped is not None:
            return self._mapped._abandon()
        self._tail = self._resume_tail = self._resuming = False
        self.ds._abandon()

    def _fingerprint_params(self):
        return {"batch_size": self.batch_size, "remainder": bool(self.remainder),
                "use_list": bool(self.use_list), "per_batch_map": self._mapped is not None}

    def __len__(self):
        ds_size = len(self.ds)
        div, rem = divmod(ds_size, self.batch_size)
        if rem == 0:
            return div
        return div + int(bool(self.remainder))

    def __iter__(self):
        if self._mapped is not None:
            return iter(self._mapped)
        return self._batches()

    def _batches(self):
        resuming, self._resuming = self._resuming, False
        if self._resume_tail:          # resumed after the last batch of a pass: it is over
            self._resume_tail = False
            return iter(())
        if not resuming:
            self.ds._abandon()         # a new pass of ds (see DataFlow._abandon)
        # the input's pass begins at iter() (see checkpoint.PassPosition)
        return self._batches_of(iter(self.ds))

    def _batches_of(self, source):
        self._tail = False
        holder = []
        for dp in source:
            holder.append(dp)
            if len(holder) == self.batch_size:
                yield BatchData.aggregate_batch(holder, self.use_list)
                holder = []
        if self.remainder and holder:
            self._tail = True
            yield BatchData.aggregate_batch(holder, self.use_list)
        self._tail = False

    # Collation lives in dataflow.collate; these stay for code that calls them on the class.
    _batch_numpy = staticmethod(batch_numpy)
    aggregate_batch = staticmethod(aggregate_batch)


class _Batches(DataFlow):
    """The batches of a BatchData before its ``per_batch_map``.

    It refers to its BatchData weakly: the BatchData holds it (through the map of
    ``per_batch_map``), and a cycle would keep a dropped BatchData, and the map's workers, alive
    until the garbage collector ran. A copy (pickle, ``copy``) refers to the copy of the
    BatchData, which holds it in turn."""

    def __init__(self, batch_data):
        self._batch_data = weakref.ref(batch_data)

    @property
    def batch_data(self):
        return self._batch_data()

    def __getstate__(self):
        return {"batch_data": self.batch_data}

    def __setstate__(self, state):
        self._batch_data = weakref.ref(state["batch_data"])

    def reset_state(self):
        self.batch_data.ds.reset_state()

    def close(self):
        self.batch_data.ds.close()

    def __len__(self):
        return BatchData.__len__(self.batch_data)

    def __iter__(self):
        return self.batch_data._batches()

    def _get_position(self):
        b = self.batch_data
        return {"tail": b._tail or b._resume_tail, "src": b.ds._get_position()}

    def _set_position(self, position):
        self.batch_data._resume_tail = bool(position["tail"])
        self.batch_data._resuming = True
        self.batch_data.ds._set_position(position["src"])

    def _abandon(self):
        self.batch_data._tail = self.batch_data._resume_tail = False
        self.batch_data.ds._abandon()


class BatchDataByShape(BatchData):
    """Batch together datapoints whose component ``idx`` has the same shape.

    Datapoints are held in one buffer per shape; a batch of ``batch_size`` is produced as soon as a
    buffer is full. Buffers persist across passes (they are cleared by ``reset_state``), so
    datapoints of rare shapes may wait long or never be produced. ``len()`` is that of
    :class:`BatchData` with ``remainder=False`` and is only an estimate. Not reentrant.
    """

    def __init__(self, ds, batch_size, idx):
        """
        Args:
            ds (DataFlow): a dataflow whose ``dp[idx]`` is an ``np.ndarray``.
            batch_size (int): batch size.
            idx (int or str): the component whose shape groups datapoints.
        """
        super().__init__(ds, batch_size, remainder=False)
        self.idx = idx
        self.holder = defaultdict(list)
        self._guard = None

    def reset_state(self):
        super().reset_state()
        self.holder = defaultdict(list)
        self._guard = DataFlowReentrantGuard()
        self._held_keys, self._step = defaultdict(list), 0

    # Position: the input's position now and, for every held datapoint (buffers persist
    # across passes), its step (datapoints taken since reset_state) and the input's position
    # before it: a resume reads exactly those again (dataflow.checkpoint.refill).
    _resume = None
    _step = 0
    _held_keys = None          # shape -> [(step, input position before it)], as holder

    def __iter__(self):
        with _guard_of(self):
            if self._held_keys is None:
                self._held_keys = defaultdict(list)
            if self._resume is not None:
                self._restore()
            track = _trackable(self.ds, type(self).__name__)
            it = iter(self.ds)
            while True:
                key = self.ds._get_position() if track is True else None
                dp = next(it, _EMPTY)
                if dp is _EMPTY:
                    return
                shape = np.shape(component(dp, self.idx, "BatchDataByShape"))
                holder, keys = self.holder[shape], self._held_keys[shape]
                holder.append(dp)
                keys.append((self._step, key))
                self._step += 1
                if len(holder) == self.batch_size:
                    batch = BatchData.aggregate_batch(holder)
                    del holder[:]
                    del keys[:]
                    yield batch

    def _pass_progress(self):
        # datapoints taken since reset_state: held for a later pass or batched
        return self._step + pass_progress(self.ds)

    def _get_position(self):
        if self._resume is not None:
            return self._resume
        held = [[step, key] for keys in (self._held_keys or {}).values() for step, key in keys]
        if any(key is None for _, key in held):
            raise _trackable(self.ds, type(self).__name__)
        return {"step": self._step, "held": sorted(held, key=lambda k: k[0]),
                "src": self.ds._get_position()}

    def _set_position(self, position):
        self._resume = position
        self.ds._set_position(position["src"])

    def _restore(self):
        r, self._resume = self._resume, None
        got = _ckpt.refill(self.ds, [tuple(k) for k in r["held"]], r["src"])
        self.holder, self._held_keys = defaultdict(list), defaultdict(list)
        for step, key in r["held"]:              # in arrival order, as they were held
            dp = got[step]
            shape = np.shape(dp[self.idx])
            self.holder[shape].append(dp)
            self._held_keys[shape].append((step, key))
        self._step = r["step"]

    def _abandon(self):
        # A loaded position not used yet: its held datapoints stay held (buffers persist
        # across passes), so read them back now; then the input moves on to its next pass.
        if self._resume is not None:
            self._restore()
        self.ds._abandon()

    def _fingerprint_params(self):
        return {"batch_size": self.batch_size, "idx": self.idx}


class FixedSizeData(ProxyDataFlow):
    """Every pass yields exactly ``size`` datapoints of ``ds``, starting new passes of ``ds`` as
    needed.

    With ``keep_state=True`` the next pass continues where the previous one stopped in ``ds``
    (``ds`` = 1..5, size 3: ``1 2 3; 4 5 1; 2 3 4``); with ``keep_state=False`` every pass starts a
    fresh pass of ``ds`` (``1 2 3; 1 2 3``). Not reentrant. A ``ds`` that produces no datapoint
    raises ``ValueError`` (tensorpack raises an opaque RuntimeError).
    """

    def __init__(self, ds, size, keep_state=True):
        super().__init__(ds)
        self._size = check_int("FixedSizeData: size", size, 0, whole_floats=True)
        if self._size > sys.maxsize:     # len() could not return it (OverflowError at len())
            raise ValueError(f"FixedSizeData: size must be at most {sys.maxsize}, got {size!r}")
        self.itr = None
        self._keep = keep_state
        self._guard = None

    def __len__(self):
        return self._size

    def reset_state(self):
        super().reset_state()
        self.itr = None
        self._guard = DataFlowReentrantGuard()

    def _next(self):
        if self.itr is None:
            self.itr = iter(self.ds)
        try:
            return next(self.itr)
        except StopIteration:
            pass
        while True:                     # new passes, while they make progress
            mark = pass_progress(self.ds)
            self.itr = iter(self.ds)
            try:
                return next(self.itr)
            except StopIteration:
                self.itr = None
            if pass_progress(self.ds) == mark:
                raise empty_pass_error("FixedSizeData", self.ds) from None

    _done = 0                  # datapoints returned in the current pass
    _resume = None

    def __iter__(self):
        with _guard_of(self):
            start, self._done = (self._resume or 0), 0
            if self._resume is not None:
                self._resume, self._done, self.itr = None, start, None
            elif not self._keep:
                self.ds._abandon()      # each pass starts a new pass of ds
            try:
                for k in range(start, self._size):
                    dp = self._next()
                    self._done = k + 1
                    yield dp
                self._done = 0
                if not self._keep:
                    self.ds._abandon()          # the next pass starts a new pass of ds
            finally:
                if not self._keep:
                    self.itr = None

    def _get_position(self):
        if self._resume is not None:
            return {"done": self._resume, "src": self.ds._get_position()}
        return {"done": self._done, "src": self.ds._get_position()}

    def _set_position(self, position):
        self._resume = int(position["done"])
        self.itr = None                 # an iterator of ds kept from before is stale now
        self.ds._set_position(position["src"])

    def _abandon(self):
        self._resume, self._done = None, 0
        if not self._keep:
            self.itr = None
            self.ds._abandon()

    def _fingerprint_params(self):
        return {"size": self._size, "keep_state": bool(self._keep)}


class MapData(ProxyDataFlow):
    """Apply ``func`` to every datapoint; a ``None`` result drops the datapoint.

    ``func`` is a callable or a list of callables (ops) applied in order, each taking and
    returning a datapoint; ``None`` from any of them drops the datapoint. Each datapoint is
    handed over as a shallow copy (``copy.copy``), so ``func`` may replace components
    (``dp[0] = ...``) without affecting the source. A ``func`` that returns a generator (a common
    mistake: ``yield`` instead of ``return``) raises ``TypeError``.

    Without ``num_parallel_workers`` it runs serially in the consuming thread, exactly as
    tensorpack's ``MapData`` (``len()`` is that of ``ds``). With ``num_parallel_workers=N`` the
    ops run in N workers placed by the run-in-thread table (:mod:`dataflow.parallel.policy`):
    threads when every op is native or ``python_multiprocessing`` is false, processes otherwise
    (the whole chain in each process). The output is then still ordered and exactly once per pass:
    identical to the serial output. ``.executor`` says where it runs ("serial", "thread" or
    "process"). ``on_error``/``max_errors`` are the error policy of
    :class:`~dataflow.MultiThreadMapData` (also without workers; counted in ``num_skipped``
    and ``num_replaced``); ``max_restarts`` that of
    :class:`~dataflow.MultiProcessMapData`.
    """

    keys_random_streams = True       # see base.random_stage
    _random_stage = 0

    def __init__(self, ds, func, *, num_parallel_workers=None, python_multiprocessing=False,
                 on_error="raise", max_errors=None, max_restarts=0):
        """
        Args:
            ds (DataFlow): input dataflow.
            func (datapoint -> datapoint | None, or a list of them): the mapping.
            num_parallel_workers (int | "auto" | None): run the map in this many workers;
                ``"auto"`` starts with one and adjusts the count while the pipeline runs,
                between 1 and the CPUs available (see :func:`dataflow.stats`).
            python_multiprocessing (bool): allow worker processes for Python ops.
            on_error, max_errors, max_restarts: see the class doc.
        """
        # The serial dataflows sit below ops/ and parallel/: MapData reaches up only when built.
        from .ops import Compose, fuse
        from .parallel.policy import choose_executor, describe_choice
        from .parallel.protocol import SERIAL
        super().__init__(ds)
        self._random_stage = random_stage(ds)       # see rng.map_key
        ops = list(func) if isinstance(func, (list, tuple)) else [func]
        # "auto" (autotuned workers) is placed like any parallel map
        placed = 1 if _check_workers("MapData", num_parallel_workers) == "auto" \
            else num_parallel_workers
        # validated here for every executor, the serial one included (which does not use them)
        python_multiprocessing = _check_multiprocessing("MapData", python_multiprocessing)
        check_int("max_restarts", max_restarts, 0)
        self.executor = choose_executor(ops, placed, python_multiprocessing)
        logger.debug("MapData: %s", describe_choice(ops, placed, python_multiprocessing))
        self.func = func if callable(func) else Compose(fuse(ops))
        self._parallel = None
        self._pass, self._next, self._open, self._resume = -1, 0, False, None
        self._cursor = None
        if self.executor != SERIAL or on_error != "raise":
            # Below parallel/ (see above): the parallel map is imported when one is needed.
            from .parallel.runners import parallel_map
            # Serially (an error policy without workers) nothing is read ahead, as without a
            # policy: a source whose state outlives its passes (LocallyShuffleData's buffer)
            # would otherwise be read further than the pipeline's consumer took it.
            self._parallel = parallel_map(
                ds, num_parallel_workers or 1, _ShallowCopyFirst(self.func), self.executor,
                strict=True, ordered=True, on_error=on_error, max_errors=max_errors,
                max_restarts=max_restarts,
                **({"buffer_size": 1} if self.executor == SERIAL else {}))
            _tell_stats_parallel(self, self._parallel)
        _tell_stats_label(self, self.func)

    def reset_state(self):
        if self._parallel is not None:
            self._parallel.reset_state()
        else:
            super().reset_state()
        self._pass, self._next, self._open = -1, 0, False

    @property
    def num_skipped(self):
        """Datapoints dropped by ``on_error="skip"`` since ``reset_state()`` (as
        :class:`~dataflow.MultiThreadMapData`'s); 0 when errors raise."""
        return 0 if self._parallel is None else self._parallel.num_skipped

    @property
    def num_replaced(self):
        """Datapoints replaced by ``on_error="replace"`` since ``reset_state()``."""
        return 0 if self._parallel is None else self._parallel.num_replaced

    def close(self):
        """Stop the workers, if any, and close the source; ``reset_state()`` starts again."""
        if self._parallel is not None:
            self._parallel.close()
        else:
            super().close()

    def __iter__(self):
        if self._parallel is not None:
            return iter(self._parallel)
        # the pass begins at iter(), not at the first next() (see checkpoint.PassPosition)
        start, skip = 0, 0
        if self._resume is not None:        # continue a pass (see _get_position)
            r, self._resume = self._resume, None
            self._pass, start, skip = r["run"] - 1, r["index"], r["skip"]
        else:
            self.ds._abandon()              # a new pass of ds (see DataFlow._abandon)
        self._pass = p = self._pass + 1
        self._next, self._open, self._cursor = start, True, None
        return self._one_pass(p, start, _skipped(self.ds, skip))

    def _one_pass(self, p, start, source):
        func, local, get_ident = self.func, _rng._local, _thread_ident
        copy_id = getattr(local, "copy", None)   # in a runner's copy: its number (OwnDataFlow)
        # The datapoint's random-stream key, as a cursor advanced in place (see
        # rng.set_datapoint_key): no tuple per datapoint. It is set before every call, since
        # another serial MapData in this thread (nested in self.ds) sets its own, and cleared
        # after it: outside the map call there is no datapoint's stream. The cursor is also the
        # position: cursor[1] + 1 inputs of this pass are taken (see _get_position), so nothing
        # else is stored per datapoint. The key goes into the running thread's slot
        # (rng.key_slot: a list store), fetched again whenever this generator runs in another
        # thread than before.
        self._cursor = cursor = _rng.map_key(p, start - 1, copy_id, self._random_stage)
        owner, slot = None, None
        for cursor[1], dp in enumerate(source, start):
            if get_ident() != owner:
                owner, slot = get_ident(), _rng.key_slot()
            slot[0] = cursor
            try:
                # copy.copy, with its most common case (a list datapoint) inlined
                ret = func(dp.copy() if dp.__class__ is list else copy(dp))
            except Exception as e:
                # name the datapoint, as the parallel maps do (their worker adds this note)
                add_note(e, f"(raised in map function {func_name(func)} on datapoint "
                            f"#{cursor[1]})")
                raise
            finally:
                slot[0] = None
            if ret is None:
                continue
            if ret.__class__ is GeneratorType:
                ret.close()
                raise TypeError(
                    f"{type(self).__name__}: the function {func_name(func)} returned a "
                    f"generator for datapoint {cursor[1]} of this pass. It must return a datapoint "
                    "(or None to drop it); did it use 'yield' instead of 'return'?")
            yield ret
        self._open = False

    # The position of a map, serial or parallel (dataflow.parallel.mapper writes the same):
    # ``run``/``index``: pass and index (the key of the random streams) of the first input
    # datapoint not yet handed over; ``src``: the input's position ``skip`` datapoints before
    # it; ``done``: ranges of later inputs, relative to ``index``, already handed over (only
    # an unordered parallel map has them); ``pass``/``handled``: the pass of this dataflow and
    # the results handed over in it.
    def _get_position(self):
        if self._parallel is not None:
            return self._parallel._get_position()
        if self._resume is not None:
            return self._resume
        if self._open:
            # the cursor of the running pass says how many inputs it took
            p, i = self._pass, self._cursor[1] + 1 if self._cursor else self._next
        else:
            p, i = self._pass + 1, 0
        return {"pass": p, "run": p, "index": i, "handled": i, "skip": 0, "done": [],
                "open": self._open, "src": self.ds._get_position()}

    def _abandon(self):
        if self._parallel is not None:
            return self._parallel._abandon()
        r, self._resume = self._resume, None
        if r is not None:
            self._pass = r["run"] - 1 + bool(r.get("open", True))
        self._open = False
        self.ds._abandon()

    def _set_position(self, position):
        if self._parallel is not None:
            return self._parallel._set_position(position)
        if position["done"]:
            raise ValueError("MapData: the state is of an unordered parallel map")
        self._resume = position
        self.ds._set_position(position["src"])


_skipped = _ckpt.skipped
_thread_ident = threading.get_ident


class _ShallowCopyFirst:
    """The map function of a parallel MapData: the same shallow-copy contract as serial."""

    def __init__(self, func):
        self.func = self.__wrapped__ = func

    def __call__(self, dp):
        return self.func(copy(dp))


class MapDataComponent(MapData):
    """Apply ``func`` to component ``index`` (an int, or a key for dict datapoints) of every
    datapoint; a ``None`` result drops the datapoint. The source datapoint is not modified: the
    result is a shallow copy (a tuple becomes a list) with the new component."""

    def __init__(self, ds, func, index=0):
        if not callable(func):
            raise TypeError(f"MapDataComponent: func must be callable, got {func!r}")
        self._index = index
        self._func = func
        super().__init__(ds, self._mapper)
        _tell_stats_label(self, func)

    def _fingerprint_params(self):
        return {"index": _json_key(self._index)}

    def _mapper(self, dp):
        r = self._func(component(dp, self._index, "MapDataComponent"))
        if r is None:
            return None
        if inspect.isgenerator(r):
            r.close()
            raise TypeError(f"MapDataComponent: the function {func_name(self._func)} returned "
                            f"a generator for component {self._index!r}; it must return a value "
                            "(or None to drop the datapoint).")
        dp = copy(dp)
        if isinstance(dp, tuple):
            dp = list(dp)
        dp[self._index] = r
        return dp


class RepeatedData(ProxyDataFlow):
    """Pass over ``ds`` ``num`` times (``dp1 .. dpn, dp1 .. dpn, ...``); ``num=-1`` repeats
    forever.

    ``len()`` is ``num * len(ds)``; for ``num=-1`` it raises ``NotImplementedError`` (as tensorpack,
    so code probing the length with ``except NotImplementedError`` keeps working). With ``num=-1``,
    a pass of ``ds`` that produces no datapoint raises ``ValueError`` instead of looping forever.
    """

    def __init__(self, ds, num):
        """
        Args:
            ds (DataFlow): input dataflow.
            num (int): number of passes; -1 for infinitely many.
        """
        if not (is_int(num) and num >= -1):
            raise ValueError(f"RepeatedData: num must be an int >= 0, or -1 (forever), got {num!r}")
        self.num = int(num)
        super().__init__(ds)

    def __len__(self):
        if self.num == -1:
            raise EndlessError("RepeatedData(num=-1) is infinite: len() is unavailable")
        return len(self.ds) * self.num

    _rep = 0                   # the pass of ds within this pass
    _resume = None
    _resume_mid_pass = False   # the loaded position of ds is inside a pass of it
    _who = "RepeatedData(num=-1)"   # in an empty pass's error (LocallyShuffleData: its own name)

    def __iter__(self):
        first, self._rep = (self._resume or 0), 0
        resumed, self._resume = self._resume is not None, None
        if not resumed:
            self.ds._abandon()      # a new pass of ds (see DataFlow._abandon)
        if self.num == -1:
            # a pass of ds resumed inside may have nothing left; one loaded before it began
            # is a whole pass, and must yield
            got = resumed and self._resume_mid_pass
            while True:
                mark = pass_progress(self.ds)
                for dp in self.ds:
                    got = True
                    yield dp
                if not got and pass_progress(self.ds) == mark:
                    raise empty_pass_error(self._who, self.ds)
                self._rep, got = self._rep + 1, False
        else:
            for k in range(first, self.num):
                self._rep = k
                yield from self.ds
            self._rep = 0

    def _get_position(self):
        rep = self._resume if self._resume is not None else self._rep
        return {"rep": rep, "src": self.ds._get_position()}

    def _set_position(self, position):
        self._resume = int(position["rep"])
        self._resume_mid_pass = position_mid_pass(position["src"])
        self.ds._set_position(position["src"])

    def _abandon(self):
        self._resume, self._rep = None, 0
        self.ds._abandon()

    def _fingerprint_params(self):
        return {"num": self.num}


class RepeatedDataPoint(ProxyDataFlow):
    """Yield every datapoint of ``ds`` ``num`` times in a row (``dp1, dp1, ..., dp2, dp2, ...``);
    the repeats are the same object."""

    def __init__(self, ds, num):
        self.num = check_int("RepeatedDataPoint: num", num, 1, whole_floats=True)
        super().__init__(ds)

    def __len__(self):
        return len(self.ds) * self.num

    # Position: the repeats given of the current datapoint, the input's position before it
    # (its key, to read it again on resume) and now.
    _rep = 0
    _key = None
    _resume = None

    def __iter__(self):
        r, self._resume = self._resume, None
        if r is None:
            self.ds._abandon()      # a new pass of ds (see DataFlow._abandon)
        elif 0 < r["rep"] < self.num:
            # resumed between two repeats: so is the position until the first next()
            self._rep, self._key = r["rep"], r["key"]
        return self._one_pass(r)

    def _one_pass(self, r):
        track = _trackable(self.ds, type(self).__name__)
        it = None
        if r is not None and 0 < r["rep"] < self.num:       # resumed between two repeats
            got, it = _ckpt.refill(self.ds, [(0, r["key"])], r["src"], keep_iterator=True)
            dp = got[0]
            self._key = r["key"]
            for j in range(r["rep"], self.num):
                self._rep = j + 1
                yield dp
        if it is None:
            it = iter(self.ds)
        while True:
            key = self.ds._get_position() if track is True else None
            dp = next(it, _EMPTY)
            if dp is _EMPTY:
                break
            self._key = key
            for j in range(self.num):
                self._rep = j + 1
                yield dp
        self._rep = 0

    def _get_position(self):
        if self._resume is not None:
            return self._resume
        rep = self._rep if self._rep < self.num else 0
        return {"rep": rep, "key": self._key if rep else None, "src": self.ds._get_position()}

    def _set_position(self, position):
        self._resume = position
        self.ds._set_position(position["src"])

    def _abandon(self):
        self._resume, self._rep = None, 0
        self.ds._abandon()

    def _fingerprint_params(self):
        return {"num": self.num}


class _MixPosition(_ckpt.PassPosition):
    """The position of a random mix of dataflows: the pass and datapoints returned in it (the
    choices are drawn from streams keyed by a base seed and the pass), and each input's."""

    _base = None

    def _base_seed(self):
        if self._base is None:
            self._base = int(_require_rng(self).randint(2**31))
        return self._base

    def _reset_mix(self):
        self._reset_position()
        if self._resume is None:
            self._base = None

    def _inputs(self):
        return [d[0] if isinstance(d, (tuple, list)) else d for d in self.df_lists]

    def _get_position(self):
        s = _ckpt.PassPosition._get_position(self)
        s.setdefault("base", _ckpt.base_seed(self))
        s.setdefault("srcs", [d._get_position() for d in self._inputs()])
        return s

    def _set_position(self, position):
        _ckpt.PassPosition._set_position(self, position)
        self._base = _ckpt.optional_int(position["base"])
        self._resume.update(base=self._base, srcs=position["srcs"])
        for d, p in zip(self._inputs(), position["srcs"]):
            d._set_position(p)

    def _abandon(self):
        _ckpt.PassPosition._abandon(self)
        for d in self._inputs():
            d._abandon()


_CHOICES = 1024     # RandomChooseData draws its choices in blocks of this many


class RandomChooseData(_MixPosition, RNGDataFlow):
    """For every datapoint, pick one of several dataflows at random and take its next datapoint;
    stop as soon as the picked dataflow is exhausted.

    ``df_lists`` is a list of dataflows (equal probabilities) or of ``(dataflow, probability)``
    pairs whose probabilities sum to 1.
    """

    def __init__(self, df_lists):
        super().__init__()
        if not isinstance(df_lists, (list, tuple)):
            raise TypeError(f"RandomChooseData: df_lists must be a list of dataflows or of "
                            f"(dataflow, probability) pairs, got {df_lists!r}")
        if not df_lists:
            raise ValueError("RandomChooseData: df_lists is empty")
        pairs_given = isinstance(df_lists[0], (tuple, list))
        for i, e in enumerate(df_lists):
            is_pair = isinstance(e, (tuple, list))
            if is_pair != pairs_given or (is_pair and len(e) != 2):
                what = (f"a {type(e).__name__} of {len(e)} items "
                        f"({', '.join(type(x).__name__ for x in e)})") if is_pair \
                    else f"a bare {type(e).__name__}"
                raise ValueError(
                    f"RandomChooseData: df_lists must hold only dataflows or only (dataflow, "
                    f"probability) pairs, as its first entry is "
                    f"{'a pair' if pairs_given else 'a dataflow'}; entry {i} is {what}")
        if pairs_given:
            pairs = list(zip(as_dataflows(d for d, _ in df_lists),
                             (float(p) for _, p in df_lists)))
            total = sum(p for _, p in pairs)
            if not np.isclose(total, 1.0) or any(p < 0 for _, p in pairs):
                raise ValueError(f"RandomChooseData: probabilities must be >= 0 and sum to 1, "
                                 f"got {[p for _, p in pairs]} (sum {total})")
            self.df_lists = pairs
        else:
            prob = 1.0 / len(df_lists)
            self.df_lists = [(d, prob) for d in as_dataflows(df_lists)]
        mark_branches([d for d, _ in self.df_lists])     # see base.mark_branches

    def reset_state(self):
        super().reset_state()
        self._reset_mix()
        for d, _ in self.df_lists:
            d.reset_state()

    def __iter__(self):
        if self._resume is None:
            for d in self._inputs():
                d._abandon()        # new passes (see DataFlow._abandon)
        p, start = self._begin_pass()
        return self._one_pass(p, start, [iter(d) for d, _ in self.df_lists])

    def _fingerprint_params(self):
        return {"probabilities": [float(q) for _, q in self.df_lists]}

    def _one_pass(self, p, t, itrs):
        # choice number t of pass p: block t // _CHOICES of a stream keyed by (base, p, block)
        base = self._base_seed()
        probs = np.array([q for _, q in self.df_lists], dtype="float64")
        probs /= probs.sum()
        block, choices = -1, None
        while True:
            if t // _CHOICES != block:
                block = t // _CHOICES
                choices = _ckpt.keyed_generator(base, p, block).choice(
                    len(itrs), size=_CHOICES, p=probs).tolist()
            k = choices[t % _CHOICES]
            try:
                dp = next(itrs[k])
            except StopIteration:
                for j, d in enumerate(self._inputs()):
                    if j != k:
                        d._abandon()          # dropped mid-pass (see DataFlow._abandon)
                self._end_pass()
                return
            t += 1
            self._pos = t
            yield dp


class RandomMixData(_MixPosition, RNGDataFlow):
    """Randomly interleave several dataflows, using their lengths: every pass yields all
    ``sum(len(df))`` datapoints, each dataflow's in its own order, at uniformly random positions.

    All dataflows must have a length; one that produces fewer datapoints than its length raises
    ``ValueError``.
    """

    def __init__(self, df_lists):
        super().__init__()
        self.df_lists = as_dataflows(df_lists)
        mark_branches(self.df_lists)
        self.sizes = [len(k) for k in self.df_lists]

    def reset_state(self):
        super().reset_state()
        self._reset_mix()
        for d in self.df_lists:
            d.reset_state()

    def __len__(self):
        return sum(self.sizes)

    def __iter__(self):
        if self._resume is None:
            for d in self.df_lists:
                d._abandon()        # new passes (see DataFlow._abandon)
        p, start = self._begin_pass()
        return self._one_pass(p, start, [iter(k) for k in self.df_lists])

    def _fingerprint_params(self):
        return {"sizes": list(self.sizes)}

    def _one_pass(self, p, start, itrs):
        # the interleaving of pass p is a permutation keyed by (base, p)
        sums = np.cumsum(self.sizes)
        idxs = _ckpt.keyed_permutation(self._base_seed(), p, len(self))
        which = np.searchsorted(sums, idxs, side="right").tolist()
        for t in range(start, len(which)):
            k = which[t]
            try:
                dp = next(itrs[k])
            except StopIteration:
                raise ValueError(f"RandomMixData: dataflow {k} produced fewer datapoints than "
                                 f"its len() = {self.sizes[k]}") from None
            self._pos = t + 1
            yield dp
        for d in self.df_lists:
            d._abandon()       # each is at its end, its StopIteration not asked for
        self._end_pass()


class ConcatData(DataFlow):
    """Yield the datapoints of several dataflows one after another."""

    def __init__(self, df_lists):
        self.df_lists = as_dataflows(df_lists)
        mark_branches(self.df_lists)

    def reset_state(self):
        for d in self.df_lists:
            d.reset_state()

    def __len__(self):
        return sum(len(x) for x in self.df_lists)

    _at = 0                    # the dataflow being read
    _resume = None

    def __iter__(self):
        if self._resume is None:
            for d in self.df_lists:
                d._abandon()        # new passes (see DataFlow._abandon)
        first, self._resume = (self._resume or 0), None
        for k in range(first, len(self.df_lists)):
            self._at = k
            yield from self.df_lists[k]
        self._at = 0

    def _get_position(self):
        at = self._resume if self._resume is not None else self._at
        return {"at": at, "srcs": [d._get_position() for d in self.df_lists]}

    def _set_position(self, position):
        self._resume = int(position["at"])
        for d, p in zip(self.df_lists, position["srcs"]):
            d._set_position(p)

    def _abandon(self):
        at = self._resume if self._resume is not None else self._at
        self._resume, self._at = None, 0
        self.df_lists[at]._abandon()


class JoinData(DataFlow):
    """Zip several dataflows and join their datapoints: lists are concatenated
    (``[c1, c2] + [c3] -> [c1, c2, c3]``), dicts are merged (later keys win).

    The dataflows should have the same length; as in tensorpack, a mismatch only logs a warning
    (naming the lengths) and the iteration stops when any dataflow is exhausted, ``len()`` being the
    minimum. Joining a list dataflow with a dict dataflow raises ``TypeError``. ``reset_state``
    resets each distinct dataflow once, in list order.
    """

    def __init__(self, df_lists):
        self.df_lists = as_dataflows(df_lists)
        if not df_lists:            # it would yield [] forever
            raise ValueError("JoinData: df_lists must hold at least one dataflow")
        mark_branches(self.df_lists)
        lens = [dataflow_length(d) for d in df_lists]
        if None not in lens and len(set(lens)) > 1:
            logger.warning("JoinData: the dataflows to join have different lengths %s; "
                           "the joined dataflow stops at the shortest.", lens)

    def reset_state(self):
        seen = set()
        for d in self.df_lists:
            if id(d) not in seen:
                seen.add(id(d))
                d.reset_state()

    def __len__(self):
        return min(len(k) for k in self.df_lists)

    def _get_position(self):
        return {"srcs": [d._get_position() for d in self.df_lists]}

    def _set_position(self, position):
        self._resuming = True
        for d, p in zip(self.df_lists, position["srcs"]):
            d._set_position(p)

    def _abandon(self):
        self._resuming = False
        for d in self.df_lists:
            d._abandon()

    _resuming = False

    def __iter__(self):
        resuming, self._resuming = self._resuming, False
        if not resuming:
            for d in self.df_lists:
                d._abandon()        # new passes (see DataFlow._abandon)
        itrs = [iter(k) for k in self.df_lists]
        while True:
            try:
                all_dps = []
                for itr in itrs:
                    all_dps.append(next(itr))
            except StopIteration:
                # the others' passes are dropped unfinished: say so (see DataFlow._abandon)
                for k, d in enumerate(self.df_lists):
                    if k != len(all_dps):
                        d._abandon()
                return
            if all(isinstance(x, (list, tuple)) for x in all_dps):
                yield list(itertools.chain.from_iterable(all_dps))
            elif all(isinstance(x, Mapping) for x in all_dps):
                dp = {}
                for x in all_dps:
                    dp.update(x)
                yield dp
            else:
                raise TypeError("JoinData: cannot join datapoints of types "
                                f"{[type(x).__name__ for x in all_dps]}; they must be all "
                                "lists/tuples or all dicts.")


class SelectComponent(MapData):
    """Select / reorder components: ``[dp[i] for i in idxs]`` (a list, also for dict datapoints,
    where ``idxs`` are keys)."""

    def __init__(self, ds, idxs):
        if isinstance(idxs, (str, bytes)) or not hasattr(idxs, "__iter__"):
            raise TypeError(f"SelectComponent: idxs must be a list of component indices (or "
                            f"keys), got {idxs!r}")
        self.idxs = list(idxs)
        super().__init__(ds, self._select)

    def _select(self, dp):
        try:
            return [dp[i] for i in self.idxs]
        except (IndexError, KeyError, TypeError):
            return [component(dp, i, "SelectComponent") for i in self.idxs]

    def _fingerprint_params(self):
        return {"idxs": [_json_key(i) for i in self.idxs]}


def _json_key(key):
    """A component index or key as a state's fingerprint holds it (JSON)."""
    return key if isinstance(key, (int, str)) and not isinstance(key, bool) else repr(key)


class LocallyShuffleData(ProxyDataFlow, RNGDataFlow):
    """Shuffle through a buffer, for sources too large to shuffle completely.

    Datapoints of ``ds`` (repeated forever internally) enter a FIFO buffer of ``buffer_size``, each
    ``num_reuse`` times; once the buffer is full, every insertion first pops the oldest one,
    which is yielded. The buffer is shuffled after every ``shuffle_interval`` datapoints taken
    from ``ds`` (default ``buffer_size // 3``), by a permutation that is a pure function of a
    seed drawn once from ``self.rng`` and of the number of datapoints taken, so that
    ``state_dict()`` stores no random state. Datapoints of one pass of ``ds`` mix with those of
    the next.

    As in tensorpack, the iterator never ends (``len()``, ``len(ds) * num_reuse``, is the size of
    an "epoch"), the buffer and position persist across iterations until ``reset_state``, and the
    dataflow is not reentrant.
    """

    def __init__(self, ds, buffer_size, num_reuse=1, shuffle_interval=None, nr_reuse=None):
        """
        Args:
            ds (DataFlow): input dataflow.
            buffer_size (int): size of the buffer.
            num_reuse (int): times every datapoint is put in the buffer.
            shuffle_interval (int): shuffle the buffer after this many datapoints of ``ds``.
            nr_reuse: old name of ``num_reuse``.
        """
        if nr_reuse is not None:
            num_reuse = nr_reuse
        ProxyDataFlow.__init__(self, ds)
        buffer_size = check_int("LocallyShuffleData: buffer_size", buffer_size, 1)
        self.q = deque(maxlen=buffer_size)
        if shuffle_interval is None:
            self.shuffle_interval = max(1, buffer_size // 3)
        else:
            self.shuffle_interval = check_int("LocallyShuffleData: shuffle_interval",
                                              shuffle_interval, 1)
        self.num_reuse = check_int("LocallyShuffleData: num_reuse", num_reuse, 1)
        self._inf_ds = RepeatedData(ds, -1)
        self._inf_ds._who = "LocallyShuffleData"
        self._inf_iter = None
        self._iter_cnt = 0
        self._guard = None
        self._keys = deque(maxlen=buffer_size)     # the step of each buffered datapoint
        self._src_at, self._refs = {}, defaultdict(int)
        self._reuse, self._track, self._current = self.num_reuse, None, None

    def reset_state(self):
        self._guard = DataFlowReentrantGuard()
        ProxyDataFlow.reset_state(self)
        RNGDataFlow.reset_state(self)
        self._iter_cnt = 0
        self.q.clear()
        self._keys = deque(maxlen=self.q.maxlen)
        self._src_at, self._refs = {}, defaultdict(int)
        self._reuse, self._track = self.num_reuse, None
        if self._resume is None:
            self._base = None
        self._inf_iter = iter(self._inf_ds)

    _base = None               # seed of the buffer shuffles, drawn once from self.rng
    _resume = None

    def __len__(self):
        n = dataflow_length(self.ds)
        if n is None:
            raise EndlessError("LocallyShuffleData: its input's length is unknown, and it reads "
                               "its input forever, so a pass never ends")
        return n * self.num_reuse

    def _shuffle_keyed(self, step):
        """Shuffle the buffer (and its keys alike) by a permutation that is a pure function
        of the base seed and the step, so that no random state needs saving."""
        perm = _ckpt.keyed_generator(self._base, step).permutation(len(self.q)).tolist()
        items, keys = list(self.q), list(self._keys)
        self.q.clear()
        self.q.extend([items[k] for k in perm])
        self._keys.clear()
        self._keys.extend([keys[k] for k in perm])

    def __iter__(self):
        with _guard_of(self):
            if self._base is None:
                self._base = int(_require_rng(self).randint(2**31))
            if self._resume is not None:
                self._restore()
            if self._inf_iter is None:
                self._inf_iter = iter(self._inf_ds)
            q, keys, src_at, refs = self.q, self._keys, self._src_at, self._refs
            full, num_reuse, interval = q.maxlen, self.num_reuse, self.shuffle_interval
            if self._track is None:
                self._track = _trackable(self._inf_ds, type(self).__name__)
            position = self._inf_ds._get_position if self._track is True else _no_position
            inf = self._inf_iter
            while True:
                reuse = self._reuse
                if reuse < num_reuse:            # a resumed datapoint, not yet all in
                    dp, step = self._current, self._iter_cnt - 1
                else:
                    at = position()              # where ds is: this datapoint's key
                    dp = next(inf)
                    step = self._iter_cnt
                    self._iter_cnt = step + 1
                    src_at[step] = at
                    if (step + 1) % interval == 0:
                        self._shuffle_keyed(step)
                    self._current, reuse = dp, 0
                while reuse < num_reuse:
                    # pop, append, then yield: an iteration closed at the yield loses nothing
                    reuse += 1
                    self._reuse = reuse
                    if len(q) == full:
                        out, gone = q.popleft(), keys.popleft()
                        q.append(dp)
                        keys.append(step)
                        if num_reuse == 1:
                            del src_at[gone]
                        else:                    # a step is in the buffer up to num_reuse times
                            refs[step] += 1
                            refs[gone] -= 1
                            if not refs[gone]:
                                del refs[gone]
                                del src_at[gone]
                        yield out
                    else:
                        q.append(dp)
                        keys.append(step)
                        if num_reuse > 1:
                            refs[step] += 1

    # Position: the step (datapoints taken from ds since reset_state), the steps of the
    # buffered datapoints in buffer order and, once per step, the position of ds it was read
    # at; a resume reads exactly those datapoints again (dataflow.checkpoint.refill).
    def _get_position(self):
        if self._resume is not None:
            return self._resume
        if self._track is not None and self._track is not True:
            raise self._track
        keys = self._keys
        return {"base": _ckpt.base_seed(self), "step": self._iter_cnt, "reuse": self._reuse,
                "buffer": list(keys),
                "keys": [[k, self._src_at[k]] for k in sorted(set(keys))],
                "src": self._inf_ds._get_position()}

    def _set_position(self, position):
        self._resume = position
        self._base = _ckpt.optional_int(position["base"])
        self._inf_iter = None           # an iterator of ds kept from before is stale now
        self._inf_ds._set_position(position["src"])

    def _abandon(self):
        pass                       # its input runs on across its passes (and resets)

    def _restore(self):
        r, self._resume = self._resume, None
        got, it = _ckpt.refill(self._inf_ds, [tuple(k) for k in r["keys"]], r["src"],
                               keep_iterator=True)
        self.q.clear()
        self.q.extend(got[k] for k in r["buffer"])
        self._keys = deque(r["buffer"], maxlen=self.q.maxlen)
        self._src_at = {k: p for k, p in r["keys"]}
        self._refs = defaultdict(int)
        for k in r["buffer"]:
            self._refs[k] += 1
        self._iter_cnt, self._reuse = r["step"], r["reuse"]
        self._current = got.get(self._iter_cnt - 1)
        self._inf_iter = it            # None: iter() of the source, set at r["src"]

    def _fingerprint_params(self):
        return {"buffer_size": self.q.maxlen, "num_reuse": self.num_reuse,
                "shuffle_interval": self.shuffle_interval}


def _no_position():
    return None


def _trackable(df, reader):
    """``True`` if ``reader`` can read datapoints of ``df`` again from recorded positions,
    otherwise the ``NotImplementedError`` to raise in ``state_dict()`` (see
    :func:`dataflow.checkpoint.rereadable`)."""
    return _ckpt.rereadable(df, reader)


class CacheData(ProxyDataFlow):
    """Cache the first complete pass of ``ds`` in memory and produce later passes from the cache
    (shuffled at every pass when ``shuffle=True``; the first pass is in ``ds``'s order).

    A first pass that is stopped early does not leave a partial cache: the next pass reads ``ds``
    again (tensorpack would serve the partial cache). Concurrent iteration raises
    ``RuntimeError``, as in tensorpack, whether the pass fills the cache or reads it.
    ``reset_state`` clears the cache.
    """

    def __init__(self, ds, shuffle=False):
        self.shuffle = check_flag("CacheData: shuffle", shuffle)
        super().__init__(ds)
        self.buffer = []
        self._complete = False
        self.rng = None
        self._guard = None

    def reset_state(self):
        super().reset_state()
        self._guard = DataFlowReentrantGuard()
        if self.shuffle:
            self.rng = _rng.get_rng(self)
        self.buffer = []
        self._complete = False
        self._pass, self._pos, self._filling = 0, 0, False
        if self._resume is None:
            self._base = None

    # Position: whether the cache is complete, the input's position when the cache started to
    # fill (a resume reads the cached datapoints again from there), this dataflow's pass and
    # the datapoints returned in it; passes from the cache are shuffled by a permutation keyed
    # by (base seed, pass).
    _pass = 0
    _pos = 0
    _start = None              # ds's position when the filling pass began
    _filling = False
    _resume = None
    _base = None

    def __iter__(self):
        r, self._resume = self._resume, None
        if r is not None:
            # The loaded pass is under way from iter() on (as _begin_filling says for a new
            # one), not from the first next(): dropped before that, it still counts, as it does
            # in an uninterrupted run (see _abandon).
            self._pass, self._start, self._filling, self._pos = r["pass"], r["start"], False, 0
            if r["filled"]:
                self._refill_complete(r["src"])
                self._pos = r["pos"]
                return self._serve(r["pos"])
            if r["pos"]:
                it = self._refilled_part(r["pos"])
                self._filling, self._pos = True, r["pos"]
                return self._fill(it, r["pos"])
            return self._fill(self._begin_filling(), 0)
        if self._filling or (self._complete and self._pos):
            self._pass += 1            # the previous pass was abandoned
        if self._complete:
            return self._serve(0)
        self.ds._abandon()             # a new filling pass reads a new pass of ds
        return self._fill(self._begin_filling(), 0)

    def _begin_filling(self):
        """The input's iterator for a filling pass; its position is recorded first (at
        ``iter()``, so that a position taken before the first datapoint has it)."""
        trackable = _trackable(self.ds, type(self).__name__) is True
        self._start = self.ds._get_position() if trackable else None
        self._filling, self._pos = True, 0
        return iter(self.ds)

    def _serve(self, start):
        if self.shuffle:
            if self.rng is None:
                raise RuntimeError("CacheData: call reset_state() before iterating")
            order = _ckpt.keyed_permutation(_ckpt.base_seed(self), self._pass,
                                            len(self.buffer)).tolist()
        else:
            order = range(len(self.buffer))
        buf = self.buffer
        with _guard_of(self):
            self._pos = start
            for k in range(start, len(buf)):
                self._pos = k + 1
                yield buf[order[k]]
            self._pass, self._pos = self._pass + 1, 0

    def _fill(self, it, start):
        with _guard_of(self):
            filling = self._partial if start else []
            self._filling, self._pos = True, start
            for dp in it:
                filling.append(dp)
                self._pos = len(filling)
                yield dp
            self.buffer, self._complete, self._filling = filling, True, False
            self._pass, self._pos = self._pass + 1, 0

    def _refilled_part(self, n):
        """The input's iterator, after reading again the first ``n`` datapoints of the filling
        pass (kept in ``self._partial``)."""
        self.ds._set_position(self._start)
        it = iter(self.ds)
        self._partial = [dp for _, dp in zip(range(n), it)]
        return it

    def _refill_complete(self, src):
        self.ds._set_position(self._start)
        self.buffer, self._complete = list(iter(self.ds)), True
        self.ds._set_position(src)

    def _get_position(self):
        if self._resume is not None:
            return self._resume
        if self._filling or self._complete:
            if self._start is None:
                raise NotImplementedError(f"CacheData: its input ({type(self.ds).__name__}) "
                                          "cannot say where it is")
        return {"filled": self._complete, "start": self._start, "pass": self._pass,
                "pos": self._pos if (self._filling or self._complete) else 0,
                "base": _ckpt.base_seed(self) if self.shuffle else None,
                "src": self.ds._get_position()}

    def _set_position(self, position):
        self._resume = position
        if position.get("base") is not None:
            self._base = int(position["base"])
        self.ds._set_position(position["src"])

    def _abandon(self):
        r = self._resume
        if r is not None:                  # a loaded position's pass is dropped unfinished
            if r["pos"]:
                self._resume = dict(r, pos=0)
                self._resume["pass"] = r["pass"] + 1
                if not r["filled"]:        # the filling pass: the next one reads ds again
                    self.ds._abandon()
            return
        if self._filling:
            self._filling, self._pos = False, 0
            self._pass += 1
            self.ds._abandon()
        elif self._complete and self._pos:
            self._pass, self._pos = self._pass + 1, 0

    def _fingerprint_params(self):
        return {"shuffle": bool(self.shuffle)}


class PrintData(ProxyDataFlow):
    """Pass datapoints through unchanged, printing a structural summary (type, dtype, shape, value
    range; nested lists/dicts up to ``max_depth`` levels and ``max_list`` items) of the first
    ``num`` datapoints after each ``reset_state``, as tensorpack: a header line is logged and the
    summaries are printed to stdout."""

    def __init__(self, ds, num=1, name=None, max_depth=3, max_list=3):
        """
        Args:
            ds (DataFlow): input dataflow.
            num (int): number of datapoints to print.
            name (str, optional): label for the output.
            max_depth (int): depth of nested lists/dicts to describe.
            max_list (int): number of items of a list/dict to describe.
        """
        super().__init__(ds)
        self.num = num
        self.name = name
        self.cnt = 0
        self.max_depth = max_depth
        self.max_list = max_list

    def _describe(self, el, pos, depth):
        ident = " " * (depth * 2)
        head = f"{ident}{pos}: {type(el).__name__}"
        lines = []
        if isinstance(el, (bool, int, float, np.generic)):
            head += f" with value {el}"
        elif isinstance(el, np.ndarray):
            head += f":{el.dtype} of shape {el.shape}"
            if el.size:
                try:
                    head += f" in range [{el.min()}, {el.max()}]"
                except (TypeError, ValueError):
                    pass
        elif isinstance(el, (list, tuple, Mapping)):
            head += f" of len {len(el)}"
            items = list(el.items()) if isinstance(el, Mapping) else list(enumerate(el))
            if depth < self.max_depth:
                for i, (k, sub) in enumerate(items):
                    if i >= self.max_list:
                        lines.append(" " * ((depth + 1) * 2) + "...")
                        break
                    lines.append(self._describe(sub, k, depth + 1))
            elif items:
                lines.append(" " * ((depth + 1) * 2) + "...")
        elif isinstance(el, (str, bytes)):
            head += f" of len {len(el)}"
        return "\n".join([head] + lines)

    def _get_msg(self, dp):
        msg = [f"datapoint {self.cnt}/{self.num} with {len(dp)} components consists of"]
        items = dp.items() if isinstance(dp, Mapping) else enumerate(dp)
        for key, value in items:
            msg.append(self._describe(value, key, 1))
        return "\n".join(msg)

    def __iter__(self):
        for dp in self.ds:
            if self.cnt == 0 and self.num > 0:
                label = f" ({self.name})" if self.name is not None else ""
                logger.info("Contents of DataFlow%s:", label)
            if self.cnt < self.num:
                print(self._get_msg(dp), flush=True)
                self.cnt += 1
            yield dp

    def reset_state(self):
        super().reset_state()
        self.cnt = 0
