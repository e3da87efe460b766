"""Shared memory for the payloads of process workers: written once, read in place, reused.

A worker owns a pool of *segments*. Each is an anonymous memory file (``memfd_create`` on Linux,
an already-unlinked temporary file elsewhere) mapped by the worker and, once, by the consumer, which
receives its file descriptor over a Unix socket. Nothing has a name in ``/dev/shm``, so nothing can
leak: the memory is gone once the last process that maps it is gone, however it died, and the size
of ``/dev/shm`` is no limit. Each segment's memory is reserved with ``posix_fallocate`` when it is
created, so running out of memory is a clear :class:`SharedMemoryError` at that moment rather than
a ``SIGBUS`` later.

Life of a segment: the worker fills it with the arrays of one result message (or hands it out
through :func:`shared_empty`), the consumer maps it and wraps the arrays around it. The consumer
side (:class:`SegmentReader`) notices when the user has dropped every array that uses a segment
and queues its id; the id travels back to the worker with the next task, and only then may the
worker write into that segment again. So an array the user still holds is never overwritten, and a
user who keeps many results alive makes the pool grow instead of stalling it.
"""
import collections
import errno
import mmap
import os
import socket
import tempfile
import weakref

import numpy as np

from .resources import memory_available, segment_error

__all__ = ["SharedMemoryError", "SegmentPool", "SegmentReader", "shared_empty", "ALIGN"]

ALIGN = 64                   # every buffer starts on a cache line
_MIN_SEGMENT = 64 * 1024     # segments are powers of two from this size up


class SharedMemoryError(MemoryError):
    """Shared memory for a result could not be reserved."""


def _size_class(nbytes):
    size = _MIN_SEGMENT
    while size < nbytes:
        size *= 2
    return size


def aligned(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


# Segments at least this large are first compared with the memory available: reserving the
# blocks of a memfd takes them from RAM at once, and one beyond it woke the kernel's OOM killer
# (which may end any process) where a MemoryError was due.
_CHECKED_SIZE = 64 << 20


def _anonymous_file(size):
    """An open file descriptor of ``size`` bytes of memory that has no name anywhere, its
    blocks reserved (a full file system raises here, not SIGBUS on first write)."""
    if size >= _CHECKED_SIZE:
        available = memory_available()
        if available is not None and size > available:
            raise SharedMemoryError(segment_error(
                size, OSError(errno.ENOMEM, "more than the memory available")))
    directory = None
    try:
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create("dataflow", os.MFD_CLOEXEC)
        else:                                       # macOS and others: unlinked at once
            directory = tempfile.gettempdir()
            with tempfile.TemporaryFile() as f:
                fd = os.dup(f.fileno())
    except OSError as e:
        raise SharedMemoryError(segment_error(size, e, directory=directory)) from None
    try:
        os.ftruncate(fd, size)
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)
        else:                                       # macOS: writing the blocks reserves them
            _write_zeros(fd, size)
    except OSError as e:
        os.close(fd)
        raise SharedMemoryError(segment_error(size, e, directory=directory)) from None
    return fd


def _write_zeros(fd, size, chunk=1 << 20):
    zeros = bytes(min(chunk, size))
    offset = 0
    while offset < size:
        offset += os.pwrite(fd, zeros[:size - offset], offset)


class _Segment:
    __slots__ = ("id", "size", "mm", "address", "with_consumer", "held_here")

    def __init__(self, sid, size, mm):
        self.id, self.size, self.mm = sid, size, mm
        self.address = np.frombuffer(mm, np.uint8).ctypes.data
        self.with_consumer = False    # sent and not yet released by the consumer
        self.held_here = False        # an array made on it (shared_empty, lend) lives here


class SegmentPool:
    """Worker side: the segments this worker writes into.

    ``fd_socket`` is this worker's end of a Unix socket pair; a new segment's descriptor is sent
    through it before any message that refers to the segment, so the consumer finds it there.

    Besides the segments that results are copied into, the pool hands out whole segments for
    arrays made in the worker: :meth:`empty` (``shared_empty``) and :meth:`lend` (the NumPy
    allocator of :mod:`.allocator`). Such an array is sent where it is if the worker no longer
    refers to it once the results are encoded, and copied otherwise (:meth:`place`).
    """

    def __init__(self, fd_socket):
        self._sock = fd_socket
        self._segments = {}
        self._free = {}            # size -> [segment ids]
        self._by_address = {}      # address -> segment id, of arrays made on a whole segment
        self._next_id = 0
        self.new = []              # [id, size] created since the last message; read by the sender
        self.lent = {}             # address -> bytes, of the segments lent to NumPy
        self.freed = collections.deque()   # addresses NumPy gave back, not yet taken back
        self.bytes_placed = 0      # bytes of all the arrays that results carried

    def allocate(self, nbytes):
        """A free segment of at least ``nbytes``; it now belongs to the consumer's next read."""
        self._take_back()
        size = _size_class(nbytes)
        free = self._free.get(size)
        if free:
            seg = self._segments[free.pop()]
        else:
            fd = _anonymous_file(size)
            try:
                try:
                    mm = mmap.mmap(fd, size)
                except OSError as e:
                    raise SharedMemoryError(segment_error(size, e, "map")) from None
                socket.send_fds(self._sock, [b"F"], [fd])
            finally:
                os.close(fd)
            seg = _Segment(self._next_id, size, mm)
            self._next_id += 1
            self._segments[seg.id] = seg
            self.new.append([seg.id, size])
        seg.with_consumer = True
        return seg

    def release(self, ids):
        """The consumer no longer uses these segments."""
        for sid in ids:
            seg = self._segments.get(sid)
            if seg is not None:
                seg.with_consumer = False
                self._maybe_free(seg)

    def _maybe_free(self, seg):
        if not seg.with_consumer and not seg.held_here:
            self._free.setdefault(seg.size, []).append(seg.id)

    def _hold(self, nbytes):
        """A segment for an array of ``nbytes`` that lives in this worker for now."""
        seg = self.allocate(max(nbytes, 1))
        seg.with_consumer = False
        seg.held_here = True
        self._by_address[seg.address] = seg.id
        return seg

    def _drop_local(self, sid, address):
        self._by_address.pop(address, None)
        seg = self._segments[sid]
        seg.held_here = False
        self._maybe_free(seg)

    def empty(self, shape, dtype):
        """An array whose memory is a segment of its own, to be returned in a result without a
        copy. The segment goes back to the pool when both sides are done with it."""
        dtype = np.dtype(dtype)
        dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if any(int(d) < 0 for d in dims):           # numpy.empty's own check (and message)
            raise ValueError(f"negative dimensions are not allowed, got shape {shape!r}")
        nbytes = int(np.prod(dims, dtype=object)) * dtype.itemsize    # object: no overflow
        seg = self._hold(nbytes)
        holder = _Lease((max(nbytes, 1),), np.uint8, buffer=seg.mm)
        weakref.finalize(holder, self._drop_local, seg.id, seg.address)
        return holder.view(np.ndarray)[:nbytes].view(dtype).reshape(shape)

    def lend(self, nbytes):
        """The address of a segment for NumPy to put an array's data in (0 when no shared
        memory can be had: NumPy then uses the heap). Given back through ``freed``."""
        try:
            seg = self._hold(nbytes)
        except (SharedMemoryError, OSError):      # no memory, or the consumer is gone
            return 0
        self.lent[seg.address] = seg.size
        return seg.address

    def _take_back(self):
        """Take back the segments whose arrays NumPy freed (queued by any thread)."""
        while self.freed:
            address = self.freed.popleft()
            self.lent.pop(address, None)
            self._drop_local(self._by_address[address], address)

    def place(self, messages):
        """Put the out-of-band buffers (1-D uint8 views) of some messages in shared memory;
        returns one ``[[segment_id, offset, nbytes], ...]`` per message. Empties the lists.

        A buffer that is the whole of an array made on a segment of this pool is sent where it
        is, unless the worker still refers to that array once the caller has dropped its own
        references (its map function kept it: it may write to it again), or the array went in
        an earlier message already. Every other buffer is copied, once, into one fresh segment
        per message.
        """
        own = []                 # (message, position, segment, nbytes, sent before)
        for m, buffers in enumerate(messages):
            for i, b in enumerate(buffers):
                arr = np.frombuffer(b, np.uint8)
                self.bytes_placed += arr.size
                # (reading an array's address costs about 1 us: only when there is a candidate)
                sid = self._by_address.get(arr.ctypes.data) if arr.size and self._by_address \
                    else None
                if sid is not None:
                    seg = self._segments[sid]
                    own.append((m, i, seg, arr.size, seg.with_consumer))
                    seg.with_consumer = True      # not free, whatever the worker does now
                    buffers[i] = None
                del arr, b
        self._take_back()                          # the arrays the caller no longer refers to
        out = [[None] * len(buffers) for buffers in messages]
        sent_in = {}
        for m, i, seg, nbytes, was_sent in own:
            if not seg.held_here and not was_sent and sent_in.setdefault(seg.id, m) == m:
                out[m][i] = [seg.id, 0, nbytes]
            else:                                  # copy it, from where it is
                messages[m][i] = np.frombuffer(seg.mm, np.uint8, nbytes)
                seg.with_consumer = was_sent or seg.id in sent_in
        for descs, buffers in zip(out, messages):
            to_copy, total = [], 0
            for i, b in enumerate(buffers):
                if b is not None:
                    arr = np.frombuffer(b, np.uint8)
                    to_copy.append((i, arr, total))
                    total += aligned(arr.size)
            if to_copy:
                seg = self.allocate(total)
                dest = np.frombuffer(seg.mm, np.uint8)
                for i, arr, offset in to_copy:
                    dest[offset:offset + arr.size] = arr
                    descs[i] = [seg.id, offset, arr.size]
            buffers.clear()
        return out


class _Lease(np.ndarray):
    """The array, made directly on a segment's mapping, that every array using the segment is
    derived from. numpy shortens chains of views, but never past an array of another type whose
    own base is no array: this object stays in the base chain of every view (and view of a view),
    so it lives exactly as long as some array that uses the segment does."""


class SegmentReader:
    """Consumer side: maps one worker's segments and tracks which the user still holds.

    ``fd_socket`` is the consumer's end of the worker's socket pair. ``released`` is a shared
    ``collections.deque`` into which ``(key, segment_id)`` is appended, from whichever thread
    drops the last array of a segment, for the transport to send back.
    """

    def __init__(self, key, fd_socket, released):
        self.key = key
        self._sock = fd_socket
        self._released = released
        self._maps = {}
        self.held_bytes = 0        # size of the segments the consumer side still uses
        self.pool_bytes = 0        # size of all the worker's segments (mapped here)

    def add(self, new):
        """Map the segments a message announces as new (their descriptors wait in the socket)."""
        for sid, size in new:
            _, fds, _, _ = socket.recv_fds(self._sock, 1, 1)
            try:
                try:
                    self._maps[sid] = mmap.mmap(fds[0], size)
                except OSError as e:
                    raise SharedMemoryError(segment_error(size, e, "map")) from None
                self.pool_bytes += size
            finally:
                os.close(fds[0])

    def buffers(self, descs):
        """One plain uint8 array per ``[segment_id, offset, nbytes]``, viewing the segment. The
        segment is released once all of them, and everything derived from them, are gone."""
        holders, out = {}, []
        for sid, offset, nbytes in descs:
            base = holders.get(sid)
            if base is None:
                mm = self._maps[sid]
                holder = _Lease((len(mm),), np.uint8, buffer=mm)
                weakref.finalize(holder, self._released.append, (self.key, sid))
                base = holders[sid] = holder.view(np.ndarray)
                self.held_bytes += len(mm)
            out.append(base[offset:offset + nbytes])
        return out

    def released(self, sid):
        """Account for a segment the consumer no longer uses (called in the consumer thread)."""
        mm = self._maps.get(sid)
        if mm is not None:
            self.held_bytes -= len(mm)

    def close(self):
        """Forget the mappings; arrays still held keep theirs alive."""
        self._maps.clear()


# The pool of the worker process this code runs in, if any (see set_worker_pool).
_worker_pool = None


def set_worker_pool(pool):
    """Make :func:`shared_empty` allocate from ``pool``: called once by a worker process's body
    (:mod:`dataflow.parallel.worker`) with the pool its results travel in."""
    global _worker_pool
    _worker_pool = pool


def shared_empty(shape, dtype=float):
    """``numpy.empty(shape, dtype)``, allocated directly in shared memory when called inside a
    process worker, so that returning it in a datapoint costs no copy at all.

    The array is sent where it is if the worker no longer refers to it once the map function
    has returned; if the map function keeps it (to write to it again), it is copied, as any
    array. Outside a process worker (serial or thread execution) this is plain ``numpy.empty``.
    Large arrays made with ordinary numpy calls can get the same treatment automatically: see
    :mod:`dataflow.parallel.allocator`.
    """
    if _worker_pool is None:
        return np.empty(shape, dtype)
    return _worker_pool.empty(shape, dtype)
