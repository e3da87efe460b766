"""Clear errors when the operating system refuses what worker processes need.

Starting ``n`` worker processes takes file descriptors in the consumer (per worker: its ZeroMQ
socket and connection, two socket pairs, the process sentinel, the mapped segments' descriptors
while they arrive), a new process each, and a temporary directory for the fork server. When the
system says no, the error raised in the consumer is a :class:`ResourceLimitError` (an ``OSError``
with the original ``errno``) that names the resource, the number needed, the current limit and the
fix, and the executor that hit it has cleaned up everything it had started.
"""
import errno
import os
import shutil
import sys
import tempfile

__all__ = ["ResourceLimitError", "FDS_PER_WORKER", "check_file_descriptors",
           "explain_start_failure", "check_temp_dir", "segment_error"]

# Measured in the consumer (tests/test_resources.py checks it): about 10 per worker and 20 for
# the executor itself; with room to spare.
FDS_PER_WORKER = 12
FDS_PER_EXECUTOR = 32


class ResourceLimitError(OSError):
    """The operating system refused a resource the workers need (file descriptors, processes,
    memory, a temporary directory). ``errno`` is the system's; the message says what was needed,
    what the limit is and how to raise it."""


def _open_fds():
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def _nofile():
    try:
        import resource
    except ImportError:                    # not POSIX
        return None, None
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def _fd_message(num_workers, open_now, soft, hard):
    need = FDS_PER_EXECUTOR + FDS_PER_WORKER * num_workers
    fit = max(0, (soft - (open_now or 0) - FDS_PER_EXECUTOR) // FDS_PER_WORKER)
    suggest = (open_now or 0) + need + 64
    hard_text = "unlimited" if hard < 0 or hard >= 1 << 40 else str(hard)
    return (f"{num_workers} worker process(es) need about {need} file descriptors in this process "
            f"({FDS_PER_WORKER} per worker + {FDS_PER_EXECUTOR}), and {open_now} are open "
            f"already, but the open-files limit (RLIMIT_NOFILE) is {soft}: raise it "
            f"(`ulimit -n {suggest}` in the shell, or resource.setrlimit(resource.RLIMIT_NOFILE, "
            f"({suggest}, hard)) in Python; the hard limit is {hard_text}), or use fewer workers "
            f"(at most {fit} fit now)")


def check_file_descriptors(num_workers):
    """Raise :class:`ResourceLimitError` (``EMFILE``) before anything starts if ``num_workers``
    more workers cannot fit under the open-files limit."""
    soft, hard = _nofile()
    open_now = _open_fds()
    if soft is None or open_now is None or soft < 0:
        return
    if open_now + FDS_PER_EXECUTOR + FDS_PER_WORKER * num_workers > soft:
        raise ResourceLimitError(errno.EMFILE, _fd_message(num_workers, open_now, soft, hard))


def explain_start_failure(exc, wid, num_workers):
    """A :class:`ResourceLimitError` explaining why worker ``wid`` of ``num_workers`` could not
    start, or ``None`` when ``exc`` is not about a resource."""
    code = getattr(exc, "errno", None)
    what = f"could not start worker process {wid} of {num_workers}"
    if code in (errno.EMFILE, errno.ENFILE):
        soft, hard = _nofile()
        if code == errno.ENFILE:
            return ResourceLimitError(code, f"{what}: the system-wide table of open files is full "
                                            f"(ENFILE, /proc/sys/fs/file-max): close files or use "
                                            f"fewer workers")
        return ResourceLimitError(code, f"{what}: out of file descriptors ({exc}); "
                                        + _fd_message(num_workers, _open_fds(), soft, hard))
    if code == errno.EAGAIN:
        limit = "unknown"
        try:
            import resource
            soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
            limit = "unlimited" if soft < 0 else str(soft)
        except (ImportError, AttributeError, OSError):
            pass
        return ResourceLimitError(code, f"{what}: the system refused a new process (EAGAIN on "
                                        f"fork: {num_workers} more processes are needed, the "
                                        f"per-user process limit RLIMIT_NPROC is {limit}, and "
                                        f"/proc/sys/kernel/threads-max and the container's pids "
                                        f"limit also count): raise it (`ulimit -u`) or use "
                                        f"fewer workers")
    if code == errno.ENOMEM:
        return ResourceLimitError(code, f"{what}: out of memory for a new process (ENOMEM; "
                                        f"{_available_memory()}): free memory or use fewer "
                                        f"workers")
    return None


def memory_available():
    """The memory available to new allocations in bytes (Linux's ``MemAvailable``), or
    ``None`` where it is unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _available_memory():
    n = memory_available()
    return "available memory unknown" if n is None else f"{n // (1 << 20)} MiB available"


# The longest path of a Unix socket file: sockaddr_un.sun_path holds 108 bytes on Linux, 104 on
# macOS and the BSDs, with the terminating NUL.
_UNIX_PATH_MAX = 107 if sys.platform.startswith("linux") else 103


def check_temp_dir(method):
    """Before multiprocessing's fork server starts (it needs a socket file in a temporary
    directory): raise :class:`ResourceLimitError` naming the directory and the fix when none is
    writable."""
    if method != "forkserver":
        return
    from multiprocessing import forkserver
    server = getattr(forkserver, "_forkserver", None)
    if server is not None and getattr(server, "_forkserver_pid", None) is not None:
        return                              # already running: it needs nothing more
    from multiprocessing import process
    made = process.current_process()._config.get("tempdir")
    # the server listens on <tempdir>/pymp-XXXXXXXX/listener-XXXXXXXX (in the directory that
    # multiprocessing made already, if it did): the path must fit a Unix socket address
    path = os.path.join(made or os.path.join(tempfile.gettempdir(), "pymp-" + "x" * 8),
                        "listener-" + "x" * 8)
    if len(os.fsencode(path)) > _UNIX_PATH_MAX:
        raise ResourceLimitError(
            errno.ENAMETOOLONG,
            f"the fork server of start_method='forkserver' listens on a socket file whose path "
            f"would be {len(os.fsencode(path))} bytes ({path!r}), more than the "
            f"{_UNIX_PATH_MAX} a Unix socket address holds here: set TMPDIR to a shorter "
            f"directory (e.g. /tmp), or use start_method='spawn'")
    if made:
        return                              # multiprocessing made its directory already
    try:
        directory = tempfile.mkdtemp(prefix="dataflow-check-")
        os.rmdir(directory)
    except OSError as e:
        raise ResourceLimitError(
            e.errno or errno.EACCES,
            f"the fork server of start_method='forkserver' needs a writable temporary directory, "
            f"and {tempfile.gettempdir()!r} is not ({e.strerror or e}): set TMPDIR to a writable "
            f"directory (or tempfile.tempdir), or use start_method='spawn'") from None


def segment_error(size, exc, where="reserve", directory=None):
    """The message of a :class:`~.shm.SharedMemoryError` for ``size`` bytes refused with ``exc``;
    ``directory``: where the segment's file is (systems without ``memfd_create``)."""
    code = getattr(exc, "errno", None)
    if directory is not None and code != errno.EFBIG:
        try:
            free = f"{shutil.disk_usage(directory).free} bytes free"
        except OSError:
            free = "unknown space free"
        limit = (f"its file is in the temporary directory {directory} ({free}): free space "
                 f"there, point TMPDIR at a larger file system, or make results smaller")
    elif code == errno.EFBIG:
        try:
            import resource
            soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        except (ImportError, OSError):
            soft = "unknown"
        limit = f"the file-size limit RLIMIT_FSIZE is {soft} bytes: raise it (`ulimit -f " \
                f"unlimited`), or make results smaller"
    elif code in (errno.EMFILE, errno.ENFILE):
        try:
            import resource
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        except (ImportError, OSError):
            soft = "unknown"
        limit = (f"the open-files limit RLIMIT_NOFILE is {soft}, and each shared-memory segment "
                 f"that results in use keep alive holds a file descriptor: raise it (`ulimit -n`), "
                 f"or keep fewer results of the pipeline (copy the arrays you keep)")
    elif code == errno.ENOMEM and where == "map":
        try:
            import resource
            soft, _ = resource.getrlimit(resource.RLIMIT_AS)
            soft = "unlimited" if soft < 0 else f"{soft} bytes"
        except (ImportError, OSError):
            soft = "unknown"
        limit = (f"the address-space limit RLIMIT_AS is {soft} ({_available_memory()}): raise it "
                 f"(`ulimit -v`), or reduce buffer_size")
    else:
        limit = (f"{_available_memory()}; shared memory counts against RAM and the container's "
                 f"memory limit: free memory, reduce buffer_size or make results smaller")
    verb = "map" if where == "map" else "reserve"
    return (f"could not {verb} {size} bytes of shared memory for a result "
            f"({exc.strerror or exc}); {limit}")
