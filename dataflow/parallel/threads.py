"""Map work in threads: for functions that release the GIL (numpy, OpenCV, I/O).

:class:`ThreadExecutor` is a pool of daemon threads behind the :class:`~.mapper.Executor`
contract; ordering, strictness and errors are the mapper's. The worker threads hold no reference
to the dataflow, so an abandoned dataflow is garbage-collected and its finalizer stops them.
"""
import itertools
import logging
import math
import os
import queue
import sys
import threading
import time
import traceback

from .. import config
from .. import rng as _rng
from .mapper import (CLOSED_WHILE_ITERATING, InlineExecutor, ParallelMapData, WorkerError,
                     run_chunk)
from . import cvthreads
from .supervisor import check_workers

__all__ = ["ThreadExecutor", "MultiThreadMapData", "MultiThreadRunner", "available_cpus",
           "make_executor"]

logger = logging.getLogger("dataflow")

# close() waits at most this long in total for idle threads to leave; a thread that is inside a
# map call cannot be interrupted and leaves as soon as that call returns.
_JOIN_BUDGET = 0.05


def available_cpus():
    """The number of CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        return os.cpu_count() or 1


def _warn_hung(watch, waited):
    frame = sys._current_frames().get(watch.thread.ident)
    stack = "".join(traceback.format_stack(frame)) if frame is not None else "(finished)"
    logger.warning("%s for %.1f s (hang_timeout=%s s); its Python stack:\n%s", watch.describe(),
                   waited, config.current_hang_timeout(), stack)


class _Failed:
    """Put on the result queue by a worker thread that cannot go on."""
    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


class _Watch:
    """What the consumer knows of one worker thread's current chunk, for the deadlines, and of
    its work, for the statistics."""
    __slots__ = ("thread", "busy_since", "next_warning", "items", "wid", "busy_s", "started",
                 "ended")

    def __init__(self, wid=None):
        self.thread = None
        self.busy_since = self.next_warning = self.items = None
        self.wid = wid
        self.busy_s = 0.0          # seconds in the map function
        self.started = time.monotonic()
        self.ended = None          # when it retired

    def describe(self):
        items = self.items or ()
        shown = ", ".join(f"#{index}" for _, index, _ in items[:20])
        return f"datapoints {shown} have been in worker thread {self.thread.name!r}"


# Put on the task queue to make the one thread that takes it leave (between two chunks).
_RETIRE = "retire"


def _thread_main(wid, make_func, tasks, results, stop, watch):
    try:
        func = make_func(wid)
        while True:
            task = tasks.get()
            if task is None or stop.is_set():
                return
            if task is _RETIRE:
                watch.ended = time.monotonic()
                return
            watch.items, watch.next_warning = task[1], None
            watch.busy_since = time.monotonic()
            out = run_chunk(func, task[0], task[1], stop)
            watch.busy_since = None
            watch.busy_s += out[1]
            results.put(out)
    except BaseException as e:       # make_func failed, or something outside one datapoint
        results.put(_Failed(WorkerError.from_exception(e, f"worker thread {wid}")))


class ThreadExecutor:
    """``num_workers`` threads taking chunks from one queue (so work spreads by itself).

    The pool can be resized while it runs (autotuning): :meth:`add_worker` starts a thread,
    :meth:`retire_worker` queues a token that makes the first thread to take it leave after the
    chunks queued before it, so no chunk is lost or run twice."""
    kind = "thread"

    def __init__(self, num_workers, make_func, name="dataflow"):
        self._tasks = queue.SimpleQueue()
        self._results = queue.SimpleQueue()
        self._stop = threading.Event()
        self._make_func = make_func
        self._name = name
        self._next_wid = 0
        self.num_workers = 0
        self._watches = []
        self._threads = []
        # OpenCV's pool, shared by the process, gets the CPUs per worker (cvthreads)
        self._cv_token = cvthreads.hold(cvthreads.threads_for(num_workers))
        for _ in range(num_workers):
            self.add_worker()

    def add_worker(self):
        """Start one more worker thread."""
        wid, self._next_wid = self._next_wid, self._next_wid + 1
        w = _Watch(wid)
        t = w.thread = threading.Thread(
            target=_thread_main, name=f"{self._name}-worker-{wid}", daemon=True,
            args=(wid, self._make_func, self._tasks, self._results, self._stop, w))
        self._watches.append(w)
        self._threads.append(t)
        self.num_workers += 1
        t.start()

    def retire_worker(self):
        """Make one worker thread leave once the chunks queued so far are taken; the pool keeps
        at least one."""
        if self.num_workers <= 1:
            return
        self.num_workers -= 1
        self._tasks.put(_RETIRE)

    def worker_stats(self):
        """Per worker thread: its id, seconds busy, when it started and retired."""
        return [{"key": id(w), "id": w.wid, "busy_s": w.busy_s, "started": w.started,
                 "ended": w.ended, "state": "running" if w.ended is None else "retired"}
                for w in self._watches]

    def submit(self, run, items):
        self._tasks.put((run, items))

    def get(self, timeout=None):
        while True:
            hang = config.current_hang_timeout()
            wait = check_workers(self._watches, timeout, hang, _warn_hung)
            if wait is None and (timeout is not None or hang != math.inf):
                # No thread has started on the work yet: look again after a while.
                wait = min(t for t in (timeout, hang) if t is not None)
            try:
                r = self._results.get(timeout=wait)
                break
            except queue.Empty:
                pass
        if isinstance(r, _Failed):
            raise r.error.to_exception()
        if r is None:
            self._results.put(None)          # for any other waiter
            raise RuntimeError(CLOSED_WHILE_ITERATING)
        return r

    def close(self):
        if self._stop.is_set():
            return
        self._stop.set()
        cvthreads.release(self._cv_token)
        self._results.put(None)              # wakes a get() blocked in another thread
        for _ in self._threads:
            self._tasks.put(None)
        deadline = time.monotonic() + _JOIN_BUDGET
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(max(0.0, deadline - time.monotonic()))


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
            ``len(ds)`` results.
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
    executor = "thread"

    def __init__(self, ds, num_thread=None, map_func=None, *, buffer_size=200, strict=False,
                 ordered=False, on_error="raise", max_errors=None, timeout=None):
        super().__init__(ds, available_cpus() if num_thread is None else num_thread, map_func,
                         buffer_size=buffer_size, strict=strict, ordered=ordered,
                         on_error=on_error, max_errors=max_errors, timeout=timeout)
        self.num_thread = self.num_workers
        if config.debug_mode():
            self.executor = "serial"

    def _make_executor(self):
        return make_executor(self.executor, self.num_workers, Constant(self.map_func))


class Constant:
    """make_func of a map: every worker runs the same function."""

    def __init__(self, func):
        self.func = func

    def __call__(self, wid):
        return self.func


def make_executor(kind, num_workers, make_func, **process_options):
    """Start an executor of ``kind`` ("serial", "thread" or "process")."""
    if kind == "serial":
        return InlineExecutor(make_func)
    if kind == "thread":
        return ThreadExecutor(num_workers, make_func)
    from .processes import ProcessExecutor
    return ProcessExecutor(num_workers, make_func, **process_options)


class _Tickets:
    """The source of a runner: one placeholder per datapoint to produce; endless if the length
    is unknown."""

    def __init__(self, length):
        self.length = length

    def reset_state(self):
        pass

    def __len__(self):
        if self.length is None:
            raise NotImplementedError("the runner's dataflow has no length")
        return self.length

    def __iter__(self):
        return itertools.repeat(None, *([] if self.length is None else [self.length]))


class OwnDataFlow:
    """The 'map function' of a runner's worker: each call returns the next datapoint of the
    worker's own dataflow, which it runs over and over.

    ``copy`` numbers the copy. While the copy runs, serial maps inside it key their datapoints'
    random streams by ``(pass, index, copy)`` (see ``MapData``), so the copies of a seeded
    pipeline draw different random numbers (with ``(pass, index)`` alone, every copy's k-th
    datapoint would get the same crop, flip, ...)."""

    def __init__(self, df, copy=0):
        self.df = df
        self.copy = copy
        self._it = None

    def __call__(self, _ticket):
        local = _rng._local
        outer = getattr(local, "copy", None)
        local.copy = self.copy
        try:
            for _ in range(2):
                if self._it is None:
                    self._it = iter(self.df)
                try:
                    return next(self._it)
                except StopIteration:
                    self._it = None
        finally:
            local.copy = outer
        raise ValueError(f"{type(self.df).__name__} yielded no datapoint in a whole pass")


class OwnCopy:
    """make_func of a runner: each worker resets and runs its own copy of ``ds``."""

    def __init__(self, ds):
        self.ds = ds

    def __call__(self, wid):
        self.ds.reset_state()
        return OwnDataFlow(self.ds, copy=wid)


class CopiesRunner(ParallelMapData):
    """Base of the runners whose workers each run their own copy of ``ds`` (shipped to them by
    the executor): the consumer only hands out tickets, ``len(ds)`` per pass when that is known,
    endlessly otherwise, at most ``num_prefetch`` ahead of the consumer."""

    def __init__(self, ds, num_workers, num_prefetch, *, timeout=None):
        self.num_prefetch = num_prefetch
        super().__init__(_Tickets(dataflow_length(ds)), num_workers, OwnCopy(ds),
                         buffer_size=num_prefetch, timeout=timeout)

    def _reset_source(self):
        pass                          # each worker resets its own copy


def dataflow_length(df):
    try:
        return len(df)
    except (NotImplementedError, TypeError):
        return None


class MultiThreadRunner(ParallelMapData):
    """Run ``num_thread`` copies of the dataflow returned by ``get_df()``, one per thread, and
    yield their datapoints in arrival order, at most ``num_prefetch`` ahead of the consumer.

    As in tensorpack, each ``__iter__`` pass yields ``len(get_df())`` datapoints when that length
    is known, and never ends otherwise. Errors in a copy reach the consumer with their original
    type.
    """
    executor = "thread"
    _autotune_ok = False       # one copy of the dataflow per thread: a fixed count

    def __init__(self, get_df, num_prefetch, num_thread):
        if not callable(get_df):
            raise TypeError(f"get_df must be a callable returning a DataFlow, got {get_df!r}")
        self.get_df = get_df
        self.num_prefetch = num_prefetch
        self.num_thread = num_thread
        super().__init__(_Tickets(None), num_thread, get_df, buffer_size=num_prefetch)

    def _reset_source(self):
        self._dfs = [self.get_df() for _ in range(self.num_workers)]
        for df in self._dfs:
            df.reset_state()
        self.ds = _Tickets(dataflow_length(self._dfs[0]))

    def _make_executor(self):
        funcs = [OwnDataFlow(df, copy=k) for k, df in enumerate(self._dfs)]
        self._dfs = None
        return ThreadExecutor(self.num_workers, funcs.__getitem__)

    def __len__(self):
        if self._state is None:
            return len(self.get_df())
        return len(self.ds)
