"""Starting worker processes: the start method, and shipping objects to the workers.

Used by the consumer's :class:`~.process_executor.ProcessExecutor`, and by the worker body
(:mod:`.worker`) for the executors of pipelines nested in a worker.
"""
import atexit
import contextlib
import multiprocessing as mp
import multiprocessing.forkserver as mp_forkserver
import multiprocessing.spawn as mp_spawn
import os
import pickle
import signal
import stat
import sys
import threading
import weakref

from . import cvthreads

__all__ = ["default_start_method"]


def default_start_method():
    """The start method used when none is given.

    The one chosen with ``multiprocessing.set_start_method`` when that is not the platform's
    default (that one is indistinguishable from a default that was merely looked up). Else,
    where multiprocessing defaults to ``"fork"`` (Linux): ``"fork"`` while no other Python
    thread runs in this process: then nothing can hold a lock that the child would inherit
    locked, and workers start in milliseconds and inherit everything, as with tensorpack. Once
    another thread runs (ours, a library's, a ``MultiThreadMapData`` upstream),
    ``"forkserver"``, whose server is a clean single-threaded process, so nothing can deadlock.
    Elsewhere multiprocessing's default (``"spawn"`` on macOS and Windows, where forking is
    unsafe or missing).

    One thread does not count: pyzmq's garbage collector, which pyzmq starts, once per process,
    for the first large message sent without a copy (a large source array sent to a worker).
    It waits on a socket without holding a lock, and a forked child starts its own, so it
    changes nothing a child inherits; counting it made every pipeline after the first one
    with large source arrays start through the fork server.

    OpenCV's thread pool is stopped around each fork (``cvthreads.stopped_for_fork``); an
    OpenCV that runs on TBB or OpenMP, whose threads cannot be stopped, counts as a thread.
    """
    methods = mp.get_all_start_methods()
    platform_default = methods[0]       # multiprocessing lists its default first
    chosen = mp.get_start_method(allow_none=True)
    if chosen is not None and chosen != platform_default:
        return chosen
    if platform_default != "fork":
        return platform_default
    if (threading.active_count() == 1 or _only_fork_safe_threads()) and cvthreads.fork_safe():
        return "fork"
    return "forkserver" if "forkserver" in methods else "spawn"


def _only_fork_safe_threads():
    """Whether every thread but this one is pyzmq's garbage collector (see above)."""
    garbage = sys.modules.get("zmq.utils.garbage")
    collector = getattr(garbage, "GarbageCollectorThread", None)
    me = threading.current_thread()
    return collector is not None and all(
        t is me or isinstance(t, collector) for t in threading.enumerate())


def _checked_start_method(method):
    if method is not None and method not in mp.get_all_start_methods():
        raise ValueError(f"start_method must be None or one of {mp.get_all_start_methods()}, "
                         f"got {method!r}")
    return method


_NOT_LOADED = object()


class _Shipped:
    """Carries an object to a worker: inherited as is with fork, cloudpickled otherwise. A
    pickled one is loaded when the worker first asks for ``obj``, in its own code (where a
    failure, a class that cannot be loaded there, say, is reported to the consumer with its
    type and traceback), not while multiprocessing starts the process."""

    def __init__(self, obj):
        self._obj = obj
        self._data = None

    @property
    def obj(self):
        if self._obj is _NOT_LOADED:
            self._obj = pickle.loads(self._data)
        return self._obj

    def __reduce__(self):
        if self._data is None:
            import cloudpickle     # start-up cost: only paid once something must be pickled
            try:
                self._data = cloudpickle.dumps(self.obj)
            except Exception as e:
                raise TypeError(f"{self.obj!r} cannot be sent to worker processes: "
                                f"{type(e).__name__}: {e}") from e
        return _unship, (self._data,)


def _unship(data):
    s = _Shipped(_NOT_LOADED)
    s._data = data
    return s


_live_executors = weakref.WeakSet()


@atexit.register
def _close_all():
    # Registered after multiprocessing's own exit hook, so it runs first: that hook joins
    # non-daemonic children, which would wait forever for workers nobody closed.
    for ex in list(_live_executors):
        ex.close()


_preload_lock = threading.Lock()


def _fresh_lock_after_fork():
    # A child forked while this process held the lock (starting workers of its own) would find
    # it locked forever: a nested pipeline in a forked worker would hang.
    global _preload_lock
    _preload_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_lock_after_fork)


_starting = threading.local()     # .ours: this thread is starting our workers
_original_preparation_data = mp_spawn.get_preparation_data


def _preparation_data(name):
    """multiprocessing's preparation data, without the main module while this thread starts
    our workers (see :func:`_without_main_module`); as it was for every other start."""
    data = _original_preparation_data(name)
    if getattr(_starting, "ours", False):
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


@contextlib.contextmanager
def _without_main_module(method):
    """Start spawned/forkserver workers without re-running the user's main module in them.

    multiprocessing normally imports ``__main__`` in each such child so that pickled references
    to its functions resolve; that is why scripts need ``if __name__ == "__main__":``. Our workers
    receive everything by value (cloudpickle), so they do not need it, and tensorpack scripts,
    written for fork, have no such guard. While this thread starts our workers, the preparation
    data that multiprocessing sends them leaves the main module out. multiprocessing's function
    is replaced once, by one that changes nothing for the processes other threads start (they
    may need their ``__main__``: the replacement used to be swapped in and out, and a spawn
    started by another thread meanwhile lost it).
    """
    if method == "fork":               # a forked child gets no preparation data
        yield
        return
    if mp_spawn.get_preparation_data is _original_preparation_data:
        mp_spawn.get_preparation_data = _preparation_data
    _starting.ours = True
    try:
        yield
    finally:
        _starting.ours = False


@contextlib.contextmanager
def _sigint_held(method):
    """Keep a Ctrl-C away from a worker that this thread forks or spawns, until the worker
    ignores SIGINT itself (:mod:`.worker`), and away from the start itself: a KeyboardInterrupt
    in a spawned worker's start-up (its interpreter and imports) printed a traceback and killed
    it, and one inside ``Process.start()`` could leave a started worker that no one knew.

    SIGINT is blocked in this thread meanwhile; a forked worker inherits the mask and lifts it
    once it ignores SIGINT. A spawned one gets a fresh mask from ``exec`` but keeps an ignored
    SIGINT (Python leaves an inherited ``SIG_IGN`` alone), so from the main thread, the only one
    that may change handlers, SIGINT is also ignored while the worker is started (a few
    milliseconds: a Ctrl-C that another thread of this process receives then is lost; one that
    reaches this thread stays pending, and is delivered when this returns).

    Blocking SIGINT in this thread does not keep Python from raising KeyboardInterrupt in it:
    another thread may receive the signal, and Python then runs the handler in the main thread
    at its next bytecode. With ``fork`` and ``forkserver`` started from the main thread the
    handler is therefore replaced by one that notes the signal, which is raised again once the
    start is over: a Ctrl-C between the fork server's fork and the parent's write of the process
    object left the consumer holding the pipe's write end and the worker waiting on it for as
    long as the consumer lived.

    With ``forkserver`` the server must already run (:func:`ensure_fork_server`), or the one
    the start makes would keep the mask for every process it forks, the user's too."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    handler = None
    noted = []
    if threading.current_thread() is threading.main_thread():
        handler = signal.getsignal(signal.SIGINT)       # None: set outside Python, leave it
        if handler is not None:
            signal.signal(signal.SIGINT, signal.SIG_IGN if method == "spawn" else
                          (lambda signum, frame: noted.append(signum)))
    try:
        yield
    finally:
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
        if signal.SIGINT not in before:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        if noted:
            signal.raise_signal(signal.SIGINT)           # as it would have been, now


def _get_context(method):
    ctx = mp.get_context(method)
    if method == "forkserver":
        with _preload_lock:
            # Workers fork from a server that already imported their body (fast starts); only takes
            # effect if the server is not running yet.
            ctx.set_forkserver_preload(["dataflow.parallel.worker"])
    return ctx


_lost_fork_servers = []   # liveness pipes of fork servers that lost their socket file


def ensure_fork_server():
    """Start multiprocessing's fork server now, if it does not run, with SIGINT as it is here
    (before :func:`_sigint_held` blocks it; replacing a server whose socket file was lost
    first, see :func:`replace_lost_fork_server`)."""
    replace_lost_fork_server()
    mp_forkserver.ensure_running()


def replace_lost_fork_server():
    """Before a start through multiprocessing's fork server: if the server runs but its socket
    file is gone, have the start make a new server.

    The file (``$TMPDIR/pymp-*/listener-*``) lives as long as the process, and a /tmp cleaner
    (systemd-tmpfiles removes what is older than 10 days) or a person may remove it; then every
    later start through the server failed with ``FileNotFoundError``, for the rest of the
    process's life. The old server runs on for the workers it forked (they end with it) until
    this process ends. The new socket goes into multiprocessing's temporary directory, made
    again if it was removed too, or into a new one if another took its place.
    """
    server = getattr(mp_forkserver, "_forkserver", None)
    lock = getattr(server, "_lock", None)
    if lock is None:
        return
    with lock:
        address = getattr(server, "_forkserver_address", None)
        if not isinstance(address, str) or address.startswith("\0") or \
                os.path.exists(address):
            return
        _lost_fork_servers.append(server._forkserver_alive_fd)    # the old server lives on
        server._forkserver_alive_fd = server._forkserver_pid = None
        server._forkserver_address = None
        directory = os.path.dirname(address)
        try:
            os.mkdir(directory, 0o700)      # removed with the file: made again, ours
        except FileExistsError:
            if not _private_directory(directory):
                _forget_temp_dir(directory)     # replaced by someone else's: a new one


def _private_directory(path):
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def _forget_temp_dir(directory):
    """Have multiprocessing make a new temporary directory, and not remove ``directory`` (no
    longer its own) at exit."""
    import multiprocessing.util as mp_util
    mp.current_process()._config["tempdir"] = None
    for finalizer in list(getattr(mp_util, "_finalizer_registry", {}).values()):
        if directory in (getattr(finalizer, "_args", None) or ()):
            finalizer.cancel()
