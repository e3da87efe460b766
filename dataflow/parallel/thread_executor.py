"""The executor of worker threads: :class:`ThreadExecutor`, for functions that release the GIL
(numpy, OpenCV, I/O).

A pool of daemon threads behind the :class:`~.protocol.Executor` contract; ordering,
strictness and errors are the mapper's. The worker threads hold no reference to the dataflow, so
an abandoned dataflow is garbage-collected and its finalizer stops them.
"""
import errno
import logging
import queue
import sys
import threading
import time
import traceback

from .. import config
from .protocol import CLOSED_WHILE_ITERATING, THREAD, Executor, WorkerError, run_chunk
from . import cvthreads
from .resources import ResourceLimitError
from .supervisor import next_wait

__all__ = ["ThreadExecutor"]

logger = logging.getLogger("dataflow")


# close() waits at most this long in total for idle threads to leave; a thread that is inside a
# map call cannot be interrupted and leaves as soon as that call returns.
_JOIN_BUDGET = 0.05


def _stack_of(watch):
    frame = sys._current_frames().get(watch.thread.ident)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(finished)"


def _warn_hung(watch, waited):
    logger.warning("%s for %.1f s (hang_timeout=%s s); its Python stack:\n%s", watch.describe(),
                   waited, config.current_hang_timeout(), _stack_of(watch))


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
            # let go of what was handed over before waiting: a WorkerError in ``out`` is raised
            # in the consumer, whose frames (and the dataflow in them) its traceback then holds,
            # and this thread's frame kept all of that alive, so a dataflow dropped without
            # close() was never collected and its threads never stopped
            out = task = None
    except BaseException as e:       # make_func failed, or something outside one datapoint
        results.put(_Failed(WorkerError.from_exception(e, f"worker thread {wid}")))


class ThreadExecutor(Executor):
    """``num_workers`` threads taking chunks from one queue (so work spreads by itself).

    The pool can be resized while it runs (autotuning): :meth:`add_worker` starts a thread,
    :meth:`retire_worker` queues a token that makes the first thread to take it leave after the
    chunks queued before it, so no chunk is lost or run twice."""
    kind = THREAD

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
        try:
            for _ in range(num_workers):
                self.add_worker()
        except RuntimeError as e:           # "can't start new thread": stop those that started
            started = len(self._threads)
            self.close()
            raise ResourceLimitError(
                errno.EAGAIN, f"could not start worker thread {started + 1} of {num_workers} "
                f"({e}): the system allows no more threads to this process; use fewer "
                "workers") from e

    def add_worker(self):
        """Start one more worker thread."""
        wid, self._next_wid = self._next_wid, self._next_wid + 1
        w = _Watch(wid)
        t = w.thread = threading.Thread(
            target=_thread_main, name=f"{self._name}-worker-{wid}", daemon=True,
            args=(wid, self._make_func, self._tasks, self._results, self._stop, w))
        t.start()                           # first: a thread that did not start is not ours
        self._watches.append(w)
        self._threads.append(t)
        self.num_workers += 1

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
            wait = next_wait(self._watches, timeout, config.current_hang_timeout(), _warn_hung,
                             _stack_of)
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
