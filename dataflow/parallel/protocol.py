"""The vocabulary every executor and the mapper share.

Worker side, :func:`run_chunk` is the one loop that applies the map function to a chunk; every
executor's worker calls it and reports one result kind per datapoint (``OK``, ``DROP``, ``ERR``
with a :class:`WorkerError`). Consumer side, :class:`Executor` is what
:class:`~.mapper.ParallelMapData` needs from a pool of workers; :class:`InlineExecutor` is the
serial one. The executor kinds are named here (``SERIAL``, ``THREAD``, ``PROCESS``, ``RAY``).

Executors (:mod:`.thread_executor`, :mod:`.process_executor`, :mod:`.ray`) import this module
and never each other.
"""
import collections
import time
import traceback
import types

import numpy as np

from ..rng import set_datapoint_key
from . import cvthreads

__all__ = ["Executor", "InlineExecutor", "run_chunk", "WorkerError", "WorkerTraceback", "OK",
           "DROP", "ERR", "SERIAL", "THREAD", "PROCESS", "RAY"]

# The executor kinds: an executor's ``kind`` and a parallel dataflow's ``.executor``.
SERIAL, THREAD, PROCESS, RAY = "serial", "thread", "process", "ray"


CLOSED_WHILE_ITERATING = "the dataflow was closed while it was being iterated"


# Kinds of result a worker reports for one datapoint.
OK, DROP, ERR = 0, 1, 2


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

    Optional, used when present: ``num_workers``; ``add_worker()`` and ``retire_worker()``
    (resizing while running, needed for ``num_workers="auto"``); and for :func:`dataflow.stats`,
    ``worker_stats()`` (a dict per worker: ``key``, ``id``, ``busy_s``, ``started``, ``ended``,
    ``state``, optionally ``shm_bytes`` and ``pool_bytes``), ``restarts`` and ``shm_bytes``.
    """
    kind = None

    def submit(self, run, items):
        raise NotImplementedError

    def get(self, timeout=None):
        raise NotImplementedError

    def close(self):
        raise NotImplementedError


class InlineExecutor(Executor):
    """Runs each chunk at once, in the consuming thread: serial execution behind the same mapper
    (debug mode, where a debugger must be able to step into the map function, or an error
    policy without workers)."""
    kind = SERIAL

    def __init__(self, make_func):
        self._func = make_func(0)
        self._results = collections.deque()

    def submit(self, run, items):
        self._results.append(run_chunk(self._func, run, items))

    def get(self, timeout=None):
        return self._results.popleft()

    def close(self):
        self._results.clear()
