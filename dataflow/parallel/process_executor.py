"""The consumer's side of worker processes: :class:`ProcessExecutor`.

It runs :func:`~.protocol.run_chunk` in ``num_workers`` processes behind the
:class:`~.protocol.Executor` contract. Tasks and small results travel as msgpack messages over
ZeroMQ (:mod:`.transport`); arrays of results travel through reused shared memory (:mod:`.shm`).
Worker deaths are noticed at once (:mod:`.supervisor`). The workers run :mod:`.worker`; how they
are started is :mod:`.start`.
"""
import collections
import itertools
import logging
import multiprocessing as mp
import os
import select
import signal
import socket
import sys
import threading
import time
import warnings

import zmq

from .. import config, rng
from .._helpers import add_note, check_int
from .protocol import CLOSED_WHILE_ITERATING, ERR, PROCESS, Executor, WorkerError
from .shm import SegmentReader
from . import cvthreads, resources, transport
from .start import (_Shipped, _get_context, _live_executors, _sigint_held, _without_main_module,
                    default_start_method, ensure_fork_server)
from .supervisor import WorkerCrashedError, describe_exit, next_wait
from .worker import _worker_main

__all__ = ["ProcessExecutor", "SHM_BUDGET"]

logger = logging.getLogger("dataflow")


# After a worker's death, how long to wait for a last message it sent (milliseconds).
_LAST_WORDS_MS = 100


# Each worker runs ahead of the consumer only while the shared memory of its results (held on the
# consumer side, or to come) stays under this budget, so the pool stays small and is reused
# instead of growing to buffer_size results of any size. Workers still run ahead whenever the
# consumer would otherwise wait.
SHM_BUDGET = 16 << 20


# close(): how long terminated workers get to exit before they are killed.
_TERMINATE_GRACE = 0.05


def _discard_started(p):
    """End and reap a worker process whose start succeeded but whose executor will not take it
    (a KeyboardInterrupt raised once the start was over, see ``start._sigint_held``), so that
    neither it nor its pipes outlive the failed start."""
    try:
        p.kill()
        p.join(5)
        p.close()
    except (OSError, ValueError):     # gone already, or not reaped within 5 s: left to mp
        pass


class _Worker:
    """The consumer's handle on one worker process (one incarnation of worker slot ``wid``)."""

    def __init__(self, wid, key, process, sock, fd_sock, stack_sock, reader):
        self.wid, self.key = wid, key
        self.process = process
        self.sock = sock
        self.fd_sock = fd_sock
        self.stack_sock = stack_sock
        self.reader = reader
        self.outstanding = {}       # seq -> (run, index, datapoint), kept for a restart
        self.released = []          # segment ids to hand back with the next task
        self.busy_since = None      # when its current work last made progress
        self.next_warning = None    # when to report it as hung (again)
        self.busy_s = 0.0           # seconds in the map function, as it reports them
        self.shm_bytes = 0          # shared memory its results brought
        self.started = time.monotonic()
        self.ended = None
        self.retiring = False       # autotuning: no new work; stop once its work is back
        self.stopping = False       # told to stop: its exit is not a crash
        self.ready = False          # its HELLO arrived: messages go out at once
        self.pending = []           # (frames, copy) to send once it is ready

    def expected_bytes(self, per_item):
        """Shared memory its results take: held by the consumer, and to come."""
        return self.reader.held_bytes + len(self.outstanding) * per_item

    def held(self):
        return sorted(index for _, index, _ in self.outstanding.values())

    @property
    def starting(self):
        """Its HELLO has not arrived: the work sent to it waits for its start-up to end."""
        return not self.ready

    def describe(self):
        if not self.ready:
            return (f"datapoints {self.describe_held()} have waited for worker process "
                    f"{self.process.pid}, which has not finished starting,")
        return f"datapoints {self.describe_held()} have been in worker process {self.process.pid}"

    def describe_held(self):
        held = self.held()
        return ", ".join(f"#{i}" for i in held[:20]) + (" ..." if len(held) > 20 else "")


class ProcessExecutor(Executor):
    """``num_workers`` processes, each running ``make_func(worker_id)`` once and then the map
    function it returns on every chunk sent to it.

    Flow: chunks wait in the consumer until a worker is free to take them: the least busy
    worker whose results in shared memory (held by the consumer, or expected from the work it
    holds) stay under ``shm_budget`` bytes. So large results do not pile up ``buffer_size`` deep
    in fresh shared memory; the pool stays small and hot. When no worker is under the budget and
    none has work, one gets work anyway: the user holds the results, and the pool grows.

    Supervision: a worker that dies is reported at once as :class:`WorkerCrashedError`, or, while
    fewer than ``max_restarts`` restarts happened, replaced by a new process that receives the
    datapoints the dead one held (each result still arrives exactly once). A worker that holds a
    datapoint for longer than ``dataflow.config.hang_timeout()`` is reported through the
    ``dataflow`` logger with its current Python stack, again at every such interval.
    """
    kind = PROCESS

    def __init__(self, num_workers, make_func, start_method=None, max_restarts=0,
                 shm_budget=None, name="dataflow-worker"):
        shm_budget = SHM_BUDGET if shm_budget is None else shm_budget
        method = start_method or default_start_method()
        self._method_given = start_method is not None
        if method not in mp.get_all_start_methods():
            raise ValueError(f"start_method must be one of {mp.get_all_start_methods()}, "
                             f"got {start_method!r}")
        check_int("max_restarts", max_restarts, 0)
        # What the OS may refuse is checked before anything starts (clear message, no leftovers).
        resources.check_file_descriptors(num_workers)
        resources.check_temp_dir(method)
        self.start_method = method
        self.max_restarts = max_restarts
        self.restarts = 0
        self.shm_budget = shm_budget
        self._name = name
        self._closed = False
        self._owner_pid = os.getpid()
        self._busy = threading.RLock()      # held by get(); close() waits for it
        self._context = transport.make_context()
        self._endpoints = transport.Endpoints()
        self._secret = transport.make_secret()
        self._gate = transport.Gatekeeper(self._context, self._secret)
        self._released = collections.deque()
        self._batches = collections.deque()
        self._backlog = collections.deque()     # chunks not yet sent: (run, items)
        self._bytes_per_item = None             # moving average of a result's shared memory
        self._poller = zmq.Poller()
        self._poller.register(self._gate.socket, zmq.POLLIN)
        self._workers = []
        self._gone = []                         # workers retired by the autotuner (statistics)
        self.shm_bytes = 0                      # shared memory received from workers, in all
        self._by_sentinel = {}
        self._by_key = {}
        self._incarnations = itertools.count()
        _live_executors.add(self)
        try:
            self._mp = _get_context(method)
            self._shipped = _Shipped(make_func)
            self._workers = [None] * num_workers
            self._cv_threads = cvthreads.threads_for(num_workers)
            for wid in range(num_workers):
                self._workers[wid] = self._spawn(wid)
        except BaseException:
            self.close()
            raise

    def _pdeathsig_safe(self):
        """Whether a worker started now may ask the kernel to kill it with its parent thread
        (PR_SET_PDEATHSIG follows the thread that forked): only when that thread lives as long
        as the consumer, the main thread or the fork server's. Otherwise the worker watches for
        its consumer's death in a thread of its own."""
        return self.start_method == "forkserver" or \
            threading.current_thread() is threading.main_thread()

    def _spawn(self, wid):
        key = next(self._incarnations)
        made = []
        try:
            mine, theirs = socket.socketpair()
            made += [mine, theirs]
            stack_mine, stack_theirs = socket.socketpair()
            made += [stack_mine, stack_theirs]
            sock = transport.make_socket(self._context)
        except (OSError, zmq.ZMQError) as e:
            for s in made:
                s.close()
            explained = resources.explain_start_failure(e, wid, len(self._workers))
            if explained is not None:
                raise explained from e
            raise
        endpoint = self._endpoints(key)
        forking = self.start_method == "fork"
        p = None
        try:
            if self.start_method == "forkserver":
                ensure_fork_server()            # before _sigint_held blocks SIGINT
            # forked: OpenCV's pool threads stopped first, or the child may inherit their locks
            with cvthreads.stopped_for_fork(forking) as cv_settable, \
                    _without_main_module(self.start_method), _sigint_held(self.start_method), \
                    warnings.catch_warnings():
                p = self._mp.Process(
                    target=_worker_main, name=f"{self._name}-{wid}",
                    args=(wid, endpoint, self._secret, theirs, stack_theirs, self._shipped,
                          rng.get_seed(), os.getpid(), self._pdeathsig_safe(),
                          self.start_method != "forkserver",
                          config.worker_nice(), self._cv_threads, not cv_settable,
                          forking and "torch" in sys.modules))
                # Python >= 3.12 warns on fork while any OS thread runs; we only fork with no
                # other Python thread (but pyzmq's garbage collector, see
                # default_start_method), and C-level threads (BLAS pools, ZeroMQ's I/O
                # thread) are fork-aware (OpenCV's pool is stopped, above).
                warnings.filterwarnings("ignore", category=DeprecationWarning,
                                        message=".*fork.*")
                transport.bind_private(sock, endpoint)    # before the worker connects
                p.start()
        except BaseException as e:
            for s in (mine, stack_mine):
                s.close()
            sock.close(linger=0)
            if p is not None and p.pid is not None:
                _discard_started(p)    # a Ctrl-C held back until its start was over
            explained = resources.explain_start_failure(e, wid, len(self._workers))
            if explained is not None:
                raise explained from e
            if isinstance(e, TypeError) and "cannot be sent to worker processes" in str(e):
                add_note(e, self._why_pickled())
            raise
        finally:
            theirs.close()
            stack_theirs.close()
        w = _Worker(wid, key, p, sock, mine, stack_mine, SegmentReader(key, mine, self._released))
        self._by_sentinel[p.sentinel] = w
        self._by_key[key] = w
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(p.sentinel, zmq.POLLIN)
        return w

    def _why_pickled(self):
        """A note for an object that does not pickle: why it had to, and the ways out."""
        why = f"start_method={self.start_method!r} starts workers as new processes, so what they "\
              f"run is pickled (with fork it is inherited)"
        if not self._method_given and mp.get_all_start_methods()[0] == "fork":   # (Linux)
            why += "; it was chosen because other threads run in this process (Python threads, " \
                   "or OpenCV's on TBB or OpenMP), which makes fork unsafe"
        return (f"({why}. Make the function and the dataflow picklable: no locks, sockets, open "
                f"files or generator objects in what they refer to, e.g. create them inside the "
                f"function; or pass start_method='fork' if forking this process is safe.)")

    @property
    def pids(self):
        return [w.process.pid for w in self._workers if w is not None]

    # -- resizing (autotuning) ------------------------------------------------------------------
    @property
    def num_workers(self):
        """Workers that take new work (retiring ones excluded)."""
        return sum(1 for w in self._workers if w is not None and not w.retiring)

    def add_worker(self):
        """One more worker: a retiring one that has not stopped yet is kept instead."""
        for w in self._workers:
            if w.retiring and not w.stopping:
                w.retiring = False
                return
        used = {w.wid for w in self._workers}
        wid = next(i for i in itertools.count() if i not in used)
        self._workers.append(self._spawn(wid))
        self._dispatch()

    def retire_worker(self):
        """One worker fewer: the least busy one gets no new work and is stopped once the results
        of the work it holds are back (so nothing is lost or done twice). At least one stays."""
        active = [w for w in self._workers if not w.retiring]
        if len(active) <= 1:
            return
        w = min(reversed(active), key=lambda w: len(w.outstanding))
        w.retiring = True
        if not w.outstanding:
            self._stop_worker(w)

    def _stop_worker(self, w):
        w.stopping = True
        self._post(w, [transport._pack([transport.STOP])])

    @staticmethod
    def _post(w, frames, copy=True):
        """Send to a worker, or queue until its HELLO comes (a bound socket without its peer
        would block). A send that would block later means the worker has died: its exit is
        handled (its datapoints are in ``outstanding``)."""
        if not w.ready:
            w.pending.append((frames, copy))
            return
        try:
            if len(frames) == 1:
                w.sock.send(frames[0], zmq.NOBLOCK)
            else:
                w.sock.send_multipart(frames, zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            pass

    def _forget(self, w):
        """A worker told to stop has exited: drop it from the pool."""
        w.process.join()
        w.ended = time.monotonic()
        self._gone.append(w)
        del self._gone[:-64]
        self._workers.remove(w)
        self._retire(w)

    def worker_stats(self):
        """Per worker process (and the last ones retired): its slot, seconds busy, shared memory
        received, the size of its segment pool, when it started and stopped."""
        out = []
        for w in list(self._workers) + list(self._gone):
            state = "retired" if w.ended is not None else "retiring" if w.retiring else "running"
            out.append({"key": w.key, "id": w.wid, "busy_s": w.busy_s, "started": w.started,
                        "ended": w.ended, "state": state, "shm_bytes": w.shm_bytes,
                        "pool_bytes": w.reader.pool_bytes})
        return out

    def submit(self, run, items):
        self._backlog.append((run, items))
        self._dispatch()

    def _collect_releases(self):
        """Route the segments the user let go of to the workers that own them."""
        while self._released:
            key, sid = self._released.popleft()
            owner = self._by_key.get(key)
            if owner is not None:
                owner.released.append(sid)
                owner.reader.released(sid)

    def _dispatch(self):
        """Send waiting chunks to the least busy workers whose results in shared memory are
        under the budget. When every worker is over it and none has work, send anyway: the user
        holds the results, so the pool must grow rather than the pipeline stall."""
        self._collect_releases()
        while self._backlog:
            per_item = self._bytes_per_item or 0
            ready = [w for w in self._workers
                     if not w.retiring and w.expected_bytes(per_item) < self.shm_budget]
            if not ready:
                if any(w.outstanding for w in self._workers):
                    return
                ready = [w for w in self._workers if not w.retiring]
            w = min(ready, key=lambda w: len(w.outstanding))
            self._send(w, *self._backlog.popleft())
        for w in self._workers:       # segments that no task took back: hand them back now
            if w.released and not w.stopping:
                self._post(w, [transport.encode_release(w.released)])
                w.released = []

    def _send(self, w, run, items):
        frames = transport.encode_task(run, items, w.released)
        w.released = []
        if not w.outstanding:
            w.busy_since, w.next_warning = time.monotonic(), None
        for seq, index, dp in items:
            w.outstanding[seq] = (run, index, dp)
        # large arrays travel as frames of their own: let ZeroMQ send them without a copy
        self._post(w, frames, copy=len(frames) == 1)

    def get(self, timeout=None):
        with self._busy:
            while True:
                if not self._closed:
                    self._dispatch()
                if self._batches:
                    return self._batches.popleft()
                if self._closed:
                    raise RuntimeError(CLOSED_WHILE_ITERATING)
                self._wait(timeout)

    def _wait(self, timeout):
        """Wait for messages, worker deaths or the next deadline, and handle them."""
        events = self._poller.poll(self._check_time(timeout))
        ready = {s for s, _ in events}
        if self._gate.socket in ready:
            self._gate.serve()
        for w in self._workers:
            if w.sock in ready:
                self._drain(w)
        for fd in ready:
            w = self._by_sentinel.get(fd)
            if w is not None and not self._closed:
                self._drain(w)
                if w.stopping and not w.outstanding:
                    self._forget(w)         # retired by the autotuner
                else:
                    self._died(w)

    def _check_time(self, timeout):
        """Apply the deadlines; milliseconds to wait (see ``supervisor.next_wait``)."""
        wait = next_wait(self._workers, timeout, config.current_hang_timeout(), self._warn_hung,
                         self._stack_of)
        return int(wait * 1000) + 1

    def _warn_hung(self, w, waited):
        logger.warning("%s for %.1f s (hang_timeout=%s s); its Python stack:\n%s", w.describe(),
                       waited, config.current_hang_timeout(), self._stack_of(w))

    def _stack_of(self, w):
        """Ask a worker for its stack (faulthandler on SIGUSR1) and read it, waiting 1 s at most."""
        if not hasattr(signal, "SIGUSR1"):
            return "(not available on this platform)"
        if not w.ready:     # its handler is not installed yet: the signal would kill it
            return "(it has not finished starting: no stack to show)"
        try:
            os.kill(w.process.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return "(the worker is gone)"
        # faulthandler writes line by line: wait up to 1 s for the first bytes, then read
        # until the worker has been quiet for a moment.
        chunks, wait = [], 1.0
        while True:
            r, _, _ = select.select([w.stack_sock], [], [], wait)
            if not r:
                break
            data = w.stack_sock.recv(65536)
            if not data:
                break
            chunks.append(data)
            wait = 0.05
        return b"".join(chunks).decode(errors="replace") or "(no answer)"

    def _drain(self, w):
        while True:
            try:
                frame = w.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if frame == transport.HELLO_FRAME:
                w.ready = True
                for frames, copy in w.pending:
                    self._post(w, frames, copy)
                w.pending = []
                if w.outstanding:       # its work starts now: so does the clock of its deadlines
                    w.busy_since, w.next_warning = time.monotonic(), None
                continue
            before = w.reader.held_bytes
            try:
                results, busy = transport.decode_results(frame, w.reader)
            except transport.MalformedMessage as e:
                if not e.seqs:
                    logger.warning("dropped a message from worker process %d: %s",
                                   w.process.pid, e)
                    continue
                results, busy = _unloadable(e, w.outstanding), 0.0
            w.busy_s += busy
            moved = w.reader.held_bytes - before
            w.shm_bytes += moved
            self.shm_bytes += moved
            if results:
                per_item = (w.reader.held_bytes - before) / len(results)
                self._bytes_per_item = per_item if self._bytes_per_item is None else \
                    0.8 * self._bytes_per_item + 0.2 * per_item
            for seq, _, _ in results:
                w.outstanding.pop(seq, None)
            w.busy_since = time.monotonic() if w.outstanding else None
            w.next_warning = None
            self._batches.append((results, busy))
            if w.retiring and not w.outstanding and not w.stopping:
                self._stop_worker(w)

    def _died(self, w):
        """A worker's process ended: replace it, or report it."""
        w.process.join()
        # A worker that reported a failure exits normally, and may be seen dead before its
        # report is read: give the report a moment to arrive, so the user sees the real error.
        if w.process.exitcode == 0 and w.sock.poll(_LAST_WORDS_MS):
            self._drain(w)
        how = describe_exit(w.process.exitcode)
        held = w.held()
        message = (f"worker process {w.process.pid} (worker {w.wid}) {how}"
                   + (f" while holding datapoints {w.describe_held()}" if held else ""))
        if self.restarts >= self.max_restarts:
            if self.max_restarts:
                message += f"; max_restarts={self.max_restarts} restarts already used"
            raise WorkerCrashedError(message, pid=w.process.pid, exitcode=w.process.exitcode,
                                     datapoints=held)
        self.restarts += 1
        logger.warning("%s; starting a new worker (restart %d of %d)", message, self.restarts,
                       self.max_restarts)
        self._retire(w)
        new = self._workers[self._workers.index(w)] = self._spawn(w.wid)
        by_run = collections.defaultdict(list)
        for seq, (run, index, dp) in w.outstanding.items():
            by_run[run].append((seq, index, dp))
        for run, items in by_run.items():
            self._send(new, run, items)

    def _retire(self, w):
        """Forget a dead worker; arrays of its segments that the user holds stay valid."""
        self._poller.unregister(w.sock)
        self._poller.unregister(w.process.sentinel)
        del self._by_sentinel[w.process.sentinel]
        del self._by_key[w.key]
        self._close_handles(w)
        _close_process(w.process)

    @staticmethod
    def _close_handles(w):
        w.sock.close(linger=0)
        w.fd_sock.close()
        w.stack_sock.close()
        w.reader.close()

    def close(self):
        if self._closed:
            return
        self._closed = True
        _live_executors.discard(self)
        if os.getpid() != self._owner_pid:
            return      # a copy inherited by a forked child: the workers are not ours
        # Workers go first: their deaths wake a get() blocked in another thread, which then
        # leaves, so the sockets can be closed safely (ZeroMQ sockets are not thread-safe).
        procs = [w.process for w in self._workers if w is not None]
        for p in procs:
            if p.exitcode is None:
                p.terminate()
        deadline = time.monotonic() + _TERMINATE_GRACE
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.exitcode is None:
                p.kill()
                p.join()
            _close_process(p)
        with self._busy:
            for w in self._workers:
                if w is not None:
                    self._close_handles(w)
            self._gate.close()
            self._context.term()
            self._endpoints.remove()


def _close_process(p):
    """``p.close()`` for a worker process that has been joined: its handles are released.

    On CPython 3.10 the handles are released but ``p._popen`` is left set: ``Process.close()``
    sets it to ``None``, and 3.10's ``multiprocessing.process._cleanup()`` (run by every
    ``Process.start()``) polls ``p._popen`` of every child it listed without checking it. An
    executor collected by the garbage collector while another one starts its workers closes its
    processes in the middle of that loop, and the start failed with ``AttributeError: 'NoneType'
    object has no attribute 'poll'``. The next ``_cleanup()`` drops the joined process from
    ``multiprocessing``'s list (its ``poll()`` returns the stored exit code)."""
    if sys.version_info >= (3, 11):
        p.close()
    elif p._popen is not None:
        p._popen.close()


def _unloadable(err, outstanding):
    """The datapoints of a results message that could not be loaded here (``err``, a
    :class:`~.transport.MalformedMessage` with their seqs), each as a fatal ``TypeError`` naming
    it: what a result that cannot be sent between processes gets, rather than a wait forever."""
    cause = err.__cause__ if err.__cause__ is not None else err
    out = []
    for seq in err.seqs:
        index = outstanding.get(seq, (None, "?"))[1]
        exc = TypeError(f"the result of datapoint #{index} (or of another datapoint sent with "
                        f"it) could not be loaded in the consuming process: "
                        f"{type(cause).__name__}: {cause}. What a map function returns must "
                        f"be loadable here too (its classes importable in this process)")
        out.append((seq, ERR, WorkerError(exc, f"TypeError: {exc}\n", f"datapoint #{index}",
                                          fatal=True)))
    return out
