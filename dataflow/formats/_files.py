"""Small helpers shared by the format modules: writing a file aside and renaming it into place,
and importing an optional dependency with an error that names the extra to install."""
import contextlib
import importlib
import os
import tempfile

__all__ = ["write_aside", "require"]


@contextlib.contextmanager
def write_aside(path):
    """Yields a temporary path in the directory of ``path``; when the block succeeds, the
    temporary file is renamed to ``path`` (atomic on POSIX), otherwise it is removed. So a crash
    or an error never leaves a half-written file under the final name."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".",
                               suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
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
