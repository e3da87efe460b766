"""The reaper of a local Ray instance we start: what is left of it goes when its driver dies.

A local Ray instance belongs to the process that started it (see :mod:`.ray`). When that process
exits normally, ``ray.shutdown()`` stops the instance and its temporary directory is removed. When
it is killed (SIGKILL, the OOM killer), nothing of it runs: Ray's GCS and raylet end with it, but
its agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) live on for a minute, adopted by
init, and the directory of its logs and sockets stays in ``/tmp`` for good.

:func:`start` runs this file as a small separate process (standard library only, run by path in
isolated mode, so it neither imports ``dataflow`` nor shares a process group with its driver).
It blocks on a pipe whose only write end the driver holds, and the kernel closes that end
however the driver ends. Then it stops every process of the instance (:func:`instance_pids`:
those holding a file of the directory open, or whose environment carries the instance's mark,
``DATAFLOW_RAY_INSTANCE=<directory>``, set by the driver while Ray starts and absent from the
reaper's own environment and from the driver's afterwards), SIGTERM first and SIGKILL for what is left after
:data:`GRACE` seconds, removes the directory, and exits.
After a normal exit it finds nothing left to stop. Processes are found through ``/proc`` (Linux);
elsewhere the reaper only removes the directory.
"""
import os
import shutil
import signal
import subprocess
import sys
import time

MARK = "DATAFLOW_RAY_INSTANCE"

# Seconds a process has to end on SIGTERM before it gets SIGKILL.
GRACE = 2.0

# The write ends of the reapers' pipes. A child forked by the driver (a worker process, say)
# would hold one open, so that the reaper would not see the end of file while it lives: the
# driver's exit waited for it. In a forked child they are pointed at /dev/null.
_write_ends = set()


def _release_in_child():
    if not _write_ends:
        return
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in _write_ends:
        os.dup2(null, fd)
    os.close(null)
    _write_ends.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_release_in_child)


def start(temp_dir):
    """Start the reaper of the instance whose files go to ``temp_dir``, and mark this process's
    environment so that every process Ray starts from now on carries the mark (until
    :func:`unmark`, called once Ray has started). Returns the
    reaper's ``Popen``: keep it referenced for as long as the instance runs (closing its stdin
    tells the reaper the instance is over); :func:`stop` ends it."""
    env = {k: v for k, v in os.environ.items() if k != MARK}
    reaper = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), temp_dir,
                               str(os.getpid())],
                              stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    os.environ[MARK] = temp_dir
    _write_ends.add(reaper.stdin.fileno())
    return reaper


def unmark():
    """Take the mark out of this process's environment once Ray has started its processes
    (the GCS and the raylet, which start the instance's other processes with their own
    environment): a process this one starts afterwards (the user's, a fork server) is not the
    instance's, and the reaper must not stop it."""
    os.environ.pop(MARK, None)


def stop(reaper, timeout=10.0):
    """Tell the reaper that the instance is over (it has been shut down) and wait for it to
    end."""
    _write_ends.discard(reaper.stdin.fileno())
    reaper.stdin.close()
    try:
        reaper.wait(timeout)
    except subprocess.TimeoutExpired:
        reaper.kill()
        reaper.wait()


def instance_pids(temp_dir, driver=None):
    """The processes, readable by this user, of the instance whose files go to ``temp_dir``:
    those whose environment carries its mark or that hold a file under ``temp_dir`` open (Ray's
    processes write their logs there), other than this one and the ``driver`` pid. Both tests
    are needed: Ray's agents overwrite their environment with their process title, and a process
    may not have opened a log yet."""
    mark = ("\0%s=%s\0" % (MARK, temp_dir)).encode()
    under = os.path.join(temp_dir, "")
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in (os.getpid(), driver):
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                marked = mark in b"\0" + f.read()
            fds = "/proc/%s/fd" % name
            marked = marked or any(os.readlink(os.path.join(fds, fd)).startswith(under)
                                   for fd in os.listdir(fds))
        except OSError:             # another user's, or gone
            continue
        if marked:
            found.append(int(name))
    return found


def reap(temp_dir, driver):
    """Stop every process of the instance of ``temp_dir`` but its ``driver`` (which is ending
    or gone: SIGTERM, then SIGKILL after :data:`GRACE` seconds), then remove ``temp_dir``."""
    if os.path.isdir("/proc"):
        for sig, wait in ((signal.SIGTERM, GRACE), (signal.SIGKILL, GRACE)):
            pids = instance_pids(temp_dir, driver)
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
            deadline = time.monotonic() + wait
            while pids and time.monotonic() < deadline:
                time.sleep(0.05)    # not ours to wait() for: Ray's processes' parent is gone
                pids = instance_pids(temp_dir, driver)
            if not pids:
                break
    shutil.rmtree(temp_dir, ignore_errors=True)


def main():
    temp_dir, driver = sys.argv[1], int(sys.argv[2])
    sys.stdin.buffer.read()         # returns at end of file: the driver has ended or let go
    reap(temp_dir, driver)


if __name__ == "__main__":
    main()
