"""Map work in worker processes: for Python functions that hold the GIL.

:class:`ProcessExecutor` runs :func:`~.mapper.run_chunk` in ``num_workers`` processes behind the
:class:`~.mapper.Executor` contract. Tasks and small results travel as msgpack messages over
ZeroMQ (:mod:`.transport`); arrays of results travel through reused shared memory (:mod:`.shm`).
Worker deaths are noticed at once (:mod:`.supervisor`).

Start methods: ``"forkserver"`` is the default where it exists (Linux, macOS), ``"spawn"``
elsewhere. Unlike ``"fork"`` it never copies a parent that already runs threads (ours, a
library's, a ``MultiThreadMapData`` upstream), which can deadlock the child. ``"fork"`` is
supported when asked for. Functions and dataflows are shipped with cloudpickle, so lambdas and
closures work with every start method; with ``"fork"`` they are inherited without pickling.
"""
import atexit
import collections
import contextlib
import ctypes
import faulthandler
import itertools
import logging
import multiprocessing as mp
import multiprocessing.forkserver as mp_forkserver
import multiprocessing.spawn as mp_spawn
import os
import pickle
import re
import select
import signal
import socket
import sys
import threading
import time
import warnings
import weakref

import zmq

from .. import config, rng
from .mapper import CLOSED_WHILE_ITERATING, ParallelMapData, WorkerError, func_name, run_chunk
from .allocator import ZeroCopySwitch
from .shm import SegmentPool, SegmentReader
from . import cvthreads, shm, transport
from .supervisor import (WorkerCrashedError, check_workers, describe_exit, die_with_parent,
                         process_alive)
from .policy import choose_executor, describe_choice
from .threads import (Constant, CopiesRunner, available_cpus, dataflow_length,
                      make_executor)

__all__ = ["ProcessExecutor", "MultiProcessMapData", "MultiProcessMapDataZMQ",
           "MultiProcessRunner", "MultiProcessRunnerZMQ", "MultiProcessMapAndBatchData",
           "MultiProcessMapAndBatchDataZMQ", "default_start_method"]

logger = logging.getLogger("dataflow")

# How often an idle worker checks that its consumer still exists (seconds).
_LIVENESS_INTERVAL = 0.25
# After a worker's death, how long to wait for a last message it sent (milliseconds).
_LAST_WORDS_MS = 100
# Each worker runs ahead of the consumer only while the shared memory of its results (held on the
# consumer side, or to come) stays under this budget, so the pool stays small and is reused
# instead of growing to buffer_size results of any size. Workers still run ahead whenever the
# consumer would otherwise wait.
SHM_BUDGET = 16 << 20
# close(): how long terminated workers get to exit before they are killed.
_TERMINATE_GRACE = 0.05


def default_start_method():
    """The start method used when none is given.

    ``"fork"`` while no other Python thread runs in this process: then nothing can hold a lock
    that the child would inherit locked, and workers start in milliseconds and inherit
    everything, as with tensorpack. Once another thread runs (ours, a library's, a
    ``MultiThreadMapData`` upstream), ``"forkserver"``, whose server is a clean single-threaded
    process, so nothing can deadlock; ``"spawn"`` where neither exists.
    """
    methods = mp.get_all_start_methods()
    if "fork" in methods and threading.active_count() == 1:
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def _checked_start_method(method):
    if method is not None and method not in mp.get_all_start_methods():
        raise ValueError(f"start_method must be None or one of {mp.get_all_start_methods()}, "
                         f"got {method!r}")
    return method


class _Shipped:
    """Carries an object to a worker: inherited as is with fork, cloudpickled otherwise."""

    def __init__(self, obj):
        self.obj = obj
        self._data = None

    def __reduce__(self):
        if self._data is None:
            import cloudpickle
            try:
                self._data = cloudpickle.dumps(self.obj)
            except Exception as e:
                raise TypeError(f"{self.obj!r} cannot be sent to worker processes: "
                                f"{type(e).__name__}: {e}") from e
        return _unship, (self._data,)


def _unship(data):
    s = _Shipped(pickle.loads(data))
    s._data = data
    return s


def _leave_fork_server():
    """Drop the fork server's liveness pipe that multiprocessing hands every child it forks.

    The server lives until the last holder of that pipe is gone, and our workers die with the
    server (PR_SET_PDEATHSIG): if they held it too, a killed consumer would leave both alive.
    Without it, a pipeline nested in this worker starts a fork server of its own.
    """
    server = getattr(mp_forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        os.close(fd)
        server._forkserver_alive_fd = None
        server._forkserver_pid = None
        server._forkserver_address = None


def _keep_freed_memory():
    """Let glibc keep freed memory in the worker instead of returning it to the kernel.

    A map function typically allocates a fresh array per datapoint and the worker frees it once
    the array is in shared memory. With glibc's defaults, arrays above 128 KiB are mmapped and
    unmapped each time, or the heap is trimmed and regrown, so every datapoint pays page faults
    on fresh memory (about 90 us for a 150 KB array, against 4 us when memory is reused). A
    worker runs one function over and over, so it keeps up to 128 MiB of freed memory instead.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 32 << 20)      # M_MMAP_THRESHOLD: serve up to 32 MiB from the heap
        libc.mallopt(-1, 128 << 20)     # M_TRIM_THRESHOLD: keep up to 128 MiB of free heap
    except (OSError, AttributeError):   # not glibc
        pass


def _lower_priority(increment):
    """Give the consumer the CPU first when cores are short (``dataflow.config.set_worker_nice``).
    On Linux this is the calling thread's priority (and that of threads it starts afterwards)."""
    if increment and hasattr(os, "nice"):
        try:
            os.nice(increment)
        except OSError:
            pass


def _take_messages(sock, pool, tasks):
    """Read every message that has arrived: segments handed back return to ``pool`` at once
    (so the next results reuse them, while they are still in cache), tasks queue up in
    ``tasks``. False when told to stop."""
    while True:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return True
        kind, released, run, items = transport.decode_task(frames)
        pool.release(released)
        if kind == transport.TASK:
            tasks.append((run, items))
        elif kind != transport.RELEASE:
            return False


def _worker_main(wid, endpoint, fd_sock, stack_sock, shipped, seed, consumer_pid, pdeathsig,
                 forked_by_consumer, nice, cv_threads, cv_inherited):
    """Body of a worker process: run the chunks that arrive, until told to stop or orphaned."""
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is the consumer's business
    if pdeathsig:
        die_with_parent()
    # The parent may have died before the kernel was asked to tell us: then nobody will.
    if os.getppid() != parent or (forked_by_consumer and parent != consumer_pid):
        return
    _leave_fork_server()
    _keep_freed_memory()
    if hasattr(signal, "SIGUSR1"):                   # the consumer asks for our stack this way
        faulthandler.register(signal.SIGUSR1, file=stack_sock, all_threads=True, chain=False)
    rng.seed_worker(wid, seed)
    # forked with cv2 imported: OpenCV's count cannot be changed safely here (cvthreads)
    cvthreads.set_process_limit(cv_threads, inherited=cv_inherited)
    context = transport.make_context(batch=False)
    sock = transport.make_socket(context)
    sock.bind(endpoint)
    # Only now, with ZeroMQ's I/O thread running at the consumer's priority: it sends each
    # result as soon as it is ready, preempting this thread, instead of waiting for a time slice
    # while the cores run workers (measured on 2 cores: +16 % on workload 2, +6-8 % on 1 and 3).
    _lower_priority(nice)
    pool = SegmentPool(fd_sock)
    shm._worker_pool = pool
    zero_copy = ZeroCopySwitch(pool)
    try:
        func = shipped.obj(wid)
        desc = f"map function {func_name(func)}"
        tasks = collections.deque()
        while True:
            if not tasks and not sock.poll(int(_LIVENESS_INTERVAL * 1000)):
                if os.getppid() != parent or not process_alive(consumer_pid):
                    break
                continue
            if not _take_messages(sock, pool, tasks) or os.getppid() != parent:
                break                                 # told to stop, or orphaned
            if not tasks:
                continue
            run, items = tasks.popleft()
            placed = pool.bytes_placed
            with zero_copy.chunk():
                results, busy = run_chunk(func, run, items)
            indices = {seq: index for seq, index, _ in items}
            for frame in transport.encode_results(results, indices, busy, pool, desc):
                sock.send(frame)
            zero_copy.observe(len(items), pool.bytes_placed - placed)
    except BaseException as e:
        err = WorkerError.from_exception(e, f"worker process {os.getpid()} (worker {wid})")
        sock.setsockopt(zmq.LINGER, 2000)            # make sure the report gets out
        sock.send(transport.encode_failure(err))
    finally:
        _close_all()                   # pipelines nested in this worker
        sock.close()
        context.term()


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

    def expected_bytes(self, per_item):
        """Shared memory its results take: held by the consumer, and to come."""
        return self.reader.held_bytes + len(self.outstanding) * per_item

    def held(self):
        return sorted(index for _, index, _ in self.outstanding.values())

    def describe(self):
        return f"datapoints {self.describe_held()} have been in worker process {self.process.pid}"

    def describe_held(self):
        held = self.held()
        return ", ".join(f"#{i}" for i in held[:20]) + (" ..." if len(held) > 20 else "")


def _remove_fork_server_address_at_exit():
    """In multiprocessing's fork server (which preloads this module): remove its listening
    socket file, ``/tmp/pymp-*/listener-*``, when the server exits.

    Only the consumer's exit hook removes that file, so a consumer killed by SIGKILL would leave
    it behind; the server exits right after its consumer, whatever killed it.
    """
    argv = getattr(sys, "orig_argv", [])
    code = argv[argv.index("-c") + 1] if "-c" in argv[:-1] else ""
    found = re.match(r"from multiprocessing\.forkserver import main; main\((\d+),", code)
    if not found:
        return
    try:
        with socket.socket(socket.AF_UNIX, fileno=os.dup(int(found.group(1)))) as listener:
            path = listener.getsockname()
    except OSError:
        return
    if isinstance(path, str) and os.path.basename(os.path.dirname(path)).startswith("pymp-"):
        atexit.register(_remove_socket_file, path)


def _remove_socket_file(path):
    for remove, target in ((os.unlink, path), (os.rmdir, os.path.dirname(path))):
        try:
            remove(target)
        except OSError:
            pass


_remove_fork_server_address_at_exit()

_live_executors = weakref.WeakSet()


@atexit.register
def _close_all():
    # Registered after multiprocessing's own exit hook, so it runs first: that hook joins
    # non-daemonic children, which would wait forever for workers nobody closed.
    for ex in list(_live_executors):
        ex.close()


_preload_lock = threading.Lock()
_start_lock = threading.Lock()


def _fresh_locks_after_fork():
    # A child forked while this process held one of these locks (starting workers of its own)
    # would find it locked forever: a nested pipeline in a forked worker would hang.
    global _preload_lock, _start_lock
    _preload_lock = threading.Lock()
    _start_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_locks_after_fork)


@contextlib.contextmanager
def _without_main_module(method):
    """Start spawned/forkserver workers without re-running the user's main module in them.

    multiprocessing normally imports ``__main__`` in each such child so that pickled references
    to its functions resolve; that is why scripts need ``if __name__ == "__main__":``. Our workers
    receive everything by value (cloudpickle), so they do not need it, and tensorpack scripts,
    written for fork, have no such guard. While our workers start, the preparation data that
    multiprocessing sends them leaves the main module out.
    """
    if method == "fork":               # a forked child gets no preparation data
        yield
        return
    original = mp_spawn.get_preparation_data

    def preparation_without_main(name):
        data = original(name)
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
        return data

    with _start_lock:
        mp_spawn.get_preparation_data = preparation_without_main
        try:
            yield
        finally:
            mp_spawn.get_preparation_data = original


def _get_context(method):
    ctx = mp.get_context(method)
    if method == "forkserver":
        with _preload_lock:
            # Workers fork from a server that already imported us (fast starts); only takes
            # effect if the server is not running yet.
            ctx.set_forkserver_preload(["dataflow.parallel.processes"])
    return ctx


class ProcessExecutor:
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
    kind = "process"

    def __init__(self, num_workers, make_func, start_method=None, max_restarts=0,
                 shm_budget=None, name="dataflow-worker"):
        shm_budget = SHM_BUDGET if shm_budget is None else shm_budget
        method = start_method or default_start_method()
        if method not in mp.get_all_start_methods():
            raise ValueError(f"start_method must be one of {mp.get_all_start_methods()}, "
                             f"got {start_method!r}")
        if not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {max_restarts!r}")
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
        self._released = collections.deque()
        self._batches = collections.deque()
        self._backlog = collections.deque()     # chunks not yet sent: (run, items)
        self._bytes_per_item = None             # moving average of a result's shared memory
        self._poller = zmq.Poller()
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
            # PR_SET_PDEATHSIG follows the thread that forked: only safe when that thread lives
            # as long as the consumer (the main thread, or the fork server's).
            self._pdeathsig = method != "fork" or \
                threading.current_thread() is threading.main_thread()
            self._workers = [None] * num_workers
            self._cv_threads = cvthreads.threads_for(num_workers)
            for wid in range(num_workers):
                self._workers[wid] = self._spawn(wid)
        except BaseException:
            self.close()
            raise

    def _spawn(self, wid):
        key = next(self._incarnations)
        mine, theirs = socket.socketpair()
        stack_mine, stack_theirs = socket.socketpair()
        endpoint = self._endpoints(key)
        p = self._mp.Process(
            target=_worker_main, name=f"{self._name}-{wid}",
            args=(wid, endpoint, theirs, stack_theirs, self._shipped, rng.get_seed(),
                  os.getpid(), self._pdeathsig, self.start_method != "forkserver",
                  config.worker_nice(), self._cv_threads,
                  self.start_method == "fork" and "cv2" in sys.modules))
        try:
            with _without_main_module(self.start_method), warnings.catch_warnings():
                # Python >= 3.12 warns on fork while any OS thread runs; we only fork with no
                # other Python thread, and C-level threads (BLAS pools, ZeroMQ's I/O thread)
                # are fork-aware.
                warnings.filterwarnings("ignore", category=DeprecationWarning,
                                        message=".*fork.*")
                p.start()
        except BaseException:
            for s in (mine, stack_mine):
                s.close()
            raise
        finally:
            theirs.close()
            stack_theirs.close()
        sock = transport.make_socket(self._context)
        sock.connect(endpoint)
        w = _Worker(wid, key, p, sock, mine, stack_mine, SegmentReader(key, mine, self._released))
        self._by_sentinel[p.sentinel] = w
        self._by_key[key] = w
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(p.sentinel, zmq.POLLIN)
        return w

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
        try:
            w.sock.send(transport._pack([transport.STOP]))
        except zmq.ZMQError:          # pragma: no cover - it is gone already: its exit will tell
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
                w.sock.send(transport.encode_release(w.released))
                w.released = []

    def _send(self, w, run, items):
        frames = transport.encode_task(run, items, w.released)
        w.released = []
        if len(frames) == 1:
            w.sock.send(frames[0])
        else:                         # large arrays: let ZeroMQ send them without a copy
            w.sock.send_multipart(frames, copy=False)
        if not w.outstanding:
            w.busy_since, w.next_warning = time.monotonic(), None
        for seq, index, dp in items:
            w.outstanding[seq] = (run, index, dp)

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
        """Apply the deadlines; milliseconds until the next one (``None``: no deadline)."""
        wait = check_workers(self._workers, timeout, config.current_hang_timeout(), self._warn_hung)
        return None if wait is None else int(wait * 1000) + 1

    def _warn_hung(self, w, waited):
        logger.warning("%s for %.1f s (hang_timeout=%s s); its Python stack:\n%s", w.describe(),
                       waited, config.current_hang_timeout(), self._stack_of(w))

    def _stack_of(self, w):
        """Ask a worker for its stack (faulthandler on SIGUSR1) and read it, waiting 1 s at most."""
        if not hasattr(signal, "SIGUSR1"):
            return "(not available on this platform)"
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
            before = w.reader.held_bytes
            results, busy = transport.decode_results(frame, w.reader)
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
        w.process.close()

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
            p.close()
        with self._busy:
            for w in self._workers:
                if w is not None:
                    self._close_handles(w)
            self._context.term()
            self._endpoints.remove()


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
    executor = "process"

    def __init__(self, ds, num_proc=None, map_func=None, *, buffer_size=200, strict=False,
                 ordered=False, on_error="raise", max_errors=None, start_method=None,
                 max_restarts=0, timeout=None):
        super().__init__(ds, available_cpus() if num_proc is None else num_proc, map_func,
                         buffer_size=buffer_size, strict=strict, ordered=ordered,
                         on_error=on_error, max_errors=max_errors, timeout=timeout)
        self.num_proc = self.num_workers
        self.start_method = _checked_start_method(start_method)
        self.max_restarts = max_restarts
        # The run-in-thread table: a map of native ops needs no processes.
        self.executor = choose_executor(map_func, self.num_workers, True)
        logger.debug("%s: %s", type(self).__name__,
                     describe_choice(map_func, self.num_workers, True))

    def _make_executor(self):
        return make_executor(self.executor, self.num_workers, Constant(self.map_func),
                             start_method=self.start_method, max_restarts=self.max_restarts)


MultiProcessMapDataZMQ = MultiProcessMapData


class MultiProcessRunner(CopiesRunner):
    """Run ``num_proc`` copies of ``ds``, one per process, and yield their datapoints in arrival
    order, at most ``num_prefetch`` ahead of the consumer (tensorpack's ``MultiProcessRunner``).

    Each copy is reset in its process (each draws its own random stream) and repeated forever;
    each ``__iter__`` pass yields ``len(ds)`` datapoints when that is known, and never ends
    otherwise.
    """
    executor = "process"

    def __init__(self, ds, num_prefetch, num_proc, *, start_method=None, max_restarts=0,
                 timeout=None):
        self.num_proc = num_proc
        self.start_method = _checked_start_method(start_method)
        self.max_restarts = max_restarts
        super().__init__(ds, num_proc, num_prefetch, timeout=timeout)

    def _make_executor(self):
        return ProcessExecutor(self.num_workers, self.map_func, self.start_method,
                               self.max_restarts)


class MultiProcessRunnerZMQ(MultiProcessRunner):
    """tensorpack's ``MultiProcessRunnerZMQ(ds, num_proc=1, hwm=50)``: a
    :class:`MultiProcessRunner` with ``hwm`` datapoints of prefetch."""

    def __init__(self, ds, num_proc=1, hwm=50, *, start_method=None, max_restarts=0,
                 timeout=None):
        super().__init__(ds, hwm, num_proc, start_method=start_method,
                         max_restarts=max_restarts, timeout=timeout)
        self.hwm = hwm


class _Groups:
    """An endless source of lists of ``batch_size`` consecutive datapoints of ``ds``."""

    def __init__(self, ds, batch_size):
        self.ds, self.batch_size = ds, batch_size

    def reset_state(self):
        self.ds.reset_state()

    def __len__(self):
        return len(self.ds) // self.batch_size

    def __iter__(self):
        group = []
        while True:
            n = 0
            for dp in self.ds:
                n += 1
                group.append(dp)
                if len(group) == self.batch_size:
                    yield group
                    group = []
            if n == 0:
                raise ValueError(f"{type(self.ds).__name__} yielded no datapoint in a whole pass")


class _MapAndBatch:
    """The worker function of MultiProcessMapAndBatchData: map a group, batch the results."""

    def __init__(self, map_func):
        self.map_func = map_func

    def __call__(self, group):
        from ..common import BatchData
        mapped = [r for r in (self.map_func(dp) for dp in group) if r is not None]
        return BatchData.aggregate_batch(mapped) if mapped else None


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
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        n = dataflow_length(ds)
        if n is not None and batch_size > n:
            raise ValueError(f"batch_size={batch_size} is larger than the dataflow ({n})")
        if buffer_size is None:
            buffer_size = batch_size * max(4, 2 * (available_cpus() if num_proc == "auto"
                                                   else num_proc))
        self.batch_size = batch_size
        super().__init__(_Groups(ds, batch_size), num_proc, _MapAndBatch(map_func),
                         buffer_size=max(1, buffer_size // batch_size),
                         start_method=start_method, max_restarts=max_restarts,
                         timeout=timeout)
        self.buffer_size_datapoints = buffer_size


MultiProcessMapAndBatchDataZMQ = MultiProcessMapAndBatchData
