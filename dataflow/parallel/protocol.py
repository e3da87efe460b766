"""The vocabulary every executor and the mapper share.

Worker side, :func:`run_chunk` is the one loop that applies the map function to a chunk; every
executor's worker calls it and reports one result kind per datapoint (``OK``, ``DROP``, ``ERR``
with a :class:`WorkerError`). Consumer side, :class:`Executor` is what
:class:`~.mapper.ParallelMapData` needs from a pool of workers; :class:`InlineExecutor` is the
serial one. The executor kinds are named here (``SERIAL``, ``THREAD``, ``PROCESS``, ``RAY``).

A worker's exception crosses a process boundary as :func:`pack_exception` bytes, which
:func:`unpack_exception` rebuilds with the exception's own class, ``args`` and attributes (an
:class:`UnknownWorkerException` subclass of the same name only when the class cannot be imported).
``SystemExit`` in a map function is reported as a ``RuntimeError`` naming it and the datapoint.

Executors (:mod:`.thread_executor`, :mod:`.process_executor`, :mod:`.ray`) import this module
and never each other.
"""
import collections
import pickle
import sys
import time
import traceback
import types

import numpy as np

from .._helpers import add_note, func_name
from .. import rng as _rng
from .. import serialize
from ..rng import set_datapoint_key
from . import cvthreads, torchthreads

__all__ = ["Executor", "InlineExecutor", "run_chunk", "WorkerError", "WorkerTraceback", "OK",
           "DROP", "ERR", "SERIAL", "THREAD", "PROCESS", "RAY", "UnknownWorkerException",
           "pack_exception", "unpack_exception"]

# The executor kinds: an executor's ``kind`` and a parallel dataflow's ``.executor``.
SERIAL, THREAD, PROCESS, RAY = "serial", "thread", "process", "ray"


CLOSED_WHILE_ITERATING = "the dataflow was closed while it was being iterated"
RESET_WHILE_ITERATING = ("reset_state() was called while this iteration was running: its "
                         "datapoints went with the old workers; start a new iteration")


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


def _drop_frames(exc, seen=None):
    """Clear ``__traceback__`` on ``exc`` and on every exception chained to it."""
    seen = set() if seen is None else seen
    if exc is None or id(exc) in seen:
        return
    seen.add(id(exc))
    exc.__traceback__ = None
    _drop_frames(exc.__cause__, seen)
    _drop_frames(exc.__context__, seen)


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
        """Keeps the traceback as text and lets go of its frames: an error kept by the error
        policy (``on_error="skip"``/``"replace"``) would otherwise keep alive the frames that
        called the map function, which in a serial map are the consumer's own, with the source's
        iterator suspended in them (a source that refuses a second iteration then refused the
        next pass)."""
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        _drop_frames(exc)
        return cls(exc, text, where, fatal)

    def to_exception(self):
        """The exception to raise in the consumer: the original type, with the worker's
        traceback as its cause and a note naming the function and datapoint."""
        exc = self.exc
        exc.__traceback__ = None       # the worker's frames are in the cause, not repeated
        exc.__cause__ = WorkerTraceback(self.tb)
        note = f"(raised in {self.where})"
        if note not in getattr(exc, "__notes__", ()):
            add_note(exc, note)        # on 3.10 too (kept in __notes__)
        return exc


class UnknownWorkerException(RuntimeError):
    """Stands for a worker's exception whose class cannot be imported in the consumer. The
    exception raised is a subclass named after the original class (same ``__qualname__`` and
    ``__module__``), its message ``module.Class: message``; ``args`` and the attributes that
    could be carried are kept."""


def _dumps_any(obj):
    """``obj`` pickled; by cloudpickle when pickle cannot, or would refer to a ``__main__`` that
    the loading process does not share (a spawned worker's differs from its consumer's; a
    forked one's is the same). Raises if neither can."""
    try:
        data = pickle.dumps(obj, protocol=5)
        if not serialize.refers_to_unshared_main(data):
            return data
    except Exception:
        pass
    import cloudpickle
    return cloudpickle.dumps(obj, protocol=5)


def pack_exception(exc):
    """A worker's exception as bytes that :func:`unpack_exception` rebuilds in the consumer with
    its own class, ``args`` and attributes, even when the class's ``__init__`` takes other
    arguments than ``args`` (so that pickling the exception as a whole fails). Attributes and
    arguments that do not pickle are dropped (an argument becomes its ``repr``) with a note."""
    whole = None
    try:
        whole = _dumps_any(exc)
        pickle.loads(whole)                     # an __init__ with other arguments fails here
    except Exception:
        whole = None
    cls = type(exc)
    try:
        cls_data = _dumps_any(cls)
    except Exception:
        cls_data = None
    notes = []
    try:
        args = _dumps_any(tuple(exc.args))
    except Exception:
        kept = []
        for a in exc.args:
            try:
                _dumps_any(a)
                kept.append(a)
            except Exception:
                kept.append(repr(a))
                notes.append(f"an argument of the worker's exception did not pickle and is its "
                             f"repr here: {repr(a)[:200]}")
        args = _dumps_any(tuple(kept))
    attrs, dropped = {}, []
    for name, value in getattr(exc, "__dict__", {}).items():
        try:
            attrs[name] = _dumps_any(value)
        except Exception:
            dropped.append(name)
    if dropped:
        notes.append(f"attributes of the worker's exception that do not pickle were dropped: "
                     f"{', '.join(dropped)}")
    try:
        text = str(exc)
    except Exception:
        text = repr(exc.args)
    return pickle.dumps((whole, cls_data, cls.__module__, cls.__qualname__, args, attrs, notes,
                         text), protocol=5)


def unpack_exception(data):
    """The exception :func:`pack_exception` described: the original as pickled whole when
    that loads, otherwise rebuilt from its class (``__new__``, then ``args`` and ``__dict__``),
    otherwise an :class:`UnknownWorkerException` subclass named after the class."""
    whole, cls_data, module, qualname, args, attrs, notes, text = pickle.loads(data)
    exc = None
    if whole is not None and not notes:
        try:
            exc = pickle.loads(whole)
        except Exception:
            exc = None
    loaded = {}
    for name, value in attrs.items():
        try:
            loaded[name] = pickle.loads(value)
        except Exception:
            notes.append(f"attribute {name} of the worker's exception could not be loaded here")
    try:
        args = pickle.loads(args)
    except Exception:
        args = (text,)
    if exc is None and cls_data is not None:
        try:
            cls = pickle.loads(cls_data)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                try:
                    exc = cls.__new__(cls, *args)
                except Exception:
                    try:
                        exc = cls.__new__(cls)
                    except Exception:       # a __new__ that wants other arguments
                        exc = BaseException.__new__(cls)
                exc.args = args
                if loaded:
                    exc.__dict__.update(loaded)
        except Exception:
            exc = None
    if exc is None:
        stand_in = type(qualname.rsplit(".", 1)[-1], (UnknownWorkerException,),
                        {"__module__": module, "__qualname__": qualname})
        exc = stand_in(f"{module}.{qualname}: {text}")
        notes.append(f"the worker raised {module}.{qualname}, a class that cannot be imported "
                     f"here; this {UnknownWorkerException.__name__} stands for it")
        for name, value in loaded.items():
            if name != "__notes__":
                try:
                    setattr(exc, name, value)
                except Exception:
                    pass
    if module == "__main__":
        exc = _as_main_class(exc, qualname)
    for note in notes:
        add_note(exc, note)
    return exc


def _as_main_class(exc, qualname):
    """``exc`` as an instance of this process's ``__main__`` class ``qualname`` when it was
    rebuilt from a copy of that class: a worker that does not share our ``__main__`` (a Ray
    actor) pickles the class by value, and ``except MyError`` in the script would not catch
    the copy."""
    real = sys.modules.get("__main__")
    for part in qualname.split("."):
        real = getattr(real, part, None)
    cls = type(exc)
    if not isinstance(real, type) or real is cls or not issubclass(real, BaseException) \
            or cls.__qualname__ != real.__qualname__:
        return exc
    try:
        exc.__class__ = real            # the same layout: args and attributes are kept
    except TypeError:
        pass
    return exc


# What a map function may not return: a generator (or a coroutine) is a map function written
# as a generator by mistake, whose datapoints would never be computed. Anything else is a
# datapoint, as in tensorpack and in serial MapData (a list or dict usually; a bare array, a
# number or a string too).
_NOT_DATAPOINTS = (types.GeneratorType, types.AsyncGeneratorType, types.CoroutineType)


def _bad_result(func, index, result):
    what = "a coroutine" if isinstance(result, types.CoroutineType) else "a generator"
    return TypeError(f"map function {func_name(func)} returned {what} for datapoint #{index}; "
                     f"it must return a datapoint (a list, tuple, dict, array, number or string) "
                     f"or None to drop it")


class StagedFunction:
    """A map function with the random stage of its map (see :func:`dataflow.rng.map_key`),
    as the mapper hands it to its executor when maps lie below it; :func:`run_chunk` keys the
    datapoints' random streams with the stage and calls ``func``."""

    def __init__(self, func, stage):
        self.func, self.stage = func, stage
        self.__wrapped__ = func          # messages name the function (func_name)


def staged(func, stage):
    """``func`` itself at stage 0, else a :class:`StagedFunction`."""
    return StagedFunction(func, stage) if stage else func


def detach_kept(value, _seen=None):
    """``value`` with copies of the arrays in it (at any depth of lists, tuples and dicts) that
    something else still refers to: a buffer the map function reuses from datapoint to
    datapoint, or a cache. A worker that sends a chunk's results together calls it on each
    result as soon as it is made, so that the next datapoint of the chunk cannot write over it.
    Fresh arrays and views of fresh arrays are kept as they are; an array whose memory belongs
    to no other array (shared memory, a received message) is left to the transport.

    Whether something else refers to an array is read from its reference count, against the
    count of a fresh one seen the same way (measured once, below: the interpreter's own
    references differ between versions). ``_seen`` collects the counts instead, for that."""
    c = value.__class__
    if c is list or c is tuple:
        # the usual datapoint, a flat list: one pass, no stack
        for a in value:
            ac = a.__class__
            if ac is list or ac is tuple or ac is dict:
                break                       # nested: the general walk below
            if ac is np.ndarray or isinstance(a, np.ndarray):
                if _seen is not None:
                    _seen.append(sys.getrefcount(a))
                elif sys.getrefcount(a) > _IN_BOX or _base_kept(a):
                    break
        else:
            return value
        a = None
    elif c is not dict:
        if not isinstance(value, np.ndarray):
            return value
        if _seen is not None:                                # a bare array: run_chunk's ``r``
            _seen.append(sys.getrefcount(value))
            _base_kept(value, _seen)
            return value
        return value.copy(order="K") if sys.getrefcount(value) > _BARE or _base_kept(value) \
            else value
    if _seen is not None:
        return value
    kept = None
    stack = [value]
    while stack:
        box = stack.pop()
        for a in (box.values() if box.__class__ is dict else box):
            ac = a.__class__
            if ac is list or ac is tuple or ac is dict:
                stack.append(a)
            elif isinstance(a, np.ndarray):
                if _seen is not None:
                    _seen.append(sys.getrefcount(a))
                elif sys.getrefcount(a) > _IN_BOX or _base_kept(a):
                    kept = set() if kept is None else kept
                    kept.add(id(a))
        a = box = None
    return value if kept is None else _copied(value, kept)


def _base_kept(arr, _seen=None):
    # (a base of another array type, such as the lease of a shared-memory segment, is the
    # transport's to judge: see shm.SegmentPool.place)
    base = arr.base
    while base.__class__ is np.ndarray:
        if _seen is not None:
            _seen.append(sys.getrefcount(base))
        elif sys.getrefcount(base) > _BASE:
            return True
        base = base.base
    return False


def _copied(value, kept):
    """``value`` rebuilt with copies of the arrays whose ids are in ``kept``."""
    c = value.__class__
    if c is list or c is tuple:
        out = [_copied(v, kept) for v in value]
        return out if c is list else tuple(out)
    if c is dict:
        for k, v in value.items():
            value[k] = _copied(v, kept)
        return value
    if isinstance(value, np.ndarray) and id(value) in kept:
        return value.copy(order="K")
    return value


def _calibrate():
    """The reference counts detach_kept sees for a fresh array, bare (held by one variable, as
    run_chunk's ``r``) and in a list, and for the base of a fresh view."""
    def bare():
        seen = []
        r = np.empty(2)[1:]
        r = detach_kept(r, seen)
        return seen

    def in_box():
        seen = []
        r = [np.empty(0)]
        r = detach_kept(r, seen)
        return seen

    (bare_count, base_count), (box_count,) = bare(), in_box()
    return bare_count, box_count, base_count


_BARE, _IN_BOX, _BASE = _calibrate()


def _emptied(reversed_items):
    while reversed_items:
        yield reversed_items.pop()


def _where(func, index, what="on"):
    """"map function f on datapoint #k" for messages; a function whose inputs are not the
    source's datapoints says what they are (``input_name``: "batch" for map-and-batch)."""
    return f"map function {func_name(func)} {what} {getattr(func, 'input_name', 'datapoint')} " \
           f"#{index}"


def run_chunk(func, run, items, stop=None, detach=None):
    """Apply ``func`` to each ``(seq, index, datapoint)`` of ``items``, datapoints ``index`` of
    source run ``run`` (the key of their random streams, see :func:`dataflow.rng.datapoint_rng`).

    Returns ``(results, busy_seconds)`` where ``results`` holds one ``(seq, kind, value)`` per item
    handled: ``(seq, OK, datapoint)``, ``(seq, DROP, None)`` for a ``None`` result, or
    ``(seq, ERR, WorkerError)``. An exception never escapes for a single datapoint. If ``stop`` (a
    ``threading.Event``) becomes set, the rest of the chunk is abandoned. ``detach`` (e.g.
    :func:`detach_kept`) is applied to each result as soon as it is made; ``items`` (a list)
    is then emptied as it is read, so that what a result shares with its input does not count
    as kept.
    """
    out = []
    t0 = time.perf_counter()
    # the map function may have imported cv2 or torch since the last chunk
    cvthreads.apply_pending()
    torchthreads.apply_pending()
    _rng.seed_torch()
    # The datapoint's random-stream key as a cursor advanced in place (see
    # rng.set_datapoint_key): a call and a tuple per datapoint were a tenth of a worker's time
    # on tiny datapoints. Set before every call: the map function may run a pipeline that sets
    # its own. It goes straight into this thread's slot (rng.key_slot: a list store); this
    # function runs in one thread throughout.
    stage = 0
    if func.__class__ is StagedFunction:
        func, stage = func.func, func.stage
    slot, cursor = _rng.key_slot(), _rng.map_key(run, 0, stage=stage)
    if detach is not None:
        items.reverse()
        items = _emptied(items)
    for seq, index, dp in items:
        cursor[1] = index
        slot[0] = cursor
        try:
            r = func(dp)
        except Exception as e:
            out.append((seq, ERR, WorkerError.from_exception(e, _where(func, index))))
        except SystemExit as e:       # a library's sys.exit() must not end the consumer
            err = RuntimeError(_where(func, index, f"raised SystemExit({e.code!r}) on"))
            out.append((seq, ERR, WorkerError(
                err, "".join(traceback.format_exception(type(e), e, e.__traceback__)),
                _where(func, index))))
        else:
            if r is None:
                out.append((seq, DROP, None))
            elif isinstance(r, _NOT_DATAPOINTS):
                if isinstance(r, types.CoroutineType):
                    r.close()           # never awaited: no "was never awaited" warning
                e = _bad_result(func, index, r)
                out.append((seq, ERR, WorkerError(e, f"TypeError: {e}\n",
                                                  f"datapoint #{index}", fatal=True)))
            else:
                if detach is not None:
                    dp = None               # the input's references are not the worker's
                    r = detach(r)
                out.append((seq, OK, r))
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
      any grouping across workers, but the chunks one worker ran in the order it ran them (the
      runners' checkpoints count on it), unless ``get`` raises (a dead worker, say), or
      ``TimeoutError`` once a datapoint has been in a worker for ``timeout`` seconds (``None``:
      wait as long as it takes). Work held longer than ``dataflow.config.hang_timeout()`` is
      logged as hung.
    * ``close()``: stop the workers promptly (well under 100 ms) and release everything;
      idempotent, safe to call from a finalizer or at interpreter exit.

    Optional capabilities, declared below with the defaults of an executor that lacks them:
    ``num_workers``; ``add_worker()`` and ``retire_worker()`` (resizing while running, needed for
    ``num_workers="auto"``); and for :func:`dataflow.stats`, ``worker_stats()`` (a dict per
    worker: ``key``, ``id``, ``busy_s``, ``started``, ``ended``, ``state``, optionally
    ``shm_bytes`` and ``pool_bytes``), ``restarts`` and ``shm_bytes``.
    """
    kind = None
    num_workers = None      # workers running now, where the executor counts them
    add_worker = None       # a method that starts one more worker, where it can resize
    retire_worker = None    # a method that stops one worker, likewise
    worker_stats = None     # a method returning the per-worker figures, for dataflow.stats
    restarts = 0            # workers replaced after they died
    shm_bytes = None        # shared memory the results brought, where they use it

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
