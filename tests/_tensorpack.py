"""Run code against tensorpack 0.11 in a subprocess.

tensorpack reads ``TENSORPACK_SERIALIZE`` once, at import, so each encoding needs its own
interpreter; a subprocess also keeps tensorpack's monkey-patching of msgpack out of ours.

Importing tensorpack costs 0.6 s of CPU, more than most snippets run. :func:`run_tensorpack`
therefore asks a *zygote*: one interpreter per encoding, started on first use, that has imported
tensorpack and forks a child for each snippet. The child is a fresh copy of an interpreter that
has just imported tensorpack, which is what a new subprocess would be by the snippet's first
line; it runs the snippet as ``__main__`` and exits as a script does (atexit handlers run).
The zygotes end with this process (:func:`zygote_pids` lets the leak check tell them apart)."""
import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading

PRELUDE = """
import numpy as np
np.object = object      # removed in numpy 1.24; tensorpack 0.11's NumpySerializer still uses it
"""

# The zygote: reads one JSON request per line on stdin ({"code", "cwd", "out", "err"}), forks,
# and writes {"pid"} when the child starts and {"rc"} when it has ended on the reply pipe (fd
# argv[1]). The child writes its stdout and stderr to the files named in the request.
ZYGOTE = PRELUDE + """
import json, os, sys, traceback
import tensorpack.dataflow, tensorpack.utils.serialize
replies = os.fdopen(int(sys.argv[1]), "w")


def child(request):
    for fd, path in ((1, request["out"]), (2, request["err"])):
        f = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    if request["cwd"]:
        os.chdir(request["cwd"])
    try:
        exec(compile(request["code"], "<tensorpack snippet>", "exec"), {"__name__": "__main__"})
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1


for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        replies.close()
        rc = child(request)
        sys.stdout.flush()
        sys.stderr.flush()
        sys.exit(rc)            # out of the loop: the interpreter exits as a script's would
    replies.write(json.dumps({"pid": pid}) + "\\n")
    replies.flush()
    replies.write(json.dumps({"rc": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}) + "\\n")
    replies.flush()
"""

_zygotes = {}           # serialize -> _Zygote
_lock = threading.Lock()


def zygote_pids():
    """The zygotes' process ids: long-lived helpers of this process, not leaks."""
    return {z.proc.pid for z in _zygotes.values()}


def zygote_fds():
    """The file descriptors this process holds for them (pipes, their log)."""
    return {str(fd) for z in _zygotes.values()
            for fd in (z.proc.stdin.fileno(), z.replies, z.log.fileno())}


def _env(serialize):
    return dict(os.environ, TENSORPACK_SERIALIZE=serialize, PYTHONWARNINGS="ignore")


class _Zygote:
    def __init__(self, serialize):
        read_end, write_end = os.pipe()
        self.log = tempfile.TemporaryFile("w+")          # its own output, for a failed start
        self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE, str(write_end)],
                                     env=_env(serialize), stdin=subprocess.PIPE, text=True,
                                     stdout=self.log, stderr=self.log, pass_fds=(write_end,))
        os.close(write_end)
        self.replies, self.pending = read_end, b""

    def ask(self, request):
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()

    def reply(self, within_s):
        """The next reply, or None if none came within ``within_s`` seconds."""
        while b"\n" not in self.pending:
            if not select.select([self.replies], [], [], within_s)[0]:
                return None
            chunk = os.read(self.replies, 4096)
            if not chunk:
                self.log.seek(0)
                raise AssertionError(f"the tensorpack zygote exited:\n{self.log.read()[-3000:]}")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def stop(self, kill=False):
        if kill:
            self.proc.kill()
        self.proc.stdin.close()         # its loop ends, and so does it
        self.proc.wait(30)
        os.close(self.replies)
        self.log.close()


def run_tensorpack(code, serialize="pickle", timeout=60, cwd=None):
    """Run ``code`` (a script; tensorpack already imported, as if by its first line) with
    ``TENSORPACK_SERIALIZE`` set to ``serialize``; return its stdout. Raises AssertionError with
    its stderr if it fails or runs past ``timeout`` seconds."""
    with _lock, tempfile.TemporaryDirectory(prefix="dataflow-test-tp-") as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        for path in (out, err):
            open(path, "w").close()
        if serialize not in _zygotes:
            _zygotes[serialize] = _Zygote(serialize)
        zygote = _zygotes[serialize]
        try:
            zygote.ask({"code": PRELUDE + textwrap.dedent(code), "out": out, "err": err,
                        "cwd": None if cwd is None else str(cwd)})
            started = zygote.reply(60)
            if started is None:
                raise AssertionError("the tensorpack zygote did not start the snippet in 60 s")
            pid = started["pid"]
            done = zygote.reply(timeout)
            if done is None:
                os.kill(pid, signal.SIGKILL)
                zygote.reply(30)
        except BaseException:           # a reply out of step: the next call starts a new one
            del _zygotes[serialize]
            zygote.stop(kill=True)
            raise
        with open(out) as f:
            stdout = f.read()
        with open(err) as f:
            stderr = f.read()
    assert done is not None, f"tensorpack snippet ran past {timeout} s:\n{stderr[-3000:]}"
    assert done["rc"] == 0, f"tensorpack snippet failed:\n{stderr[-3000:]}"
    return stdout


@atexit.register
def _stop_zygotes():
    while _zygotes:
        _zygotes.popitem()[1].stop()


def start_tensorpack(code, serialize="pickle", cwd=None):
    """Start ``code`` in a tensorpack subprocess and return the ``Popen`` (the caller stops it).
    Its output is discarded: a long-running sender's progress bar would fill a pipe."""
    return subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
                            env=_env(serialize), cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
