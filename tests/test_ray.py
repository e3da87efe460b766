"""RayMapData, RayRunner and RayExecutor: the mapper's guarantees on Ray actors.

One local Ray instance (2 CPUs, no dashboard) serves every test here; starting it takes a few
seconds, each executor's actors a fraction of one.
"""
import logging
import gc
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import dataflow as D
from dataflow.parallel.mapper import OK, WorkerTraceback
from dataflow.parallel.ray import RayExecutor, RayMapData, RayRunner
from dataflow.parallel.threads import Constant

from .conftest import import_later

ray = import_later("ray")   # at the first test, not at collection: these tests run last (conftest)
pytestmark = pytest.mark.ray

N = 120


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray instance for this file's tests, started once and shut down at the end if this
    fixture started it. Module scope (only this file uses it, so it starts once per session
    anyway): Ray's raylet, GCS and idle workers, which Ray starts and stops on its own, must not
    run under pytest during other files, whose leak checks count child processes."""
    started = not ray.is_initialized()
    before = set(os.listdir("/tmp/ray")) if os.path.isdir("/tmp/ray") else set()
    if started:
        temp_dir = tempfile.mkdtemp(prefix="dataflow-test-ray-")
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir)
    yield ray
    if started:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    after = set(os.listdir("/tmp/ray")) if os.path.isdir("/tmp/ray") else set()
    assert after <= before, f"Ray left {sorted(after - before)} in /tmp/ray"


@pytest.fixture(autouse=True)
def no_actors_left(request):
    """After each test with the Ray session: every actor a dataflow started is gone (closed, or
    its dataflow collected). The ``no_leaks`` fixture cannot watch these tests: Ray's own
    processes come and go under pytest."""
    yield
    if "ray_session" in request.fixturenames and ray.is_initialized():
        gc.collect()

        def ours():
            return [n for n in ray.util.list_named_actors() if n.startswith("dataflow-")]
        assert wait_until(lambda: not ours()), f"actors left: {ours()}"


def points(n=N):
    return D.DataFromList([[k] for k in range(n)], shuffle=False)


def square(dp):
    return [dp[0], dp[0] * dp[0]]


def serial(ds, func):
    ds.reset_state()
    return [r for r in (func(dp) for dp in ds) if r is not None]


def first_time(path):
    """True the first time it is called for ``path`` in any process (O_CREAT | O_EXCL)."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    return True


class DieOnce:
    """A map function whose actor exits (``os._exit(1)``) on datapoint ``at``, the first time."""

    def __init__(self, flag, at):
        self.flag, self.at = str(flag), at

    def __call__(self, dp):
        if dp[0] == self.at and first_time(self.flag):
            os._exit(1)
        return square(dp)


def wait_until(cond, seconds=15.0):
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# -- without a Ray session ---------------------------------------------------------------------
def _run_python(code, timeout):
    """Run ``code`` in a fresh interpreter that imports this checkout and is not told of any Ray
    cluster; fail with its stderr unless it exits with 0."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("RAY_ADDRESS", None)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=timeout)
    assert p.returncode == 0, p.stderr


@pytest.mark.timeout(60)
def test_dataflow_never_imports_ray_and_says_how_to_install_it():
    code = (
        "import sys\n"
        "import dataflow, dataflow.parallel.ray as r\n"
        "assert 'ray' not in sys.modules, 'importing dataflow imported ray'\n"
        "sys.modules['ray'] = None\n"                       # as if Ray were not installed
        "try:\n"
        "    r.RayMapData(dataflow.DataFromList([[1]]), 1, lambda d: d)\n"
        "except ImportError as e:\n"
        "    assert 'pip install \"dataflow-rt[ray]\"' in str(e), str(e)\n"
        "else:\n"
        "    raise SystemExit('no ImportError')\n")
    _run_python(code, timeout=50)


_KILLED_DRIVER = """
import os, subprocess, sys
import dataflow as D
import dataflow.parallel.ray as r
df = D.RayMapData(D.DataFromList([[i] for i in range(10 ** 6)], shuffle=False), 2,
                  lambda dp: [dp[0] * 2])
df.reset_state()
it = iter(df)
next(it)
assert "DATAFLOW_RAY_INSTANCE" not in os.environ    # Ray's processes have it, ours must not
mine = subprocess.Popen(["sleep", "120"], start_new_session=True)  # the user's, not Ray's
print(r._started_dir, mine.pid, flush=True)
sys.stdin.read()                    # until the test kills this process
"""


@pytest.mark.timeout(120)
def test_a_killed_driver_leaves_no_ray_process_and_no_files():
    """SIGKILL of a process that started a local Ray instance: Ray's agents, which outlive their
    raylet for a minute, are stopped, and the instance's directory is removed, by its reaper."""
    from dataflow.parallel import ray_reaper
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.Popen([sys.executable, "-c", _KILLED_DRIVER], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    mine = None
    try:
        temp_dir, mine = driver.stdout.readline().split()
        mine = int(mine)
        assert temp_dir and os.path.isdir(temp_dir), driver.wait(60)
        assert ray_reaper.instance_pids(temp_dir), "no process of Ray carries the mark"
        assert mine not in ray_reaper.instance_pids(temp_dir)
    finally:
        driver.kill()
        driver.wait()
        driver.stdin.close()
        driver.stdout.close()
    try:
        assert wait_until(lambda: not os.path.exists(temp_dir), seconds=30), \
            f"{temp_dir} is still there"
        assert ray_reaper.instance_pids(temp_dir) == []
        # the reaper ended Ray's processes, not one the user started after Ray (they carried
        # the mark, from the driver's environment: the reaper ended them too)
        os.kill(mine, 0)
    finally:
        if mine is not None:
            try:
                os.kill(mine, signal.SIGKILL)
            except ProcessLookupError:
                pass


_PRIVATE_INSTANCE = """
import os, socket, subprocess, sys
import psutil, ray                      # imported before dataflow starts the instance
import dataflow as D
from dataflow.parallel.ray import started_ray

with D.RayMapData(D.DataFromList([[i] for i in range(20)], shuffle=False), 2,
                  lambda dp: [dp[0] * 2], strict=True, ordered=True) as df:
    df.reset_state()
    assert list(df) == [[i * 2] for i in range(20)]
assert started_ray()
node = ray._private.worker._global_node
# Ray makes its own directory 0777; ours above it stays private (no one else may enter)
import stat, dataflow.parallel.ray as r
assert stat.S_IMODE(os.stat(r._started_dir).st_mode) == 0o700
assert os.path.dirname(node.get_temp_dir_path()) == r._started_dir
ours = {os.getpid()}
for p in psutil.process_iter(["pid", "cmdline"]):
    try:
        if node.get_temp_dir_path() in " ".join(p.info["cmdline"] or []):
            ours.add(p.pid)
    except psutil.Error:
        pass
listening = [c for c in psutil.net_connections("tcp") + psutil.net_connections("tcp6")
             if c.status == "LISTEN" and c.pid in ours]
assert listening, "no listening socket found"
for c in listening:
    assert c.laddr.ip in ("127.0.0.1", "::1", "::ffff:127.0.0.1"), c
others = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
          if a.family == socket.AF_INET and not a.address.startswith("127.")]
for c in listening:
    for ip in others:
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex((ip, c.laddr.port)) != 0, f"reached {ip}:{c.laddr.port}"
assert os.environ["RAY_AUTH_MODE"] == "token"
# One connection attempt (Ray retries a refused client for 20 s by default): refused for its token.
env = dict(os.environ, RAY_AUTH_TOKEN="0" * 64, RAY_gcs_server_port_wait_time_s="1")
join = subprocess.run([sys.executable, "-c", "import ray; ray.init(address=%r); print('JOINED')"
                       % node.gcs_address], env=env, capture_output=True, text=True, timeout=60)
assert "JOINED" not in join.stdout and join.returncode != 0, join.stdout
assert "InvalidAuthToken" in join.stderr, join.stderr[-2000:]
child = os.fork()
if child == 0:                      # a forked process (a worker, say) that outlives the driver
    sys.stdin.read()
    os._exit(0)
print(child, flush=True)
"""


def _ours():
    """Our Ray instances' directories and anything in /tmp/ray."""
    tmp = tempfile.gettempdir()
    found = {n for n in os.listdir(tmp) if n.startswith("dataflow-ray-")}
    if os.path.isdir(os.path.join(tmp, "ray")):
        found |= {"ray/" + n for n in os.listdir(os.path.join(tmp, "ray"))}
    return found


@pytest.mark.timeout(150)
def test_a_local_instance_we_start_is_private_and_leaves_nothing_at_exit(tmp_path):
    """The Ray instance RayMapData starts (no address given) listens on loopback only (none of
    its listening sockets is reachable on another interface) and refuses a client without its
    token, also when the user imported Ray first. At the driver's exit it is shut down and its
    files (logs, sockets) are removed: nothing in /tmp/ray, nothing of ours. A child the driver
    forked (a worker, say) that outlives it does not hold that exit: it inherited the write end
    of the reaper's pipe, so that the reaper saw no end of file and the exit waited 10 s."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("RAY_ADDRESS", None)
    before = _ours()
    with open(tmp_path / "stderr", "w+") as err:
        driver = subprocess.Popen([sys.executable, "-c", _PRIVATE_INSTANCE], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        child = None
        try:
            line = driver.stdout.readline()
            err.seek(0)
            assert line.strip().isdigit(), err.read()[-3000:]
            child = int(line)
            t0 = time.monotonic()
            assert driver.wait(60) == 0
            assert time.monotonic() - t0 < 8, "the driver's exit waited for its reaper"
            assert _ours() <= before, f"left behind: {sorted(_ours() - before)}"
        finally:
            driver.kill()
            driver.wait()
            driver.stdin.close()        # the child reads the same stdin: it ends now
            driver.stdout.close()
            if child:
                wait_until(lambda: not os.path.exists(f"/proc/{child}"), seconds=10)


@pytest.mark.timeout(30)
def test_debug_mode_runs_serially_without_ray():
    D.config.set_debug_mode(True)
    try:
        df = RayMapData(points(10), 2, square, strict=True)
    finally:
        D.config.set_debug_mode(False)
    assert df.executor == "serial"
    with df:
        df.reset_state()
        assert list(df) == serial(points(10), square)


def test_bad_arguments():
    with pytest.raises(ValueError):
        RayMapData(points(), 2, square, max_restarts=-1)
    with pytest.raises(ValueError):
        RayMapData(points(), 2, square, num_cpus_per_worker=0)
    with pytest.raises(ValueError):
        RayMapData(points(), 0, square)
    # beyond any machine, or NaN: reset_state() waited for ever for CPUs no node has, or failed
    # in Ray with a bare error
    for cpus in (10**20, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="num_cpus_per_worker must be"):
            RayMapData(points(), 2, square, num_cpus_per_worker=cpus)
        with pytest.raises(ValueError, match="num_cpus_per_worker must be"):
            RayRunner(points(), 2, num_cpus_per_worker=cpus)
    with pytest.raises(ValueError, match="timeout must be None or a positive number, got nan"):
        RayMapData(points(), 2, square, timeout=float("nan"))


# -- the mapper's guarantees on Ray -------------------------------------------------------------
@pytest.mark.timeout(60)
def test_strict_yields_each_datapoint_once_per_pass(ray_session):
    with RayMapData(points(), 2, square, strict=True) as df:
        assert df.executor == "ray"
        df.reset_state()
        want = sorted(serial(points(), square))
        for _ in range(2):
            assert sorted(df) == want


@pytest.mark.timeout(60)
def test_ordered_equals_serial(ray_session):
    def jitter(dp):
        time.sleep(0.002 * (dp[0] % 3))
        return square(dp)

    with RayMapData(points(), 2, jitter, strict=True, ordered=True, buffer_size=40) as df:
        df.reset_state()
        assert list(df) == serial(points(), square)


@pytest.mark.timeout(60)
def test_non_strict_pass_has_len_ds(ray_session):
    with RayMapData(points(50), 2, square) as df:
        df.reset_state()
        first, second = list(df), list(df)
    assert len(first) == len(second) == 50
    assert {tuple(x) for x in first + second} <= {tuple(x) for x in serial(points(50), square)}


@pytest.mark.timeout(60)
def test_arrays_arrive_writable_both_ways(ray_session):
    def add_one(dp):
        dp[1] += 1                  # the input array must be writable, as in a thread
        return [dp[0], dp[1], np.full((300, 300), dp[0], np.uint8)]

    src = D.DataFromList([[k, np.zeros(50_000)] for k in range(10)], shuffle=False)
    with RayMapData(src, 2, add_one, strict=True, ordered=True) as df:
        df.reset_state()
        out = list(df)
    assert [o[0] for o in out] == list(range(10))
    for k, a, b in out:
        assert a.flags.writeable and b.flags.writeable
        assert (a == 1).all() and (b == k).all()
        b[0, 0] = 7                 # the consumer may write too


def fail_on_7(dp):
    if dp[0] % 10 == 7:
        raise KeyError(f"boom at {dp[0]}")
    return square(dp)


@pytest.mark.timeout(60)
def test_error_has_original_type_and_worker_traceback(ray_session):
    with RayMapData(points(), 2, fail_on_7, strict=True) as df:
        df.reset_state()
        with pytest.raises(KeyError) as info:
            list(df)
    cause = info.value.__cause__
    assert isinstance(cause, WorkerTraceback)
    assert "fail_on_7" in cause.text and "boom at" in cause.text and "raise KeyError" in cause.text


class BadRecord(Exception):
    def __init__(self, code, detail):
        super().__init__(f"record {code}")
        self.code, self.detail = code, detail


def _bad_record_on_3(dp):
    if dp[0] == 3:
        import threading
        err = BadRecord(dp[0], "bad")
        err.lock = threading.Lock()             # does not pickle: dropped with a note
        raise err
    if dp[0] == 5:
        raise SystemExit(2)
    return dp


@pytest.mark.timeout(60)
def test_exception_keeps_class_args_attributes_and_system_exit_is_an_error(ray_session):
    """An exception whose __init__ takes other arguments, with an attribute that does not
    pickle, keeps its class, args and other attributes; SystemExit is a RuntimeError."""
    with RayMapData(points(8), 2, _bad_record_on_3, strict=True, ordered=True) as df:
        df.reset_state()
        with pytest.raises(BadRecord) as info:
            list(df)
    exc = info.value
    assert exc.args == ("record 3",) and (exc.code, exc.detail) == (3, "bad")
    assert not hasattr(exc, "lock") and any("lock" in n for n in exc.__notes__)
    assert isinstance(exc.__cause__, WorkerTraceback)
    with RayMapData(D.DataFromList([[5]]), 1, _bad_record_on_3, strict=True) as df:
        df.reset_state()
        with pytest.raises(RuntimeError, match=r"SystemExit\(2\) on datapoint #0"):
            list(df)


@pytest.mark.timeout(60)
def test_skip_and_replace(ray_session):
    with RayMapData(points(), 2, fail_on_7, strict=True, on_error="skip") as df:
        df.reset_state()
        out = list(df)
        assert sorted(out) == sorted(serial(points(), lambda dp: None if dp[0] % 10 == 7
                                            else square(dp)))
        assert df.num_skipped == N // 10
    with RayMapData(points(), 2, fail_on_7, strict=True, on_error="replace") as df:
        df.reset_state()
        assert len(list(df)) == N and df.num_replaced == N // 10
    with RayMapData(points(), 2, fail_on_7, strict=True, on_error="skip", max_errors=3) as df:
        df.reset_state()
        with pytest.raises(KeyError):
            list(df)


@pytest.mark.timeout(60)
def test_timeout_and_hang_warning_name_the_actor(ray_session, caplog):
    def slow(dp):
        if dp[0] == 3:
            time.sleep(30)
        return dp

    hang = D.config.hang_timeout()
    D.config.set_hang_timeout(0.3)
    try:
        with caplog.at_level(logging.WARNING, logger="dataflow"):
            # timeout counts from submission, actor start included: leave room for that
            with RayMapData(points(10), 2, slow, strict=True, timeout=3.0) as df:
                df.reset_state()
                with pytest.raises(TimeoutError, match=r"#3\b.* have been in Ray actor "
                                   r"dataflow-\S+ \(worker \d, pid \d+ on .*timeout=3.0"):
                    list(df)
    finally:
        D.config.set_hang_timeout(hang)
    assert any("hang_timeout=0.3" in r.getMessage() and "ray stack" in r.getMessage()
               for r in caplog.records)


# -- dead actors --------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_dead_actor_raises_worker_crashed_error(ray_session, tmp_path):
    with RayMapData(points(), 2, DieOnce(tmp_path / "died", 17), strict=True) as df:
        df.reset_state()
        with pytest.raises(D.WorkerCrashedError) as info:
            list(df)
    err = info.value
    assert 17 in err.datapoints
    msg = str(err)
    assert "Ray actor dataflow-" in msg and "#17" in msg and "died" in msg, msg
    assert err.pid is None or err.pid > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("ordered", [False, True])
def test_dead_actor_is_restarted_and_the_pass_is_exactly_once(ray_session, tmp_path, caplog,
                                                               ordered):
    func = DieOnce(tmp_path / "died", 17)
    with caplog.at_level(logging.WARNING, logger="dataflow"):
        with RayMapData(points(), 2, func, strict=True, ordered=ordered, max_restarts=1) as df:
            df.reset_state()
            out = list(df)
            assert df._exec.restarts == 1
            again = list(df)
    want = serial(points(), square)
    assert (out if ordered else sorted(out)) == want
    assert sorted(again) == want
    assert any("restart 1 of 1" in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(60)
def test_second_death_exceeds_max_restarts(ray_session, tmp_path):
    def die_twice(dp):
        if dp[0] in (17, 60) and first_time(str(tmp_path / f"died-{dp[0]}")):
            os._exit(1)
        return square(dp)

    with RayMapData(points(), 2, die_twice, strict=True, ordered=True, max_restarts=1) as df:
        df.reset_state()
        with pytest.raises(D.WorkerCrashedError, match="max_restarts=1"):
            list(df)


def _cannot_load():
    raise ImportError("no module named mypipeline (simulated)")


class Unloadable:
    """A map function that cannot be unpickled where it runs (its module missing there, say)."""

    def __reduce__(self):
        return _cannot_load, ()

    def __call__(self, dp):
        return dp


@pytest.mark.timeout(60)
def test_actor_that_cannot_be_created_is_not_restarted(ray_session):
    with RayMapData(points(10), 2, Unloadable(), strict=True, max_restarts=3) as df:
        df.reset_state()
        with pytest.raises(D.WorkerCrashedError, match="could not be created") as info:
            list(df)
        assert df._exec.restarts == 0
    assert "no module named mypipeline (simulated)" in str(info.value)


# -- runner, make_func, shutdown ----------------------------------------------------------------
@pytest.mark.timeout(60)
def test_runner_yields_len_ds_per_pass(ray_session):
    with RayRunner(points(30), 2, num_prefetch=10) as r:
        assert r.executor == "ray" and len(r) == 30
        r.reset_state()
        for _ in range(3):
            out = list(r)
            assert len(out) == 30
            assert all(0 <= dp[0] < 30 for dp in out)


class BrokenSource(D.DataFlow):
    def reset_state(self):
        raise OSError("cannot open the shard")

    def __iter__(self):
        yield [0]

    def __len__(self):
        return 1


@pytest.mark.timeout(60)
def test_runner_make_func_error_keeps_its_type(ray_session):
    with RayRunner(BrokenSource(), 1) as r:
        r.reset_state()
        with pytest.raises(OSError, match="cannot open the shard"):
            list(r)


@pytest.mark.timeout(60)
def square_then_block(dp):
    """``square`` for datapoint 0; every later one blocks for 30 s (work a close() must not
    wait for)."""
    if dp[0]:
        time.sleep(30)
    return square(dp)


def test_close_kills_our_actors(ray_session):
    df = RayMapData(points(), 2, square_then_block, strict=True)
    df.reset_state()
    ex = df._exec
    names = ex.actor_names
    handles = [s.actor for s in ex._slots]
    assert set(names) <= set(ray.util.list_named_actors())
    it = iter(df)
    next(it)                                # the actors are now inside 30 s map calls
    t0 = time.monotonic()
    df.close()
    assert time.monotonic() - t0 < 10       # it did not wait for the calls in flight
    it.close()
    assert wait_until(lambda: not set(names) & set(ray.util.list_named_actors())), \
        ray.util.list_named_actors()
    for h in handles:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(h.info.remote(), timeout=15)
    assert ray.is_initialized()             # close() never shuts Ray down


@pytest.mark.timeout(60)
def test_executor_contract_directly(ray_session):
    ex = RayExecutor(2, Constant(square))
    try:
        assert ex.kind == "ray"
        for i in range(0, 20, 5):
            ex.submit(0, [(s, s, [s]) for s in range(i, i + 5)])
        got = []
        while len(got) < 20:
            results, busy = ex.get(timeout=30)
            assert busy >= 0
            got += results
        assert sorted(got) == [(s, OK, [s, s * s]) for s in range(20)]
    finally:
        ex.close()
        ex.close()                          # idempotent


@pytest.mark.timeout(60)
def test_small_buffer_for_many_actors_is_reported(ray_session, caplog):
    # 1 ms a datapoint wants chunks of 20 (CHUNK_SECONDS); buffer_size=4 for 2 actors fits 1.
    # (The warning needs a chunk 4 times what fits: up to 5 ms a datapoint on a busy machine.)
    def slow(dp):
        time.sleep(0.001)
        return dp

    with caplog.at_level(logging.WARNING, logger="dataflow"):
        with RayMapData(points(80), 2, slow, strict=True, buffer_size=4) as df:
            df.reset_state()
            assert len(list(df)) == 80
    assert any("use buffer_size >=" in r.getMessage() for r in caplog.records)


def _short_of_cpus(records):
    return [r.getMessage() for r in records if "Ray cluster has" in r.getMessage()]


def test_a_pipeline_made_right_after_one_was_closed_does_not_report_missing_cpus(
        ray_session, caplog):
    # ray.kill returns before Ray frees the actors' CPUs: a training loop that makes a new
    # pipeline for each epoch right after closing the last one was told, every epoch, that the
    # cluster had no CPU free
    with caplog.at_level(logging.WARNING, logger="dataflow"):
        for _ in range(2):
            with RayMapData(points(8), 2, square, strict=True) as df:
                df.reset_state()
                assert len(list(df)) == 8
    assert _short_of_cpus(caplog.records) == []


def test_a_pipeline_whose_cpus_another_one_holds_is_reported(ray_session, caplog):
    with RayMapData(points(8), 2, square, strict=True) as holder:
        holder.reset_state()
        assert len(list(holder)) == 8          # its actors are up and hold both CPUs
        # ... in Ray's view of the cluster too, which lags
        assert wait_until(lambda: ray_session.available_resources().get("CPU", 0) == 0,
                          seconds=30), ray_session.available_resources()
        with caplog.at_level(logging.WARNING, logger="dataflow"):
            waiting = RayMapData(points(8), 1, square, strict=True)
            try:
                waiting.reset_state()              # starts its actor, which must wait
            finally:
                waiting.close()
    assert _short_of_cpus(caplog.records) == [
        "1 Ray actors need 1 CPUs but the Ray cluster has 0 free now (of 2); the rest wait "
        "until CPUs are freed or the cluster grows, and the datapoints dealt to them wait with "
        "them"]


def test_augmentors_give_the_serial_images(ray_session):
    """Image augmentors draw from the datapoint's stream in Ray actors too (issue 17)."""
    from dataflow import imgaug
    rs = np.random.RandomState(0)
    src = [[rs.randint(0, 256, (20, 24, 3)).astype(np.uint8), k] for k in range(24)]
    augs = [imgaug.RandomCrop((12, 16)), imgaug.BrightnessScale((0.5, 1.5)),
            imgaug.Flip(horiz=True)]
    D.set_seed(7)
    try:
        want = serial(D.MapData(D.DataFromList(src, shuffle=False), D.ops.Augment(augs)),
                      lambda dp: dp)
        df = RayMapData(D.DataFromList(src, shuffle=False), 2, D.ops.Augment(augs),
                        strict=True, ordered=True)
        df.reset_state()
        try:
            got = list(df)
        finally:
            df.close()
    finally:
        D.set_seed(None)
    assert [dp[1] for dp in got] == list(range(24))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a[0], b[0])
    D.set_seed(8)        # another seed gives other draws: the comparison above means something
    try:
        other = serial(D.MapData(D.DataFromList(src, shuffle=False), D.ops.Augment(augs)),
                       lambda dp: dp)
    finally:
        D.set_seed(None)
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(want, other))


def _noisy(dp):
    from dataflow import rng
    return [dp[0], int(rng.datapoint_rng().integers(1 << 30))]


def test_state_of_a_thread_map_resumes_on_ray(ray_session):
    """Checkpoint (issue 18): a state saved from 3 threads loads into 2 Ray actors, and the
    resumed stream is the uninterrupted one."""
    import json

    def build(kind):
        src = D.DataFromList([[k] for k in range(30)])
        if kind == "ray":
            m = RayMapData(src, 2, _noisy, strict=True, ordered=True, buffer_size=8)
        else:
            m = D.MultiThreadMapData(src, 3, _noisy, strict=True, ordered=True, buffer_size=9)
        return D.BatchData(m, 4)

    def batches(df):
        return [b[1].tolist() for b in df]

    D.set_seed(3)
    df = build("threads")
    df.reset_state()
    ref = batches(df) + batches(df)
    df.close()
    D.set_seed(3)
    df = build("threads")
    df.reset_state()
    it = iter(df)
    got = [next(it)[1].tolist() for _ in range(5)]
    state = json.loads(json.dumps(df.state_dict()))
    df.close()
    D.set_seed(3)
    df = build("ray")
    df.load_state_dict(state)
    df.reset_state()
    got += batches(df) + batches(df)
    df.close()
    D.set_seed(None)
    assert got == ref


@pytest.mark.timeout(120)
def test_state_of_process_copies_resumes_in_ray_actors_and_back(ray_session):
    """A state of process copies (a runner) loads into as many Ray actors, each copy continuing
    its own stream, and back; a RayRunner with another number of copies refuses it."""
    from tests import test_checkpoint_runners as ckr
    _, made = ckr.uninterrupted("processes", 4)
    D.set_seed(ckr.SEED)
    df = ckr.build("processes")
    df.reset_state()
    got, p = ckr.take(df, 27, 3)
    state = ckr.through_json(df.state_dict())
    df.close()
    D.set_seed(ckr.SEED)
    with RayRunner(ckr.copy_df(True), 2, num_prefetch=4) as r:
        r.load_state_dict(state)
        r.reset_state()
        more, q = ckr.take(r, 19, 3 - p)     # finishes pass 1, then 6 of pass 2
        got += more
        state = ckr.through_json(r.state_dict())
    with pytest.raises(ValueError, match="num_workers=2.*num_workers=3"):
        RayRunner(ckr.copy_df(True), 3).load_state_dict(state)
    D.set_seed(ckr.SEED)
    df = ckr.build("processes")
    df.load_state_dict(state)
    df.reset_state()
    try:
        got += [dp for _ in range(p + q, 3) for dp in df]
    finally:
        df.close()
    assert len(got) == 3 * ckr.N
    ckr.check_copies(got, made)


@pytest.mark.parametrize("bad", [123, b"host:6379", ["host:6379"]])
def test_an_address_that_is_no_string_is_refused_when_built(bad):
    # Ray's own error came at the first pass: "argument of type 'int' is not iterable"
    for make in (lambda: D.RayMapData(D.DataFromList([[1]]), 1, lambda d: d, address=bad),
                 lambda: D.RayRunner(D.DataFromList([[1]]), 1, address=bad)):
        with pytest.raises(TypeError, match=r"address must be None or a Ray address string"):
            make()


def test_address_local_starts_the_private_instance(monkeypatch):
    # "local" (argument or $RAY_ADDRESS) asks for a new local instance: ours, on loopback in a
    # private directory, not Ray's default one listening on every interface
    from dataflow.parallel import ray as dray
    calls = []

    class FakeRay:
        def is_initialized(self):
            return False

        def init(self, **kwargs):
            calls.append(kwargs)

    monkeypatch.setattr(dray, "import_ray", lambda: FakeRay())
    monkeypatch.setattr(dray, "_private_local_instance", lambda ray: calls.append("private"))
    monkeypatch.setattr(dray.atexit, "register", lambda *a: None)
    monkeypatch.setattr(dray, "_started_ray", False)
    monkeypatch.setattr(dray, "_started_dir", None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    dray.ensure_ray("local")
    monkeypatch.setenv("RAY_ADDRESS", "local")
    dray.ensure_ray()
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    dray.ensure_ray()
    assert calls[0] == "private" and "_temp_dir" in calls[1]
    assert calls[2] == "private" and "_temp_dir" in calls[3]
    assert calls[4] == {"address": None}
    for d in (calls[1]["_temp_dir"], calls[3]["_temp_dir"]):
        assert os.path.basename(d) == "ray"         # inside our private directory
        os.rmdir(os.path.dirname(d))
