"""Large numpy arrays made by a map function in a process worker, allocated in shared memory.

A map function that returns ``np.full((1024, 1024), k, np.float32)`` allocates 4 MiB in the
worker's heap, fills it, and returns it; the worker would then copy it into a shared-memory segment
for the consumer. That copy costs as much as making the array. NumPy lets a program choose where
array data is allocated (NEP 49, ``PyDataMem_SetHandler``), so while the map function runs, a
worker can have every allocation of at least :data:`MIN_BYTES` served by a segment of its pool:
the array is then *born* in shared memory and, once returned, is referred to where it is.

Two rules keep this invisible to the map function:

* **An array the worker still holds is never lent.** An array is sent in place only if the worker
  freed it once the results were encoded (nothing in the map function's state refers to it);
  otherwise it is copied, as any array is. See :meth:`~.shm.SegmentPool.place`.
* **It is used only where it pays.** Each allocation or free made while the handler is in place
  runs a little Python (about 1-2 us, small arrays included), which a map function making many
  small temporaries would feel. :class:`ZeroCopySwitch` turns it on only for a map function whose
  results carry at least :data:`LARGE_RESULT` bytes of arrays per datapoint, and keeps it only if
  it measures that datapoints cost less CPU time with it than without.

Only the worker's main thread (where the map function runs) is affected: the handler is held in a
context variable, so threads the map function starts allocate as usual, and a process forked from
inside the map function goes back to NumPy's default at once.

Where NumPy (< 1.22) or the interpreter (no ``ctypes.pythonapi``) lack the API, :func:`available`
is false and workers copy as before.
"""
import contextlib
import ctypes
import os
import time

import numpy as np

__all__ = ["available", "allocating_in", "ZeroCopySwitch", "MIN_BYTES", "MAX_BYTES",
           "LARGE_RESULT"]

MIN_BYTES = 256 << 10       # allocations from this size up go to shared memory ...
MAX_BYTES = 64 << 20        # ... up to this size: a larger one (a huge temporary, say) would
                            # stay reserved in the pool for the worker's life; the heap gives it back
LARGE_RESULT = 1 << 20      # results carrying this many bytes of arrays per datapoint qualify

_HANDLER_NAME = b"dataflow_shared_memory"

_MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_CALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
_REALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class _Allocator(ctypes.Structure):          # PyDataMemAllocator (numpy/ndarraytypes.h)
    _fields_ = [("ctx", ctypes.c_void_p), ("malloc", _MALLOC), ("calloc", _CALLOC),
                ("realloc", _REALLOC), ("free", _FREE)]


class _Handler(ctypes.Structure):            # PyDataMem_Handler, version 1
    _fields_ = [("name", ctypes.c_char * 127), ("version", ctypes.c_uint8),
                ("allocator", _Allocator)]


def _numpy_set_handler():
    """NumPy's ``PyDataMem_SetHandler`` (slot 304 of its C-API table, stable since 1.22) twice:
    taking a handler, and taking a pointer (``None`` is NULL: back to NumPy's default); or None
    where it cannot be reached."""
    try:
        if tuple(int(x) for x in np.__version__.split(".")[:2]) < (1, 22):
            return None
        try:
            from numpy._core import _multiarray_umath as umath
        except ImportError:                  # numpy 1.x
            from numpy.core import _multiarray_umath as umath
        get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
        get_pointer.restype = ctypes.c_void_p
        get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
        table = ctypes.cast(get_pointer(umath._ARRAY_API, None), ctypes.POINTER(ctypes.c_void_p))
        return (ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(table[304]),
                ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p)(table[304]))
    except (AttributeError, ImportError, ValueError, OSError):
        return None


def _handler_name():
    try:
        from numpy._core.multiarray import get_handler_name
    except ImportError:                      # numpy 1.x
        from numpy.core.multiarray import get_handler_name
    return get_handler_name()


class _SharedMemoryHandler:
    """The NumPy memory handler of one worker: allocations of ``MIN_BYTES`` to ``MAX_BYTES`` come
    from ``pool`` (a :class:`~.shm.SegmentPool`), others from the C library.

    The callbacks may run in any thread and at any allocation, garbage collection included, so
    ``free`` only queues the address (``pool.freed``, a deque: appending is atomic); the pool
    takes the queue into account before it hands out or lends memory."""

    def __init__(self, pool, set_handler):
        libc = ctypes.CDLL(None, use_errno=True)
        malloc, calloc, realloc, free = libc.malloc, libc.calloc, libc.realloc, libc.free
        for f in (malloc, calloc, realloc):
            f.restype = ctypes.c_void_p
        malloc.argtypes = [ctypes.c_size_t]
        calloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
        realloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        free.argtypes = [ctypes.c_void_p]
        lent, freed, lend = pool.lent, pool.freed, pool.lend

        def on_malloc(ctx, size):
            if MIN_BYTES <= size <= MAX_BYTES:
                address = lend(size)
                if address:
                    return address
            return malloc(size or 1)

        def on_calloc(ctx, count, size):
            if MIN_BYTES <= count * size <= MAX_BYTES:
                address = lend(count * size)
                if address:
                    ctypes.memset(address, 0, count * size)
                    return address
            return calloc(count or 1, size or 1)

        def on_realloc(ctx, address, size):
            old = lent.get(address)
            if old is None:
                return realloc(address, size)
            new = on_malloc(ctx, size)
            if new:
                ctypes.memmove(new, address, min(old, size))
                freed.append(address)
            return new

        def on_free(ctx, address, size):
            if address in lent:
                freed.append(address)
            elif address:
                free(address)

        self._functions = (_MALLOC(on_malloc), _CALLOC(on_calloc), _REALLOC(on_realloc),
                           _FREE(on_free))
        self._struct = _Handler(_HANDLER_NAME, 1, _Allocator(None, *self._functions))
        new_capsule = ctypes.pythonapi.PyCapsule_New
        new_capsule.restype = ctypes.py_object
        new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        self.capsule = new_capsule(ctypes.addressof(self._struct), b"mem_handler", None)
        self._set = set_handler

    @contextlib.contextmanager
    def active(self):
        previous = self._set(self.capsule)
        try:
            yield
        finally:
            self._set(previous)


_set_handler = _reset_handler = None


def available():
    """Whether NumPy's memory-handler API can be used here."""
    global _set_handler, _reset_handler
    if _set_handler is None:
        _set_handler, _reset_handler = _numpy_set_handler() or (False, False)
    return bool(_set_handler)


def _back_to_default_in_child():
    _reset_handler(None)


def allocating_in(pool):
    """A context manager under which the calling thread's large numpy allocations come from
    ``pool``; None where that is not possible. Checks once that NumPy took the handler."""
    if not available():
        return None
    try:
        handler = _SharedMemoryHandler(pool, _set_handler)
    except (AttributeError, OSError, TypeError):    # no C library to load by name (Windows)
        return None
    with handler.active():
        taken = _handler_name() == _HANDLER_NAME.decode()
    if not taken:
        return None
    # Arrays call the handler when they are freed, which may be during interpreter shutdown,
    # after module globals are cleared: one reference that is never given back keeps its
    # callbacks alive for the life of the process.
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(handler))
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_back_to_default_in_child)
    return handler.active


class ZeroCopySwitch:
    """Whether a worker's map function runs with its large allocations in shared memory.

    Use: ``with switch.chunk(): <run the map function over a chunk>``, then
    ``switch.observe(datapoints, array_bytes)`` once the results are encoded.

    Off until the results of a chunk carry at least :data:`LARGE_RESULT` bytes of arrays per
    datapoint. Then a trial: chunks alternate on and off until each side has run
    ``TRIAL_CHUNKS`` chunks (after ``WARM_UP`` chunks each, which pay for growing the pool) and
    ``TRIAL_SECONDS``; the side with the lower median CPU time per datapoint (map and encoding,
    from ``time.thread_time``, so that a busy machine does not blur it) wins. A new trial
    follows every ``RETRY_SECONDS``, since map functions change as they warm up.
    """
    clock = staticmethod(time.thread_time)
    WARM_UP = 2
    TRIAL_CHUNKS = 5
    TRIAL_SECONDS = 0.005
    RETRY_SECONDS = 30.0

    def __init__(self, pool):
        self._pool = pool
        self._active = None       # context manager factory; False: not possible here
        self.on = False
        self._used = False
        self._trial = None        # {True: [seconds per datapoint of each chunk], False: [...]}
        self._retry_at = None
        self._started = None      # thread_time() at the start of a chunk, during a trial

    def chunk(self):
        """The context in which to run the next chunk's map calls (timed from here to
        :meth:`observe` during a trial)."""
        self._used = False
        self._started = self.clock() if self._trial is not None else None
        if self.on and self._active is None:
            self._active = allocating_in(self._pool) or False
        if not self.on or not self._active:
            return contextlib.nullcontext()
        self._used = True
        return self._active()

    def observe(self, datapoints, array_bytes):
        """Account for the chunk just run and encoded: its datapoints and the bytes of arrays
        its results carried."""
        if not datapoints or self._active is False:
            return
        seconds = None if self._started is None else self.clock() - self._started
        if self._trial is None:
            large = self._retry_at is None and array_bytes / datapoints >= LARGE_RESULT
            if large or (self._retry_at is not None and time.monotonic() >= self._retry_at):
                self._trial = {True: [], False: []}
                self.on = True
            return
        if seconds is None:                    # the trial began after this chunk started
            self.on = True
            return
        self._trial[self._used].append(seconds / datapoints)
        on, off = (sorted(self._trial[side][self.WARM_UP:]) for side in (True, False))
        if min(len(on), len(off)) >= self.TRIAL_CHUNKS and \
                min(sum(on), sum(off)) >= self.TRIAL_SECONDS:
            self.on = on[len(on) // 2] < off[len(off) // 2]
            self._trial = None
            self._retry_at = time.monotonic() + self.RETRY_SECONDS
        else:
            self.on = not self._used           # alternate
