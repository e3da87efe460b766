"""Keeping worker processes honest: they die with the consumer, and their death is reported.

* A worker asks the kernel to kill it when its parent dies (``prctl(PR_SET_PDEATHSIG)`` through
  ctypes on Linux; no optional package needed) and, everywhere, checks between tasks that the
  consumer process still exists.
* The consumer waits on each worker's process sentinel together with its sockets, so a worker that
  dies (killed, segfault, ``os._exit``, out of memory) is noticed at once, and
  :class:`WorkerCrashedError` names it, how it died and the datapoints it held.
* :func:`check_workers` applies the deadlines (the user's ``timeout``, the configured hang
  timeout) to the workers of any executor; :func:`next_wait` is how long a consumer may then
  wait for them.
"""
import ctypes
import ctypes.util
import math
import os
import signal
import sys
import time

__all__ = ["WorkerCrashedError", "die_with_parent", "process_alive", "describe_exit",
           "check_workers", "next_wait"]

# The longest a consumer waits for its workers at a time. A signal (Ctrl-C) that the kernel
# hands to another thread of the process interrupts no wait of the consumer's thread, and Python
# raises it only when that thread runs Python again (CPython 3.13: when it takes the GIL back).
SIGNAL_CHECK = 0.5


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
    """Whether process ``pid`` still runs. A dead process that its parent has not reaped yet (a
    zombie) counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):   # no /proc (not Linux), or it just went away
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


# Seconds that a worker still starting (a process before its first message: its interpreter
# and imports, slow under spawn and on a loaded machine) has on top of each deadline, since the
# datapoints sent to it have not reached it yet. Its deadlines restart when it is ready.
START_GRACE = 60.0


def check_workers(workers, timeout, hang_timeout, on_hung, stack_of=None):
    """The deadlines of every executor, in one place.

    ``workers`` have ``busy_since`` (``time.monotonic()`` of the last progress on the work they
    hold, ``None`` when idle), ``next_warning`` (managed here), ``describe()`` (which
    datapoints, which process or thread) and may have ``starting`` (True: the deadlines come
    :data:`START_GRACE` seconds later). Raises ``TimeoutError`` for work held ``timeout``
    seconds (with the worker's current stack, ``stack_of(worker)``, where the executor can tell
    it); calls ``on_hung(worker, seconds)`` once work is held ``hang_timeout`` seconds, and
    again every ``hang_timeout`` seconds. Returns the seconds until the next deadline, or
    ``None`` when there is none.
    """
    now = time.monotonic()
    wake = None
    for w in workers:
        if w is None or w.busy_since is None:
            continue
        waited = now - w.busy_since
        since = w.busy_since + (START_GRACE if getattr(w, "starting", False) else 0.0)
        if timeout is not None:
            if now >= since + timeout:
                stack = "" if stack_of is None else f"; its Python stack:\n{stack_of(w)}"
                raise TimeoutError(f"{w.describe()} for {waited:.1f} s, more than "
                                   f"timeout={timeout} s{stack}")
            wake = _earliest(wake, since + timeout)
        if hang_timeout != math.inf:
            if w.next_warning is None:
                w.next_warning = since + hang_timeout
            if now >= w.next_warning:
                on_hung(w, waited)
                w.next_warning = now + hang_timeout
            wake = _earliest(wake, w.next_warning)
    return None if wake is None else max(0.0, wake - now)


def next_wait(workers, timeout, hang_timeout, on_hung, stack_of=None):
    """:func:`check_workers`, then the seconds to wait for the workers: until the next
    deadline, and at most :data:`SIGNAL_CHECK`."""
    wait = check_workers(workers, timeout, hang_timeout, on_hung, stack_of)
    return SIGNAL_CHECK if wait is None else min(wait, SIGNAL_CHECK)


def _earliest(a, b):
    return b if a is None else min(a, b)
