"""Keeping worker processes honest: they die with the consumer, and their death is reported.

* A worker asks the kernel to kill it when its parent dies (``prctl(PR_SET_PDEATHSIG)`` through
  ctypes on Linux; no optional package needed) and, everywhere, checks between tasks that the
  consumer process still exists.
* The consumer waits on each worker's process sentinel together with its sockets, so a worker that
  dies (killed, segfault, ``os._exit``, out of memory) is noticed at once, and
  :class:`WorkerCrashedError` names it, how it died and the datapoints it held.
"""
import ctypes
import ctypes.util
import os
import signal
import sys

__all__ = ["WorkerCrashedError", "die_with_parent", "process_alive", "describe_exit"]


class WorkerCrashedError(RuntimeError):
    """A worker process died while the pipeline needed it."""

    def __init__(self, message, pid=None, exitcode=None, datapoints=()):
        super().__init__(message)
        self.pid = pid
        self.exitcode = exitcode
        self.datapoints = list(datapoints)


_PR_SET_PDEATHSIG = 1


def die_with_parent():
    """Ask the kernel to SIGKILL this process when its parent thread exits (Linux only; a no-op
    elsewhere, where the liveness check between tasks does the job)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def process_alive(pid):
    """Whether process ``pid`` still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe_exit(exitcode):
    """'killed by signal SIGKILL' or 'exited with code 3' for a ``Process.exitcode``."""
    if exitcode is None:
        return "is gone"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = str(-exitcode)
        return f"was killed by signal {name}"
    return f"exited with code {exitcode}"
