"""The control plane between the consumer and its worker processes: ZeroMQ and msgpack.

One ZeroMQ DEALER socket pair per worker. The consumer binds an endpoint that has no file (an
abstract ``ipc://@...`` name on Linux; elsewhere a socket file in a private directory that the
consumer removes on close) before it starts the worker, and the worker connects to it.
High-water marks are off: the mapper already bounds how many datapoints are out, and a full queue
must never drop a reply (tensorpack's strict mode deadlocks that way).

Privacy: only the worker the consumer started can talk to it. An abstract name can be listed and
connected to by any local user, so the consumer's socket is a ZeroMQ PLAIN server and every
connection must present the executor's secret (random, handed to the worker at start by
multiprocessing, never on the wire to anyone else) to the ZAP handler that the consumer answers
itself (:class:`Gatekeeper`). A peer without it is refused during the handshake, before any message
goes either way; the check costs one handshake per connection and nothing per message. The name
cannot be taken over by someone else while the consumer holds it, and a worker never reconnects, so
a worker cannot hand the secret to an impostor either. The first message of a worker is ``HELLO``:
until it arrives the consumer sends it nothing (a bound socket without its peer would block).
A malformed message is logged and dropped on either side (:class:`MalformedMessage`), except
that datapoints a message carried and its receiver cannot load are reported as failed.

Messages are multipart; the first frame is a msgpack list whose first element says what it is:

* consumer -> worker: ``[TASK, released_segment_ids, run, chunk_header, pickled, pairs]`` +
  array frames, where the chunk ``[[seq, index, datapoint], ...]`` is encoded with
  :func:`dataflow.serialize.dumps_oob` (large arrays travel as extra frames; with
  ``allow_pickle``, since both ends are private, see above) and ``pairs`` are its ``[seq,
  index]`` again, for the error when the chunk cannot be loaded (:class:`UnloadableTask`);
  ``[RELEASE, released_segment_ids]``
  when segments come free and no task is going that way; ``[STOP]``.
* worker -> consumer: ``[HELLO]`` once connected; ``[RESULTS, busy_seconds, new_segments,
  buffer_descs, results, pickled]`` where each result is ``[seq, kind, payload]``: the
  datapoint's header (its arrays are the shared-memory buffers ``buffer_descs`` point to, see
  :mod:`.shm`), a pickled :class:`~.protocol.WorkerError`, or nothing for a dropped datapoint;
  ``[FAILED, pickled WorkerError]`` when the worker cannot go on.

``pickled`` is None, or the one pickle of every object the message's datapoints hand to pickle
(:func:`dataflow.serialize.pickle_objects`; their headers say only where each goes): pickling a
set or a dataclass one by one cost several times what pickling it does, and pickle's own set-up
is paid once per message. When that pickle fails, the datapoints are encoded again one by
one, so that the one at fault is named.
"""
import hmac
import logging
import os
import pickle
import secrets
import shutil
import sys
import tempfile
import threading
import time
import uuid

import zmq

from .. import _msgpack as msgpack   # msgpack's own classes, even after msgpack_numpy.patch()
from .. import serialize
from .protocol import ERR, OK, WorkerError, pack_exception, unpack_exception

__all__ = ["Endpoints", "make_context", "make_socket", "make_secret", "bind_private",
           "connect_private", "Gatekeeper", "MalformedMessage", "UnloadableTask", "TASK", "STOP",
           "RESULTS", "FAILED", "RELEASE", "HELLO", "HELLO_FRAME", "encode_task", "encode_release",
           "decode_task", "encode_results", "decode_results", "encode_failure", "pickle_error",
           "unpickle_error"]

logger = logging.getLogger("dataflow")

TASK, STOP, RESULTS, FAILED, RELEASE, HELLO = 1, 2, 3, 4, 5, 6

# Arrays smaller than this travel inside the msgpack frame; larger ones in shared memory (results)
# or in frames of their own (tasks).
INLINE_LIMIT = serialize.DEFAULT_OOB_THRESHOLD
# A results message holds at most this many bytes of arrays (more only for one datapoint that is
# larger on its own): its segment is small enough to stay in cache and come back soon.
MESSAGE_BYTES = 4 << 20


# Linux names endpoints in its abstract namespace (no file, gone with the socket); elsewhere they
# are socket files in a private temporary directory.
_ABSTRACT_NAMES = sys.platform.startswith("linux")
_DIR_PREFIX = "dataflow-"


class Endpoints:
    """Names of the worker endpoints of one executor, unique on this machine."""

    def __init__(self):
        self._dir = None
        tag = f"dataflow-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        if _ABSTRACT_NAMES:
            self._prefix = f"ipc://@{tag}"
        else:
            self._dir = tempfile.mkdtemp(prefix=_DIR_PREFIX)
            self._prefix = f"ipc://{self._dir}/w"

    def __call__(self, name):
        return f"{self._prefix}-{name}"

    def remove(self):
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def remove_orphaned_endpoints(endpoint):
    """Remove the directory of a consumer's endpoint files (not Linux: see :class:`Endpoints`),
    called by a worker that found its consumer gone: a consumer killed by SIGKILL could not."""
    if endpoint.startswith("ipc://") and not endpoint.startswith("ipc://@"):
        directory = os.path.dirname(endpoint[len("ipc://"):])
        if os.path.basename(directory).startswith(_DIR_PREFIX):
            shutil.rmtree(directory, ignore_errors=True)


_batch_threads = None


def _can_run_threads_as_batch():
    """Whether a thread may switch itself to ``SCHED_BATCH`` here (Linux; not every sandbox
    allows it). Probed once, in a throwaway thread: libzmq aborts if it cannot apply a policy."""
    global _batch_threads
    if _batch_threads is None:
        _batch_threads = False
        if hasattr(os, "SCHED_BATCH") and hasattr(zmq, "THREAD_SCHED_POLICY"):
            def probe():
                global _batch_threads
                try:
                    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
                    _batch_threads = True
                except OSError:
                    pass
            t = threading.Thread(target=probe, name="dataflow-sched-probe")
            t.start()
            t.join()
    return _batch_threads


def make_context(batch=True):
    """A ZeroMQ context with one I/O thread, which runs as ``SCHED_BATCH`` where possible (with
    ``batch``; the thread starts with the first socket).

    The consumer's contexts are batch: every message sent wakes the I/O thread, and at normal
    priority the kernel switches to a thread it wakes at once, so on a machine whose cores are
    all busy with workers each send cost the consumer a context switch and a wait for a core (a
    fifth of its time on workload 2); as a batch thread it runs when a core comes free instead
    (figures in docs/measurements.md).
    A worker's is not: its main thread runs at a lower priority than the I/O thread (see
    ``worker._worker_main``), which should preempt it to send a result at once."""
    context = zmq.Context(1)
    if batch and _can_run_threads_as_batch():
        context.set(zmq.THREAD_SCHED_POLICY, os.SCHED_BATCH)
    return context


def make_socket(context):
    """A DEALER socket that never drops or blocks on a full queue and closes at once."""
    s = context.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 0)
    s.setsockopt(zmq.RCVHWM, 0)
    s.setsockopt(zmq.RECONNECT_IVL, 5)
    return s


class MalformedMessage(ValueError):
    """A message that is not what the protocol says; the receiver logs and drops it.

    ``seqs``: for a results message whose envelope was read but whose datapoints could not be
    loaded (their pickled part needs a module the consumer cannot import, say), the datapoints
    it carried, which the receiver reports as failed instead of waiting for them forever."""

    def __init__(self, message, seqs=()):
        super().__init__(message)
        self.seqs = list(seqs)


class UnloadableTask(MalformedMessage):
    """A task whose envelope a worker read but whose datapoints it cannot load: an object the
    consumer pickled and the worker cannot unpickle (a class of a module only the consumer has,
    a ``__reduce__`` that fails there). The worker answers each datapoint with this error
    (:meth:`results`), fatal, instead of dropping the task, which the consumer would have
    waited for forever; ``released`` are the segments the message handed back all the same."""

    def __init__(self, pairs, released, error):
        super().__init__(f"a task of datapoints {[i for _, i in pairs]} that cannot be loaded "
                         f"in the worker: {type(error).__name__}: {error}", [s for s, _ in pairs])
        self.indices = {seq: index for seq, index in pairs}
        self.released = released
        self.error = error

    def results(self):
        """``(seq, ERR, WorkerError)`` for each datapoint of the task."""
        err = WorkerError.from_exception(self.error, "")
        return [(seq, ERR, WorkerError(
            err.exc, err.tb, f"worker process {os.getpid()}, loading datapoint #{index} of the "
            f"source as the consumer sent it (the worker cannot unpickle what it holds)",
            fatal=True)) for seq, index in self.indices.items()]


_ZAP_ENDPOINT = "inproc://zeromq.zap.01"      # where libzmq asks a context's ZAP handler
_USERNAME = b"dataflow"


def make_secret():
    """A fresh random secret for the endpoints of one executor."""
    return secrets.token_hex(32).encode()


def bind_private(sock, endpoint):
    """Make ``sock`` a PLAIN server (each peer is checked by the context's :class:`Gatekeeper`)
    and bind it to ``endpoint``."""
    sock.plain_server = True
    sock.zap_domain = b"dataflow"
    sock.bind(endpoint)


def connect_private(sock, endpoint, secret):
    """Connect ``sock`` to a consumer's private endpoint, proving it knows ``secret``. It never
    reconnects: the consumer holds the name for as long as this worker may live, so a lost
    connection means the consumer is gone, and a new holder of the name is not to be trusted."""
    sock.plain_username = _USERNAME
    sock.plain_password = secret
    sock.setsockopt(zmq.RECONNECT_IVL, -1)
    sock.connect(endpoint)


class Gatekeeper:
    """The ZAP handler of one consumer context: admits a PLAIN peer that presents ``secret``,
    refuses (and logs) any other. Answered from the consumer's own poll loop (:meth:`serve` when
    :attr:`socket` is readable): no thread, one request per connection."""

    def __init__(self, context, secret):
        self._secret = secret
        self.refused = 0
        self.socket = context.socket(zmq.REP)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(_ZAP_ENDPOINT)

    def serve(self):
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            ok = (len(frames) == 8 and frames[0] == b"1.0" and frames[5] == b"PLAIN"
                  and frames[6] == _USERNAME and hmac.compare_digest(frames[7], self._secret))
            if not ok:
                self.refused += 1
                if self.refused <= 3:       # a peer that retries is not worth a flood of lines
                    logger.warning("refused a connection to a worker endpoint from a peer that "
                                   "does not know the pipeline's secret (address %r)%s",
                                   frames[3] if len(frames) > 3 else b"?",
                                   "; further refusals are not logged" if self.refused == 3
                                   else "")
            request_id = frames[1] if len(frames) > 1 else b""
            self.socket.send_multipart([b"1.0", request_id, b"200" if ok else b"400",
                                        b"OK" if ok else b"refused", b"", b""])

    def close(self):
        self.socket.close(linger=0)


def _pack(obj):
    return msgpack.packb(obj, use_bin_type=True)


HELLO_FRAME = msgpack.packb([HELLO])


def _unpack(frame):
    return msgpack.unpackb(frame, raw=False)


def encode_task(run, items, released):
    """Frames of a task message. Raises ``TypeError`` naming the datapoint that cannot be sent."""
    frames, to_pickle = [], []
    try:
        header = serialize.dumps_oob([list(it) for it in items], frames, INLINE_LIMIT,
                                     allow_pickle=True, to_pickle=to_pickle)
        pickled = serialize.pickle_objects(to_pickle, frames, INLINE_LIMIT) if to_pickle else None
    except TypeError:
        for _, index, dp in items:      # find the culprit for a clear message
            try:
                serialize.dumps_oob(dp, [], INLINE_LIMIT, allow_pickle=True)
            except TypeError as e:
                raise TypeError(f"datapoint #{index} of the source cannot be sent to a worker "
                                f"process: {e}") from None
        raise
    # the datapoints' numbers also travel outside what may fail to load (UnloadableTask)
    pairs = [[seq, index] for seq, index, _ in items]
    return [_pack([TASK, released, run, header, pickled, pairs])] + frames


def encode_release(released):
    """The frame that hands segments back to a worker without a task."""
    return _pack([RELEASE, released])


def decode_task(frames):
    """``(kind, released, run, items)`` from the frames of a consumer message;
    :class:`MalformedMessage` for anything else."""
    try:
        msg = _unpack(frames[0])
        if msg[0] == RELEASE:
            return RELEASE, list(msg[1]), None, None
        if msg[0] == STOP:
            return STOP, [], None, None
        if msg[0] != TASK:
            raise ValueError(f"unknown message kind {msg[0]!r}")
        buffers = [bytearray(f) for f in frames[1:]]    # writable inputs, as in a thread
        try:
            items = serialize.loads_oob(msg[3], buffers, allow_pickle=True, pickled=msg[4])
        except Exception as e:
            # the unpickling error itself, not serialize's ValueError around it
            cause = e.__cause__ if isinstance(e, ValueError) and e.__cause__ is not None else e
            raise UnloadableTask([tuple(p) for p in msg[5]], list(msg[1]), cause) from None
        return TASK, list(msg[1]), msg[2], items
    except UnloadableTask:
        raise
    except Exception as e:
        raise MalformedMessage(f"malformed message from the consumer: {type(e).__name__}: {e}") \
            from None


def pickle_error(err):
    """A WorkerError as bytes; its exception is rebuilt with its own class, args and attributes
    (see :func:`~.protocol.pack_exception`)."""
    return pickle.dumps((pack_exception(err.exc), err.tb, err.where, err.fatal))


def unpickle_error(data):
    exc, tb, where, fatal = pickle.loads(data)
    return WorkerError(unpack_exception(exc), tb, where, fatal)


class _Message:
    """One results message being encoded: its results, their out-of-band buffers and the objects
    they hand to pickle, and the values behind them (kept until the message is finished, should
    those objects not pickle)."""

    def __init__(self):
        self.out, self.buffers, self.to_pickle, self.values, self.nbytes = [], [], [], {}, 0


def _encode_value(seq, value, buffers, to_pickle, index, func_desc):
    """The result ``[seq, OK, header]``, or a fatal ``TypeError`` result naming datapoint
    ``index`` when ``value`` cannot be sent (nothing is then appended)."""
    try:
        return [seq, OK, serialize.dumps_oob(value, buffers, INLINE_LIMIT, allow_pickle=True,
                                             to_pickle=to_pickle)]
    except (TypeError, ValueError, RecursionError) as e:   # (msgpack: ValueError if too deep)
        exc = TypeError(f"{func_desc} returned datapoint #{index} that cannot be sent to the "
                        f"consumer: {type(e).__name__}: {e}")
        return [seq, ERR, pickle_error(WorkerError(exc, f"TypeError: {exc}\n",
                                                   f"datapoint #{index}", fatal=True))]


def _finish(m, indices, func_desc):
    """``(results, buffers, pickled)`` of a message: its objects to pickle in one pickle; when
    that fails, its datapoints encoded again with their objects pickled one by one, so that the
    one at fault becomes the error that names it."""
    pickled = None
    if m.to_pickle:
        try:
            pickled = serialize.pickle_objects(m.to_pickle, m.buffers, INLINE_LIMIT)
        except (TypeError, RecursionError):
            m.buffers.clear()
            m.out = [_encode_value(r[0], m.values[r[0]], m.buffers, None, indices[r[0]],
                                   func_desc) if r[1] == OK else r for r in m.out]
    m.values = m.to_pickle = None
    return m.out, m.buffers, pickled


def encode_results(results, indices, busy, pool, func_desc):
    """The frames of the results messages for one chunk; arrays go into ``pool`` (a
    :class:`~.shm.SegmentPool`). A datapoint whose arrays would take a message past
    ``MESSAGE_BYTES`` starts the next message, so that segments stay small enough to stay in
    cache and be reused soon. ``busy`` (the seconds the map took) and the time spent encoding are
    shared out by datapoint.

    ``results`` (a list) is emptied as it is encoded: once this function holds the only
    references to the arrays, those that were made in shared memory can be sent where they are
    (:meth:`~.shm.SegmentPool.place`). A datapoint that cannot be serialised becomes a fatal
    ``TypeError`` naming it."""
    t0 = time.perf_counter()
    messages = []                  # (results of the message, its out-of-band buffers, pickled)
    m = _Message()
    results.reverse()
    while results:
        seq, kind, value = results.pop()
        if kind == OK:
            n, p = len(m.buffers), len(m.to_pickle)
            item = _encode_value(seq, value, m.buffers, m.to_pickle, indices[seq], func_desc)
            size = sum(b.nbytes for b in m.buffers[n:])
            if n and m.nbytes + size > MESSAGE_BYTES:
                del m.buffers[n:], m.to_pickle[p:]  # encode it again as the next message's first
                messages.append(_finish(m, indices, func_desc))
                m = _Message()
                item = _encode_value(seq, value, m.buffers, m.to_pickle, indices[seq], func_desc)
            m.nbytes += size
            m.values[seq] = value
        else:
            item = [seq, kind, pickle_error(value) if kind == ERR else None]
        m.out.append(item)
        value = None
    if m.out:
        messages.append(_finish(m, indices, func_desc))
    del m
    placed = pool.place([b for _, b, _ in messages]) if any(b for _, b, _ in messages) else None
    frames = []
    total = sum(len(out) for out, _, _ in messages)
    per_item = (busy + time.perf_counter() - t0) / max(1, total)
    for i, (out, _, pickled) in enumerate(messages):
        new, pool.new = pool.new, []
        descs = placed[i] if placed else []
        frames.append(_pack([RESULTS, per_item * len(out), new, descs, out, pickled]))
    return frames


def encode_failure(err):
    """The frame a worker sends when it cannot go on (its map function could not be loaded)."""
    return _pack([FAILED, pickle_error(err)])


def decode_results(frame, reader):
    """``(results, busy)`` from a results frame; arrays are views of shared memory that
    ``reader`` (a :class:`~.shm.SegmentReader`) maps. A failure report is raised;
    :class:`MalformedMessage` for a frame that is not a message."""
    seqs = ()
    try:
        msg = _unpack(frame)
        if msg[0] == FAILED:
            err = unpickle_error(msg[1])
        else:
            _, busy, new, descs, out, pickled = msg
            if new:
                reader.add(new)
            seqs = [item[0] for item in out]
            load = serialize.loader_oob(reader.buffers(descs) if descs else [], allow_pickle=True,
                                        pickled=pickled)
            results = []
            for seq, kind, payload in out:
                if kind == OK:
                    payload = load(payload)
                elif kind == ERR:
                    payload = unpickle_error(payload)
                results.append((seq, kind, payload))
            return results, busy
    except (MemoryError, OSError):          # shared memory refused: not the message's fault
        raise
    except Exception as e:
        cause = e.__cause__ if isinstance(e, ValueError) and e.__cause__ is not None else e
        raise MalformedMessage(f"malformed message from a worker: {type(e).__name__}: {e}",
                               seqs) from cause
    raise err.to_exception()
