"""The parallel dataflows that run their work in threads or processes, tensorpack's names:
:class:`MultiThreadMapData`, :class:`MultiProcessMapData`, the runners that run copies of a
dataflow (:class:`MultiThreadRunner`, :class:`MultiProcessRunner`) and
:class:`MultiProcessMapAndBatchData`.

Their rules are :class:`~.mapper.ParallelMapData`'s; each starts its executor through the
registry (:func:`~.executors.make_executor`), or makes its threads itself.
"""
import copy
import itertools
import logging

import numpy as np

from .. import checkpoint as _ckpt
from .. import config
from ..base import EndlessError, check_dataflow
from .._helpers import (add_note, available_cpus, check_int, dataflow_length, is_int,
                       position_mid_pass, repeat_forever)
from ..collate import aggregate_batch
from .copies import Constant, CopiesRunner, OwnDataFlow, _Tickets
from .executors import make_executor
from .mapper import ParallelMapData
from .policy import choose_executor, describe_choice
from .process_executor import ProcessExecutor
from .protocol import PROCESS, SERIAL, THREAD
from .start import _checked_start_method
from .thread_executor import ThreadExecutor

__all__ = ["parallel_map", "MultiThreadMapData", "MultiThreadRunner", "MultiProcessMapData",
           "MultiProcessMapDataZMQ", "MultiProcessRunner", "MultiProcessRunnerZMQ",
           "MultiProcessMapAndBatchData", "MultiProcessMapAndBatchDataZMQ",
           "PrefetchData", "PrefetchDataZMQ", "MultiProcessPrefetchData",
           "MultiThreadPrefetchData"]

logger = logging.getLogger("dataflow")


class MultiThreadMapData(ParallelMapData):
    """Apply ``map_func`` to the datapoints of ``ds`` in ``num_thread`` threads.

    Threads suit functions that release the GIL. For pure-Python functions use
    :class:`~dataflow.MultiProcessMapData`.

    Args:
        ds: the source dataflow; it is read in the consuming thread.
        num_thread: number of worker threads (default: the CPUs available to the process), or
            ``"auto"``: start with one and let :class:`~dataflow.parallel.autotune.AutoTuner`
            add or retire threads while the pipeline runs (see :func:`dataflow.stats`).
        map_func: datapoint -> datapoint, or ``None`` to drop it.
        buffer_size: at most this many datapoints are in workers or waiting to be yielded.
        strict: each pass yields exactly the datapoints of one pass of ``ds``, each once. When
            false (tensorpack's default) the source is repeated forever and each pass yields
            the results of ``len(ds)`` source datapoints (fewer when ``map_func`` drops some).
        ordered: yield results in source order.
        on_error: when ``map_func`` raises: ``"raise"`` re-raises the original exception in the
            consumer (the worker's traceback is its ``__cause__``); ``"skip"`` drops the datapoint
            and logs a warning (counted in ``num_skipped``); ``"replace"`` yields a copy of a recent
            good result instead, so a pass keeps its length (counted in ``num_replaced``).
        max_errors: with skip/replace, raise once a pass has more errors than this (an int), or
            than this fraction of the pass (a float; of the datapoints seen so far when the length
            of the source is unknown).
        timeout: raise ``TimeoutError`` in the consumer once a datapoint has been in a worker
            for this many seconds (default ``None``: wait as long as it takes; work held longer
            than ``dataflow.config.hang_timeout()`` is logged with the worker's stack).
    """
    executor = THREAD

    def __init__(self, ds, num_thread=None, map_func=None, *, buffer_size=200, strict=False,
                 ordered=False, on_error="raise", max_errors=None, timeout=None):
        super().__init__(ds, available_cpus() if num_thread is None else num_thread, map_func,
                         buffer_size=buffer_size, strict=strict, ordered=ordered,
                         on_error=on_error, max_errors=max_errors, timeout=timeout)
        self.num_thread = self.num_workers
        if config.debug_mode():
            self.executor = SERIAL

    def _make_executor(self):
        return make_executor(self.executor, self.num_workers, Constant(self._staged_func()))



def parallel_map(ds, num_workers, map_func, executor, *, max_restarts=0, **options):
    """The parallel dataflow that runs ``map_func`` over ``ds`` on an executor of kind
    ``executor``, chosen once by the caller (``MapData`` and ``BatchData`` ask the run-in-thread
    table, :func:`~.policy.choose_executor`). ``options`` are :class:`~.mapper.ParallelMapData`'s;
    ``max_restarts`` is checked here for every kind."""
    return _PlacedMapData(ds, num_workers, map_func, executor, max_restarts=max_restarts,
                          **options)


class _PlacedMapData(ParallelMapData):
    """A parallel map on the executor kind it is given (see :func:`parallel_map`)."""

    _shown_as = "MapData(..., num_parallel_workers=N)"

    def __init__(self, ds, num_workers, map_func, executor, *, max_restarts=0, **options):
        super().__init__(ds, num_workers, map_func, **options)
        self.executor = executor
        self.max_restarts = check_int("max_restarts", max_restarts, 0)

    def _make_executor(self):
        return make_executor(self.executor, self.num_workers, Constant(self._staged_func()),
                             start_method=None, max_restarts=self.max_restarts)


class MultiThreadRunner(_ckpt.CopiesPosition, ParallelMapData):
    """Run ``num_thread`` copies of the dataflow returned by ``get_df()``, one per thread, and
    yield their datapoints in arrival order, at most ``num_prefetch`` ahead of the consumer.

    As in tensorpack, each ``__iter__`` pass yields ``len(get_df())`` datapoints when that length
    is known, and never ends otherwise. Errors in a copy reach the consumer with their original
    type. ``state_dict()`` records where each copy is (see
    :class:`dataflow.checkpoint.CopiesPosition`); a state loads into a runner with the same
    ``num_thread``. ``close()`` (and ``reset_state()``, which makes new copies) closes the
    copies, and so stops whatever workers they started.
    """
    executor = THREAD
    _autotune_ok = False       # one copy of the dataflow per thread: a fixed count
    _copies_name = "num_thread"

    _restarts_source = True        # its copies are made again after close() (see mapper)

    def __init__(self, get_df, num_prefetch, num_thread):
        if not callable(get_df):
            raise TypeError(f"get_df must be a callable returning a DataFlow, got {get_df!r}")
        self.get_df = get_df
        self.num_prefetch = check_int("num_prefetch", num_prefetch, 1)    # not "buffer_size"
        self.num_thread = num_thread
        self._model = None         # one dataflow of get_df(), for len() and the fingerprint
        self._copies = []          # the running copies: close() closes them
        super().__init__(_Tickets(None), num_thread, get_df, buffer_size=num_prefetch)

    def _reset_source(self):
        self._dfs = [check_dataflow(self.get_df(), "MultiThreadRunner: get_df()")
                     for _ in range(self.num_workers)]
        self._copies = list(self._dfs)
        for df in self._dfs:
            df.reset_state()
        self.ds = _Tickets(dataflow_length(self._dfs[0]))

    def _stop(self):
        # The copies run in this process: the workers that they started (a parallel map in
        # get_df()'s pipeline) stop with the runner's threads, not when the copies are collected.
        super()._stop()
        copies, self._copies = self._copies, []
        for df in copies:
            close = getattr(df, "close", None)
            if callable(close):
                close()

    def _make_executor(self):
        entries = self._copy_entries() or [None] * self.num_workers
        for k, df in enumerate(self._dfs):
            if entries[k] is None:
                # a fresh copy's random state was drawn here, in the order of this reset:
                # record it, so that a resume does not depend on that order
                self._records[k][0] = _ckpt.copy_mark(df)
        funcs = [OwnDataFlow(df, copy=k, resume=entries[k]) for k, df in enumerate(self._dfs)]
        self._dfs = None
        return ThreadExecutor(self.num_workers, funcs.__getitem__)

    def _model_df(self):
        if self._model is None:
            self._model = self.get_df()
        return self._model

    def __len__(self):
        if self._state is None:     # before reset_state(): what its tickets will say
            return len(_Tickets(dataflow_length(self._model_df())))
        return len(self.ds)

    def _result_bytes(self, value):
        return super()._result_bytes(value[3])

    def _fingerprint_inputs(self):
        return [self._model_df()]

    def __iter__(self):
        self._resuming()          # see checkpoint.CopiesPosition
        return self._replaying(self._tracked(ParallelMapData.__iter__(self)))


class MultiProcessMapData(ParallelMapData):
    """Apply ``map_func`` to the datapoints of ``ds`` in ``num_proc`` worker processes.

    Same arguments and guarantees as :class:`~dataflow.MultiThreadMapData` (strict, ordered,
    on_error, max_errors, timeout), plus:

    * ``start_method``: ``None`` picks :func:`default_start_method`;
    * ``max_restarts``: how many dead workers may be replaced (their datapoints are sent to the
      new worker; strict mode still yields each once) before :class:`WorkerCrashedError` is
      raised. With 0 (the default) the first death raises;
    * ``num_proc="auto"``: start with one worker and let
      :class:`~dataflow.parallel.autotune.AutoTuner` add or retire workers while the pipeline
      runs, between 1 and the CPUs available (see :func:`dataflow.stats`).

    The source is read in the consuming process; datapoints go to the workers and results come
    back with their arrays in shared memory, handed to you without a copy. Inside ``map_func``,
    :func:`dataflow.shared_empty` allocates an output array directly in shared memory.
    ``map_func`` may be a lambda or closure: it is shipped with cloudpickle.
    """
    executor = PROCESS

    def __init__(self, ds, num_proc=None, map_func=None, *, buffer_size=200, strict=False,
                 ordered=False, on_error="raise", max_errors=None, start_method=None,
                 max_restarts=0, timeout=None):
        super().__init__(ds, available_cpus() if num_proc is None else num_proc, map_func,
                         buffer_size=buffer_size, strict=strict, ordered=ordered,
                         on_error=on_error, max_errors=max_errors, timeout=timeout)
        self.num_proc = self.num_workers
        self.start_method = _checked_start_method(start_method)
        self.max_restarts = check_int("max_restarts", max_restarts, 0)
        # The run-in-thread table: a map of native ops needs no processes.
        self.executor = choose_executor(map_func, self.num_workers, True)
        logger.debug("%s: %s", type(self).__name__,
                     describe_choice(map_func, self.num_workers, True))

    def _make_executor(self):
        return make_executor(self.executor, self.num_workers, Constant(self._staged_func()),
                             start_method=self.start_method, max_restarts=self.max_restarts)


MultiProcessMapDataZMQ = MultiProcessMapData


class _MapComponentToArray:
    """The worker function of MultiProcessMapDataComponentSharedArray: ``map_func`` on one
    component, whose result must be an array of the declared shape and dtype (or None)."""

    def __init__(self, map_func, index, shape, dtype):
        self.map_func, self.index, self.shape, self.dtype = map_func, index, shape, dtype

    def __call__(self, dp):
        out = self.map_func(dp[self.index])
        if out is None:
            return None
        if not isinstance(out, np.ndarray) or out.dtype != self.dtype or \
                out.size != int(np.prod(self.shape)):
            got = (f"an array of shape {out.shape} and dtype {out.dtype}"
                   if isinstance(out, np.ndarray) else f"a {type(out).__name__}")
            raise ValueError(f"MultiProcessMapDataComponentSharedArray: map_func returned {got}; "
                             f"it must return an array of output_shape={self.shape} and "
                             f"output_dtype={np.dtype(self.dtype).name} (or None)")
        dp = copy.copy(dp)
        dp[self.index] = out.reshape(self.shape)
        return dp


class MultiProcessMapDataComponentSharedArray(MultiProcessMapData):
    """tensorpack's ``MultiProcessMapDataComponentSharedArray(ds, nr_proc, map_func,
    output_shape, output_dtype, index=0)``: component ``index`` of each datapoint replaced by
    ``map_func(component)`` in ``nr_proc`` worker processes, in source order; ``None`` drops the
    datapoint. ``map_func`` must return a numpy array of ``output_dtype`` with as many elements
    as ``output_shape`` (it is reshaped to it); anything else raises ``ValueError`` in the
    consumer. Results come back through shared memory, as from every
    :class:`MultiProcessMapData`; each pass yields ``len(ds)`` results (tensorpack's iteration
    never ended)."""

    def __init__(self, ds, nr_proc, map_func, output_shape, output_dtype, index=0):
        who = "MultiProcessMapDataComponentSharedArray"
        if not callable(map_func):
            raise TypeError(f"{who}: map_func must be callable, got {map_func!r}")
        if isinstance(output_shape, (str, bytes)) or not hasattr(output_shape, "__iter__"):
            raise ValueError(f"{who}: output_shape must be a tuple of ints, got {output_shape!r}")
        if not is_int(index):
            raise TypeError(f"{who}: index must be an int (a component of list datapoints), got "
                            f"{index!r}")
        self.nr_proc = nr_proc
        self.output_shape = tuple(check_int(f"{who}: output_shape[{i}]", v, 0, whole_floats=True)
                                  for i, v in enumerate(output_shape))
        self.output_dtype = np.dtype(output_dtype).type
        self.index = index
        super().__init__(ds, nr_proc, _MapComponentToArray(map_func, index, self.output_shape,
                                                           self.output_dtype), ordered=True)


class MultiProcessRunner(CopiesRunner):
    """Run ``num_proc`` copies of ``ds``, one per process, and yield their datapoints in arrival
    order, at most ``num_prefetch`` ahead of the consumer (tensorpack's ``MultiProcessRunner``).

    Each copy is reset in its process (each draws its own random stream) and repeated forever;
    each ``__iter__`` pass yields ``len(ds)`` datapoints when that is known, and never ends
    otherwise. ``state_dict()`` records where each copy is (see
    :class:`dataflow.checkpoint.CopiesPosition`); a state loads into a runner with the same
    ``num_proc``.
    """
    executor = PROCESS

    def __init__(self, ds, num_prefetch, num_proc, *, start_method=None, max_restarts=0,
                 timeout=None):
        self.num_proc = num_proc
        self.start_method = _checked_start_method(start_method)
        self.max_restarts = check_int("max_restarts", max_restarts, 0)
        super().__init__(ds, num_proc, num_prefetch, timeout=timeout)

    def _make_executor(self):
        return ProcessExecutor(self.num_workers, self._own_copies(), self.start_method,
                               self.max_restarts)


class MultiProcessRunnerZMQ(MultiProcessRunner):
    """tensorpack's ``MultiProcessRunnerZMQ(ds, num_proc=1, hwm=50)``: a
    :class:`MultiProcessRunner` with ``hwm`` datapoints of prefetch."""

    def __init__(self, ds, num_proc=1, hwm=50, *, start_method=None, max_restarts=0,
                 timeout=None):
        # named here: the base would call it buffer_size, which this class has not
        check_int("hwm", hwm, 1)
        super().__init__(ds, hwm, num_proc, start_method=start_method,
                         max_restarts=max_restarts, timeout=timeout)
        self.hwm = hwm


class _Groups:
    """An endless source of ``(pass, group)``: lists of ``batch_size`` consecutive datapoints of
    ``ds``, each with the number of the pass of ``ds`` it ended in (counted from the start of
    the iteration). ``pass_groups[p]`` is the number of groups of pass ``p`` once it has ended:
    what :class:`_EmptyPasses` needs to tell a whole pass whose datapoints were all dropped."""

    def __init__(self, ds, batch_size, count_passes):
        self.ds, self.batch_size = ds, batch_size
        self.count_passes = count_passes    # fill pass_groups (only _EmptyPasses reads it)
        self.pass_groups = {}

    def reset_state(self):
        self.ds.reset_state()

    def __len__(self):
        n = dataflow_length(self.ds)
        if n is None:
            raise EndlessError("MultiProcessMapAndBatchData: its source's length is unknown, and "
                               "it repeats the source forever, so a pass never ends")
        return n // self.batch_size

    _resumed = False

    def __iter__(self):
        counts = self.pass_groups = {}
        state = [0, 0]                      # the pass now, its groups so far

        def end_pass():
            if self.count_passes:
                counts[state[0]] = state[1]
            state[0], state[1] = state[0] + 1, 0
        forever = repeat_forever(self.ds, "MultiProcessMapAndBatchData", on_pass_end=end_pass)
        if not self._resumed:
            return self._groups(forever, state)
        # resumed: the first pass of ds may have nothing left (see checkpoint)
        self._resumed = False
        return self._groups(itertools.chain(self.ds, _then(end_pass), forever), state)

    def _groups(self, datapoints, state):
        group = []
        for dp in datapoints:
            group.append(dp)
            if len(group) == self.batch_size:
                state[1] += 1
                yield state[0], group
                group = []

    # Between two groups nothing is held: the position is that of ds (the mapper records it
    # between chunks, which are made of whole groups).
    def _get_position(self):
        return self.ds._get_position()

    def _set_position(self, position):
        self.ds._set_position(position)
        self._resumed = position_mid_pass(position)   # else its first pass is a whole one

    def _abandon(self):
        self.ds._abandon()

    def _fingerprint_params(self):
        return {"batch_size": self.batch_size}


def _then(fn):
    """An empty iterable that calls ``fn()`` when it is reached."""
    fn()
    return
    yield


class _EmptyPasses:
    """Tells when a map-and-batch over a source of unknown length can never yield again: two
    whole passes of the source, and at least :data:`EMPTY_DATAPOINTS` datapoints, whose groups
    all came back empty (``map_func`` dropped every datapoint) since the last batch. The source
    repeats forever inside, so no pass would end and the consumer would wait for ever. (A
    random filter that keeps few datapoints does not trip it: that many drops in a row, across
    two whole passes, is what a map that drops everything gives.)"""

    EMPTY_DATAPOINTS = 10000

    def __init__(self, groups):
        self.groups = groups            # the _Groups: its pass_groups
        self.received = {}              # pass after the last kept batch's -> results received
        self.last_kept = -1             # the latest pass that gave a batch

    def result(self, p, batch):
        if p <= self.last_kept:
            return                      # a late result of a pass that gave a batch already
        done = self.groups.pass_groups
        if batch is not None:
            # what is kept is only about later passes: the counts stay few (the iteration is
            # endless)
            self.last_kept = p
            for counts in (self.received, done):
                for q in [q for q in counts if q <= p]:
                    del counts[q]
            return
        self.received[p] = self.received.get(p, 0) + 1
        empty = [q for q, n in self.received.items() if done.get(q) == n]
        dropped = sum(done[q] for q in empty) * self.groups.batch_size
        if len(empty) >= 2 and dropped >= self.EMPTY_DATAPOINTS:
            raise ValueError(
                f"MultiProcessMapAndBatchData: map_func dropped every datapoint (returned None) "
                f"of {len(empty)} whole passes of the source, {dropped} datapoints in a row; over "
                f"a source of unknown length, repeated forever, no batch would ever come")


class _MapAndBatch:
    """The worker function of MultiProcessMapAndBatchData: map a group, batch the results.
    Messages name the user's function (``__wrapped__``) and the group ("batch #k", see
    ``protocol.run_chunk``); an error of the function also says which datapoint of the group."""

    input_name = "batch"

    def __init__(self, map_func):
        self.map_func = map_func

    @property
    def __wrapped__(self):
        return self.map_func

    def __call__(self, tagged):
        """``(pass, group)`` -> ``(pass, batch)``, the batch ``None`` when every datapoint of
        the group was dropped."""
        p, group = tagged
        f, mapped = self.map_func, []
        for j, dp in enumerate(group):
            try:
                r = f(dp)
            except Exception as e:
                add_note(e, f"(raised on datapoint {j} of the {len(group)} grouped into one "
                            f"batch)")
                raise
            if r is not None:
                mapped.append(r)
        return p, (aggregate_batch(mapped) if mapped else None)


class MultiProcessMapAndBatchData(MultiProcessMapData):
    """Map ``map_func`` and batch by ``batch_size`` inside ``num_proc`` worker processes, so a whole
    batch travels as one message (tensorpack's ``MultiProcessMapAndBatchDataZMQ``).

    ``buffer_size`` counts datapoints before batching (default ``batch_size * max(4, 2 *
    num_proc)``). Like tensorpack's it is non-strict: the source repeats forever, and each pass
    yields ``len(ds) // batch_size`` batches. A batch is smaller than ``batch_size`` only when
    ``map_func`` dropped some of its datapoints.
    """

    def __init__(self, ds, num_proc, map_func, batch_size, buffer_size=None, *,
                 start_method=None, max_restarts=0, timeout=None):
        check_int("batch_size", batch_size, 1)
        ds = check_dataflow(ds, "MultiProcessMapAndBatchData")
        if not callable(map_func):
            raise TypeError(f"MultiProcessMapAndBatchData: map_func must be callable, got "
                            f"{map_func!r:.60}")
        n = dataflow_length(ds)
        if n is not None and batch_size > n:
            raise ValueError(f"batch_size={batch_size} is larger than the dataflow ({n})")
        if buffer_size is None:
            # (None and "auto" as MultiProcessMapData takes them; a bad num_proc is named there)
            workers = available_cpus() if num_proc is None or num_proc == "auto" else num_proc
            buffer_size = batch_size * max(4, 2 * (int(workers) if is_int(workers) else 1))
        else:
            buffer_size = check_int("buffer_size", buffer_size, 1)
        self.batch_size = batch_size
        self._length_known = n is not None
        self._groups = _Groups(ds, batch_size, count_passes=not self._length_known)
        super().__init__(self._groups, num_proc, _MapAndBatch(map_func),
                         buffer_size=max(1, buffer_size // batch_size),
                         start_method=start_method, max_restarts=max_restarts,
                         timeout=timeout)
        self.buffer_size_datapoints = buffer_size

    def __iter__(self):
        return self._batches(super().__iter__())

    def _batches(self, results):
        """The batches of the map's results ``(pass, batch)``; a group whose datapoints were all
        dropped gives none. Over a source of unknown length, :class:`_EmptyPasses` watches for
        a map that drops everything."""
        watch = None if self._length_known else _EmptyPasses(self._groups)
        try:
            for p, batch in results:
                if watch is not None:
                    watch.result(p, batch)
                if batch is not None:
                    yield batch
        finally:
            results.close()


MultiProcessMapAndBatchDataZMQ = MultiProcessMapAndBatchData


# tensorpack's older names for the runners
PrefetchData = MultiProcessPrefetchData = MultiProcessRunner
PrefetchDataZMQ = MultiProcessRunnerZMQ
MultiThreadPrefetchData = MultiThreadRunner
