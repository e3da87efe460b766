"""Small helpers shared by the format modules: writing a file aside and renaming it into place,
and importing an optional dependency with an error that names the extra to install.

A file is written under a temporary name beside its final one, ``.<name>.<host>-<pid>-<random>
.tmp``, and renamed when complete. A writer that is killed (SIGKILL, SIGTERM, a power cut) cannot
remove its temporary file; the name says who wrote it, so the next save of the same path on the
same host removes those whose process is gone (:func:`remove_stale`).
"""
import contextlib
import importlib
import os
import re
import socket
import tempfile

__all__ = ["write_aside", "check_target", "aside_prefix", "remove_stale", "require"]


def _host():
    return re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"


def aside_prefix(path):
    """The start of the temporary names of a file written for ``path`` by this process:
    ``<dir>/.<name>.<host>-<pid>-`` (a random part and ``.tmp`` follow)."""
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    return os.path.join(directory, f".{name}.{_host()}-{os.getpid()}-")


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:             # PermissionError: another user's process
        pass
    return True


def remove_stale(path):
    """Remove the temporary files beside ``path`` that writers on this host left when they were
    killed: names made from :func:`aside_prefix` (and LMDB's ``-lock`` beside one) whose process
    no longer exists. Another host's files (a shared file system) and a live process's are kept.
    POSIX only (elsewhere a process cannot be probed without touching it)."""
    if os.name != "posix":
        return
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    stale = re.compile(rf"\.{re.escape(name)}\.{re.escape(_host())}-(\d+)-\w+\.tmp(-lock)?")
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for entry in names:
        m = stale.fullmatch(entry)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, entry))


def _umask():
    """The process's umask: from ``/proc/self/status`` on Linux, elsewhere by setting it and
    back (the only portable way, which another thread creating a file at that moment could
    see)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def as_path(who, path, name="path"):
    """``path`` (a ``str``, ``bytes`` or ``os.PathLike``) as a ``str``; ``TypeError`` naming
    ``who`` and the argument for anything else (``None`` and 5 failed in ``os.fspath`` naming
    neither, and a bytes path later, in string operations)."""
    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError(f"{who}: {name} must be a path (str or os.PathLike), got "
                        f"{path!r:.80}") from None
    return os.fsdecode(path) if isinstance(path, bytes) else path


def check_target(path):
    """``os.fspath(path)``, a file in an existing directory; otherwise an error naming it (the
    write would fail naming its temporary file, or write a file named ".tmp")."""
    path = as_path("write", path)
    if not os.path.basename(path):
        raise ValueError(f"the path to write must name a file, got {path!r}")
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"cannot write {path!r}: the directory {directory!r} does not "
                                f"exist")
    return path


@contextlib.contextmanager
def write_aside(path):
    """Yields a temporary path in the directory of ``path`` (see the module doc); when the
    block succeeds, the temporary file is renamed to ``path`` (atomic on POSIX), otherwise it
    is removed. So a crash or an error never leaves a half-written file under the final name;
    the temporary files of writers killed before (this host's) are removed first."""
    path = check_target(path)
    remove_stale(path)
    prefix = aside_prefix(path)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(prefix), prefix=os.path.basename(prefix),
                               suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        # mkstemp's file is 0600: give the file the mode open() would have (0666 less the
        # umask), so that a dataset written for others can be read by them
        if os.path.isfile(tmp):
            os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def require(module, user, extra):
    """``import module`` or raise ImportError naming ``user`` (the class that needs it) and the
    extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{user} needs {module.split('.')[0]}: "
                          f"pip install 'dataflow-rt[{extra}]'") from e
