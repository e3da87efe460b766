"""Harness side of a family's fork server (see zygote.py): start it, run one measurement, kill hangs.

Imports no numpy and nothing of the systems: the harness process only schedules and reports.
"""
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_WHERE = {"starting": "in startup, before the first datapoint",
          "started": "in the measured loop", "measured": "in teardown"}


class ServerDied(Exception):
    pass


class Server:
    """One fork server (``python -m benchmarks.zygote FAMILY``), its stderr kept in a log file."""

    def __init__(self, family, dataflow_module, workloads=()):
        self.family = family
        self.dataflow_module = dataflow_module
        self.workloads = [str(w) for w in workloads]    # what the server prepares (img: JPEGs)
        self.proc = None
        self.ready = None        # the READY payload
        self.failure = None      # why the family is unavailable
        self.log = tempfile.TemporaryFile(prefix="bench-%s-" % family)
        self._buf = b""
        self._pid = None         # the child of the run in progress

    # -------------------------------------------------------------------------------- lifecycle
    def start(self):
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._buf = b""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.zygote", self.family, self.dataflow_module,
             ",".join(self.workloads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, cwd=ROOT, env=env,
            start_new_session=True)

    def wait_ready(self, timeout):
        msg = self._read(time.monotonic() + timeout)
        if msg is None:
            self.failure = "its fork server did not get ready within %.0f s" % timeout
            self.stop()
        elif msg[0] == "READY":
            self.ready = msg[1]
        elif msg[0] == "FAIL":
            self.failure = "import failed: %s" % msg[1]["error"]
            self.stop()
        else:
            self.failure = "its fork server died while importing: %s" % self.log_tail(0, 600)
            self.stop()
        return self.ready is not None

    def stop(self):
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write(b'{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if self.proc.poll() is None:
            _killpg(self.proc.pid)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.proc = None

    def restart(self, timeout):
        self.stop()
        self.ready = None
        self.start()
        return self.wait_ready(timeout)

    # -------------------------------------------------------------------------------- protocol
    def _read(self, deadline):
        """The next (tag, payload), ('EOF', None) if the server died, None at the deadline."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return ("EOF", None)
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        tag, _, payload = line.decode("utf-8", "replace").partition(" ")
        try:
            return tag, json.loads(payload)
        except ValueError:
            return "NOISE", line

    def log_size(self):
        return os.fstat(self.log.fileno()).st_size

    def log_tail(self, since, limit=1500):
        end = self.log_size()
        start = max(since, end - limit)
        return os.pread(self.log.fileno(), end - start, start).decode("utf-8", "replace").strip()

    def run(self, cmd, timeout, teardown_cap, exit_grace):
        """One measurement in a fresh child. Returns a record with a ``status``:

        ok, hung (killed at ``timeout`` before the result; ``stage`` says where), crashed
        (an exception, a signal, or the fork server died), bad-output (first datapoint wrong).
        """
        log_from = self.log_size()
        rec = {"status": None, "notes": []}
        try:
            self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
            self.proc.stdin.flush()
        except OSError as exc:
            raise ServerDied("cannot talk to the fork server: %s" % exc) from None
        deadline = time.monotonic() + timeout
        try:
            return self._follow(cmd, rec, log_from, timeout, teardown_cap, exit_grace, deadline)
        except KeyboardInterrupt:
            if self._pid is not None:
                _killpg(self._pid)      # do not leave the running child behind
            raise

    def _follow(self, cmd, rec, log_from, timeout, teardown_cap, exit_grace, deadline):
        pid = self._pid = None
        stage = "starting"
        killed = None
        result = error = None
        while True:
            msg = self._read(deadline)
            if msg is None:                           # a deadline passed: kill the child's group
                if killed is not None or pid is None:
                    # killed already and still no EXIT, or never forked: the server is wedged
                    if pid is not None:
                        _killpg(pid)
                    rec["status"] = rec["status"] or "hung"
                    rec["stage"] = stage
                    rec["error"] = "the fork server stopped answering"
                    self.stop()
                    raise ServerDied(rec)
                if result is not None or error is not None:
                    killed = "exit"
                    rec["notes"].append("process exit hung after the result (killed after %.0f s)"
                                        % exit_grace)
                elif stage == "measured":
                    killed = "teardown"
                else:
                    killed = "run"
                # The child alone: the fork server then ends the rest of its process group
                # the way that leaves nothing in /dev/shm (zygote._end_group).
                _kill(pid)
                deadline = time.monotonic() + 10
                continue
            tag, payload = msg
            if tag == "EOF":
                rec.update(status="crashed", stage=stage, error="the fork server died")
                self.stop()
                raise ServerDied(rec)
            if tag == "PID":
                pid = self._pid = payload["pid"]
            elif tag == "STAGE":
                stage = payload["stage"]
                rec.update({k: v for k, v in payload.items() if k != "stage"})
                if stage == "measured":
                    deadline = min(deadline, time.monotonic() + teardown_cap)
            elif tag in ("RESULT", "ERROR"):
                if tag == "RESULT":
                    result = payload
                else:
                    error = payload
                deadline = time.monotonic() + exit_grace
            elif tag == "EXIT":
                rec["exit"] = payload
                self._pid = None
                if payload.get("leftovers"):
                    rec["notes"].append("processes of the run were still alive after it exited "
                                        "(killed)")
                break
        if result is not None:
            rec.update(result)
            rec["status"] = "ok" if result.get("output_ok", True) else "bad-output"
        elif error is not None:
            rec.update(status="crashed", stage=stage, error=error["error"],
                       traceback=error["traceback"])
        elif killed == "teardown":
            # Throughput and startup are known; teardown is censored at the cap.
            rec.update(status="ok", teardown_s=teardown_cap, teardown_censored=True)
            rec["notes"].append("teardown did not finish within %.1f s (killed)" % teardown_cap)
            _complete_from_stages(rec, cmd)
        elif killed == "run":
            rec.update(status="hung", stage=stage,
                       error="no result within %.0f s (killed %s)" % (timeout, _WHERE[stage]))
        else:
            ex = rec.get("exit", {})
            how = ("signal %s" % ex["signal"]) if ex.get("signal") else "exit code %s" % ex.get("code")
            rec.update(status="crashed", stage=stage, error="the run died (%s)" % how)
        if rec["status"] != "ok":
            rec["stderr_tail"] = self.log_tail(log_from)
        return rec


def _complete_from_stages(rec, cmd):
    """A run killed in teardown: derive throughput from the STAGE messages."""
    rec["count"] = rec.get("count", cmd["count"])    # the measured window's, if it ended early
    if rec.get("measure_s"):
        rec["throughput_dps"] = rec["count"] / rec["measure_s"]
        rec["mbps"] = rec.get("bytes", 0) / rec["measure_s"] / 1e6
    rec["teardown_kind"] = "killed"


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _killpg(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
