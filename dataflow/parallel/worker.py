"""The body of a worker process: the module multiprocessing's fork server preloads.

:func:`_worker_main` runs the chunks that arrive from the consumer with
:func:`~.protocol.run_chunk` until told to stop or orphaned, and sends back the results (their
arrays in the worker's shared-memory pool, :mod:`.shm`).
"""
import atexit
import collections
import faulthandler
import functools
import logging
import multiprocessing.forkserver as mp_forkserver
import os
import re
import signal
import socket
import sys
import threading
import time

import zmq

from .. import rng, serialize
from .._malloc import keep_freed_memory
from .allocator import ZeroCopySwitch
from .protocol import WorkerError, detach_kept, func_name, run_chunk
from .shm import SegmentPool
from . import cvthreads, shm, torchthreads, transport
from .start import _close_all, _private_directory
from .supervisor import die_with_parent, process_alive

logger = logging.getLogger("dataflow")


# How often an idle worker checks that its consumer still exists (seconds).
_LIVENESS_INTERVAL = 0.25


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
        try:
            kind, released, run, items = transport.decode_task(frames)
        except transport.UnloadableTask as e:
            pool.release(e.released)
            tasks.append((None, e))                  # answered with its error
            continue
        except transport.MalformedMessage as e:
            logger.warning("worker process %d dropped a message: %s", os.getpid(), e)
            continue
        pool.release(released)
        if kind == transport.TASK:
            tasks.append((run, items))
        elif kind != transport.RELEASE:
            return False


def _executor_gone(fd_sock):
    """Whether the consumer closed its end of our socket pair: the executor that started us is
    gone while the consumer lives on. A start that failed half-way does that: a Ctrl-C while
    the fork server forked us left no one who knew our pid, and we waited for tasks as long as
    the consumer lived."""
    try:
        return fd_sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False                    # open, nothing to read: the usual case
    except OSError:
        return True


def _worker_main(wid, endpoint, secret, fd_sock, stack_sock, shipped, seed, consumer_pid,
                 pdeathsig, forked_by_consumer, nice, cv_threads, cv_inherited, torch_inherited):
    """Body of a worker process: run the chunks that arrive, until told to stop or orphaned."""
    parent = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # Ctrl-C is the consumer's business
    for sig in _ENDING_SIGNALS:                      # the fork server's handlers, if any
        handler = signal.getsignal(sig)
        if isinstance(handler, functools.partial) and handler.func is _die_of:
            signal.signal(sig, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):         # held back while we started (start.py)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    watched = pdeathsig and die_with_parent()
    # The parent may have died before the kernel was asked to tell us: then nobody will.
    if os.getppid() != parent or (forked_by_consumer and parent != consumer_pid):
        return
    if not watched:
        # no signal from the kernel when the consumer dies (the thread that started us may
        # end before it, or this is not Linux): a thread looks, also while a chunk runs
        threading.Thread(target=_exit_when_orphaned, args=(parent, consumer_pid, endpoint),
                         name="dataflow-orphan-watch", daemon=True).start()
    if forked_by_consumer:
        serialize.share_main_module()
    _leave_fork_server()
    # a map function allocates a fresh array per datapoint, freed once it is in shared memory:
    # with glibc's defaults each one above 128 KiB page-faulted in anew (about 90 us for 150 KB)
    keep_freed_memory()
    if hasattr(signal, "SIGUSR1"):                   # the consumer asks for our stack this way
        faulthandler.register(signal.SIGUSR1, file=stack_sock, all_threads=True, chain=False)
    rng.seed_worker(wid, seed)
    # forked with cv2 imported: OpenCV's count cannot be changed safely here (cvthreads)
    cvthreads.set_process_limit(cv_threads, inherited=cv_inherited)
    # forked with torch imported: one thread, or torch's inherited pool may hang (torchthreads)
    torchthreads.set_process_limit(cv_threads, inherited=torch_inherited)
    context = transport.make_context(batch=False)
    sock = transport.make_socket(context)
    transport.connect_private(sock, endpoint, secret)
    sock.send(transport.HELLO_FRAME)                 # delivered once the consumer admits us
    # Only now, with ZeroMQ's I/O thread running at the consumer's priority: it sends each
    # result as soon as it is ready, preempting this thread, instead of waiting for a time slice
    # while the cores run workers (figures in docs/measurements.md).
    _lower_priority(nice)
    pool = SegmentPool(fd_sock)
    shm.set_worker_pool(pool)
    zero_copy = ZeroCopySwitch(pool)
    try:
        func = shipped.obj(wid)
        desc = f"map function {func_name(func)}"
        tasks = collections.deque()
        while True:
            if not tasks and not sock.poll(int(_LIVENESS_INTERVAL * 1000)):
                if os.getppid() != parent or not process_alive(consumer_pid) or \
                        _executor_gone(fd_sock):
                    transport.remove_orphaned_endpoints(endpoint)
                    break
                continue
            if not _take_messages(sock, pool, tasks) or os.getppid() != parent:
                break                                 # told to stop, or orphaned
            if not tasks:
                continue
            run, items = tasks.popleft()
            placed = pool.bytes_placed
            if run is None:                           # a task it could not load
                results, indices, busy = items.results(), items.indices, 0.0
            else:
                indices = {seq: index for seq, index, _ in items}
                with zero_copy.chunk():
                    # the chunk's results are sent together: each is detached from what the
                    # map function keeps (a reused buffer) as soon as it is made
                    results, busy = run_chunk(func, run, items, detach=detach_kept)
            for frame in transport.encode_results(results, indices, busy, pool, desc):
                sock.send(frame)
            zero_copy.observe(len(indices), pool.bytes_placed - placed)
    except BaseException as e:
        err = WorkerError.from_exception(e, f"worker process {os.getpid()} (worker {wid})")
        sock.setsockopt(zmq.LINGER, 2000)            # make sure the report gets out
        sock.send(transport.encode_failure(err))
    finally:
        _close_all()                   # pipelines nested in this worker
        sock.close()
        context.term()


def _remove_fork_server_address_at_exit():
    """In multiprocessing's fork server (which preloads this module): remove its listening
    socket file, ``/tmp/pymp-*/listener-*``, when the server exits.

    Only the consumer's exit hook removes that file, so a consumer killed by SIGKILL would leave
    it behind; the server exits right after its consumer, whatever killed it. A signal that
    ends the server itself skips exit hooks: SIGTERM or SIGHUP sent to the whole process group
    (``timeout``, ``kill -- -PGID``, a closed terminal) reach the server with its consumer, so
    for those the server removes the file first, then dies of the signal.
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
        server = os.getpid()
        for sig in _ENDING_SIGNALS:
            if signal.getsignal(sig) == signal.SIG_DFL:
                signal.signal(sig, functools.partial(_die_of, path=path, server=server))


# Signals whose default action ends the fork server without its exit hooks.
_ENDING_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP")
                        if hasattr(signal, name))


def _die_of(signum, _frame, path, server):
    """The fork server's handler of :data:`_ENDING_SIGNALS`: remove its socket file, then die
    of the signal as without the handler. A worker forked by the server, before it resets the
    handler (:func:`_worker_main`), just dies."""
    if os.getpid() == server:
        _remove_socket_file(path)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _remove_socket_file(path):
    """Remove the server's socket file, and its directory if that is still this user's private
    one (it may have been removed and made again by someone else: see
    ``start.replace_lost_fork_server``)."""
    try:
        os.unlink(path)
    except OSError:
        pass
    directory = os.path.dirname(path)
    if _private_directory(directory):
        try:
            os.rmdir(directory)
        except OSError:
            pass


_remove_fork_server_address_at_exit()


def _exit_when_orphaned(parent, consumer_pid, endpoint):
    """End this worker at once (as the kernel's SIGKILL would) once its consumer is gone,
    removing the files the consumer could not."""
    while True:
        time.sleep(_LIVENESS_INTERVAL)
        if os.getppid() != parent or not process_alive(consumer_pid):
            transport.remove_orphaned_endpoints(endpoint)
            os._exit(0)
