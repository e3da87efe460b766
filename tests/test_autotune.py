"""Autotuning of the number of workers: the policy on synthetic measurements, the executors'
add/retire, exactly-once under resizing, and real pipelines that grow or do not."""
import collections
import os
import random
import sys
import time

import pytest

import dataflow as D
from dataflow.parallel.autotune import AutoTuner, available_cpus
from dataflow.parallel.processes import ProcessExecutor
from dataflow.parallel.threads import Constant, ThreadExecutor

S = sys.modules["dataflow.stats"]

pytestmark = [pytest.mark.usefixtures("no_leaks"), pytest.mark.timeout(120)]

needs_2_cpus = pytest.mark.skipif(available_cpus() < 2, reason="needs 2 CPUs to grow")


def numbers(n):
    return D.DataFromList([[i] for i in range(n)], shuffle=False)


# ------------------------------------------------------------------------------ the policy
class Sim:
    """Drives an AutoTuner with the measurements of a simple model: ``work`` seconds per
    datapoint per worker, a consumer that needs ``consume`` seconds per datapoint, and pools
    that stop scaling at ``scale_limit`` workers (a GIL, or no core left)."""

    def __init__(self, work, consume, max_workers=8, scale_limit=None, noise=0.0, seed=0):
        self.t = 0.0
        self.tuner = AutoTuner(max_workers=max_workers, clock=lambda: self.t)
        self.work, self.consume = work, consume
        self.scale_limit = scale_limit or max_workers
        self.rng = random.Random(seed)
        self.noise = noise
        self.trace = []

    def run(self, seconds, step=0.01):
        end = self.t + seconds
        while self.t < end:
            n = self.tuner.workers
            capacity = min(n, self.scale_limit) / self.work       # datapoints/s the pool does
            rate = min(capacity, 1 / self.consume)
            rate *= 1 + self.noise * (self.rng.random() - 0.5)
            wait = max(0.0, 1 - rate * self.consume)               # consumer waiting
            busy = rate * self.work * (n / min(n, self.scale_limit))   # a GIL inflates busy
            self.t += step
            if self.tuner.observe(self.t, wait * step, rate * step, min(busy, n) * step):
                self.tuner.decide(self.t, in_flight=0)
            self.trace.append((self.t, self.tuner.workers))
        return self

    def changes_after(self, t):
        return [d for d in self.tuner.decisions if d["t"] > t and d["from"] != d["to"]]


def test_grows_while_the_workers_are_the_bottleneck():
    sim = Sim(work=0.004, consume=0.0002, max_workers=8).run(10)
    assert sim.tuner.workers == 8
    assert all(d["to"] >= d["from"] for d in sim.tuner.decisions)


def test_stops_at_the_consumer_speed():
    # Workers do 250/s each; the consumer takes 1000/s: 4 workers suffice, a 5th cannot help.
    sim = Sim(work=0.004, consume=0.001, max_workers=8).run(10)
    assert sim.tuner.workers in (4, 5)
    assert not sim.changes_after(5)


def test_does_not_grow_when_the_consumer_is_slow():
    sim = Sim(work=0.001, consume=0.005, max_workers=8).run(10)
    assert sim.tuner.workers == 1
    assert sim.tuner.decisions == []


def feed(tuner, t, seconds, wait, busy, rate=1000.0, step=0.01):
    """Windows of ``wait`` and ``busy`` fractions (busy: of each worker) from ``t`` for
    ``seconds``."""
    end = t + seconds
    while t < end:
        t += step
        if tuner.observe(t, wait * step, rate * step, busy * tuner.workers * step):
            tuner.decide(t, in_flight=0)
    return t


def test_the_pipeline_filling_adds_no_worker():
    # The first window: the consumer waits for the first full chunks (15 %) though it is the
    # slower side; afterwards it never waits. No worker is added (one was, and taken back).
    tuner = AutoTuner(max_workers=8, clock=lambda: 0.0)
    t = feed(tuner, 0.0, 0.06, wait=0.15, busy=0.8)
    t = feed(tuner, t, 3.0, wait=0.0, busy=0.8)
    assert tuner.workers == 1 and tuner.decisions == []


def test_the_first_grow_needs_two_windows_then_one_suffices():
    tuner = AutoTuner(max_workers=8, clock=lambda: 0.0)
    t = feed(tuner, 0.0, 0.06, wait=0.5, busy=1.0)
    assert tuner.workers == 1                  # one window: maybe the pipeline filling
    t = feed(tuner, t, 0.08, wait=0.5, busy=1.0)
    assert tuner.workers == 2
    # the trial gains: worker 2 is kept, and as the consumer still waits, worker 3 added at once
    t = feed(tuner, t, 0.3, wait=0.5, busy=1.0, rate=2000.0)
    assert [(d["from"], d["to"]) for d in tuner.decisions] == [(1, 2), (2, 2), (2, 3)]


def test_backs_off_when_a_worker_brings_nothing():
    # Like a GIL-bound map in threads: one worker is all the pool can use.
    sim = Sim(work=0.002, consume=0.0001, max_workers=8, scale_limit=1).run(20)
    assert sim.tuner.workers == 1 and sim.tuner.ceiling == 1
    assert [(d["from"], d["to"]) for d in sim.tuner.decisions] == [(1, 2), (2, 1)]


def test_settles_and_does_not_oscillate_with_noise():
    for seed in range(5):
        sim = Sim(work=0.004, consume=0.0013, max_workers=8, noise=0.1, seed=seed).run(30)
        assert not sim.changes_after(5), sim.tuner.decisions
        assert sim.tuner.settled
        assert 3 <= sim.tuner.workers <= 4


def test_shrinks_when_the_work_gets_lighter():
    sim = Sim(work=0.004, consume=0.0005, max_workers=8).run(8)
    assert sim.tuner.workers == 8
    sim.work = 0.0005                     # the pool now has far more than it needs
    sim.consume = 0.002
    sim.run(15)
    assert sim.tuner.workers <= 2
    assert not sim.changes_after(20)


def test_limits():
    t = AutoTuner(max_workers=3, start=10)
    assert t.workers == 3 and t.max_workers == 3
    assert AutoTuner().max_workers == available_cpus()
    assert AutoTuner(max_workers=4, min_workers=2).workers == 2


# ------------------------------------------------------------------------------ executors
def _collect(ex, n_items):
    got = []
    while len(got) < n_items:
        results, _ = ex.get(10)
        got.extend(seq for seq, _, _ in results)
    return got


def slow_double(dp):
    time.sleep(0.001)
    return [dp[0] * 2]


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_executor_adds_and_retires_workers_without_losing_work(kind):
    ex = ThreadExecutor(1, Constant(slow_double)) if kind == "thread" else \
        ProcessExecutor(1, Constant(slow_double))
    try:
        seq, n = 0, 1
        sent = []
        for change in [+1, +1, -1, +1, -1, -1, -1, -1, +1]:
            items = [(seq + i, seq + i, [seq + i]) for i in range(10)]
            seq += 10
            sent += [s for s, _, _ in items]
            ex.submit(0, items[:5])
            (ex.add_worker if change > 0 else ex.retire_worker)()
            n = max(1, n + change)            # retiring below one is refused
            assert ex.num_workers == n
            ex.submit(0, items[5:])
        got = _collect(ex, len(sent))
        assert sorted(got) == sent
        states = collections.Counter(w["state"] for w in ex.worker_stats())
        assert states["running"] + states.get("retiring", 0) >= 1
    finally:
        ex.close()


def test_process_executor_stops_a_retired_worker_once_its_work_is_back():
    ex = ProcessExecutor(2, Constant(slow_double))
    try:
        ex.submit(0, [(i, i, [i]) for i in range(20)])
        ex.submit(0, [(i, i, [i]) for i in range(20, 40)])
        pids = set(ex.pids)
        ex.retire_worker()
        assert ex.num_workers == 1
        assert sorted(_collect(ex, 40)) == list(range(40))
        deadline = time.monotonic() + 5
        while len(ex.pids) > 1 and time.monotonic() < deadline:
            ex.submit(0, [(100, 100, [0])])
            _collect(ex, 1)
        assert len(ex.pids) == 1 and set(ex.pids) < pids
        assert [w["state"] for w in ex.worker_stats()].count("retired") == 1
        ex.add_worker()
        assert ex.num_workers == 2 and len(set(ex.pids)) == 2
    finally:
        ex.close()


# ------------------------------------------------------------------------------ exactly-once
class ScriptedTuner(AutoTuner):
    """Resizes the pool after every batch of results, at random: the worst case for the
    mapper's guarantees."""

    def __init__(self, max_workers=4, seed=0):
        super().__init__(max_workers=max_workers)
        self.rng = random.Random(seed)
        self.changes = 0

    def observe(self, now, wait, results, busy):
        return True

    def decide(self, now, in_flight=0):
        n = self.workers
        delta = self.rng.choice([-1, 1]) if 1 < n < self.max_workers else (1 if n == 1 else -1)
        self.workers += delta
        self.changes += 1
        self._record(now, n, n + delta, "scripted")
        return delta


def jittery(dp):
    if dp[0] % 7 == 0:
        time.sleep(0.0005)
    return [dp[0], dp[0] * 3]


@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize("ordered", [True, False])
def test_exactly_once_under_resizing_strict(kind, ordered):
    cls = D.MultiThreadMapData if kind == "thread" else D.MultiProcessMapData
    with cls(numbers(600), "auto", jittery, strict=True, ordered=ordered, buffer_size=40) as df:
        df._tuner = ScriptedTuner(seed=hash((kind, ordered)) % 100)
        df.reset_state()
        for _ in range(2):
            out = [dp[0] for dp in df]
            assert len(out) == 600
            if ordered:
                assert out == list(range(600))
            else:
                assert sorted(out) == list(range(600))
        assert df._tuner.changes > 20
        st = D.stats(df)
    assert st["produced"] == 1200
    assert len(st["parallel"]["autotune"]["decisions"]) > 20


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_exactly_once_under_resizing_endless(kind):
    cls = D.MultiThreadMapData if kind == "thread" else D.MultiProcessMapData
    with cls(numbers(300), "auto", jittery, buffer_size=30) as df:
        df._tuner = ScriptedTuner(seed=3)
        df.reset_state()
        seen = collections.Counter()
        for _ in range(4):
            out = [dp[0] for dp in df]
            assert len(out) == 300
            seen.update(out)
        # Non-strict: 1200 results of an endless source of 300; in flight carries over, so
        # every datapoint is produced 4 times, give or take what the buffer holds.
        assert sum(seen.values()) == 1200
        assert all(3 <= seen[i] <= 5 for i in range(300))
        assert df._tuner.changes > 10


def test_mapdata_auto_keeps_its_output():
    def f(dp):
        return [dp[0] + 1]
    for mp in (False, True):
        with D.MapData(numbers(500), f, num_parallel_workers="auto",
                       python_multiprocessing=mp) as df:
            df._parallel._tuner = ScriptedTuner(seed=1)
            df.reset_state()
            assert [dp[0] for dp in df] == list(range(1, 501))
            assert df.executor == ("process" if mp else "thread")


def test_batchdata_per_batch_map_auto():
    with D.BatchData(numbers(100), 10, per_batch_map=lambda b: b,
                     num_parallel_workers="auto") as df:
        df.reset_state()
        batches = list(df)
        assert [int(b[0][0]) for b in batches] == list(range(0, 100, 10))
        assert "autotune" in D.stats(df)["parallel"]


class SpinSource(D.DataFlow):
    def __len__(self):
        return 200

    def __iter__(self):
        for i in range(200):
            yield spin([i])


def test_process_runner_auto():
    with D.MultiProcessRunner(SpinSource(), 50, "auto") as df:
        df.reset_state()
        assert sum(1 for _ in df) == 200
        st = D.stats(df)
    assert st["stage"] == "MultiProcessRunner(SpinSource)"
    assert "autotune" in st["parallel"] and st["parallel"]["results"] >= 200


def test_auto_is_accepted_where_it_can_work():
    for make in (lambda: D.MultiThreadMapData(numbers(5), "auto", jittery),
                 lambda: D.MultiProcessMapData(numbers(5), num_proc="auto", map_func=jittery),
                 lambda: D.MultiProcessMapAndBatchData(numbers(20), "auto", jittery, 5)):
        df = make()
        assert df._tuner is not None and df.num_workers == 1
    with pytest.raises(ValueError, match="an int from 1 to"):
        D.MultiThreadRunner(lambda: numbers(5), 10, "auto")
    with pytest.raises(ValueError, match='or "auto"'):
        D.MultiThreadMapData(numbers(5), "many", jittery)


# ------------------------------------------------------------------------------ real pipelines
def sleepy(dp):
    time.sleep(0.004)                     # releases the GIL: threads scale
    return dp


def spin(dp):
    s = 0
    for i in range(20000):
        s += i * i
    return [dp[0], s & 0xFF]


@needs_2_cpus
def test_autotune_grows_on_a_slow_map():
    with D.MultiThreadMapData(numbers(500), "auto", sleepy, strict=True, ordered=True) as df:
        df.reset_state()
        assert [dp[0] for dp in df] == list(range(500))
        st = D.stats(df)
    a = st["parallel"]["autotune"]
    assert a["workers"] >= 2 and st["parallel"]["workers"] >= 2
    grow = [d for d in a["decisions"] if d["to"] > d["from"]]
    assert grow and grow[0]["from"] == 1 and "consumer waited" in grow[0]["why"]
    assert "autotune:" in D.format_stats(st)


@needs_2_cpus
def test_autotune_grows_process_workers_on_python_work():
    with D.MultiProcessMapData(numbers(1500), "auto", spin, strict=True) as df:
        df.reset_state()
        assert sorted(dp[0] for dp in df) == list(range(1500))
        st = D.stats(df)
    a = st["parallel"]["autotune"]
    assert any(d["to"] > d["from"] for d in a["decisions"])


def test_autotune_does_not_grow_when_the_consumer_is_slow():
    with D.MultiThreadMapData(numbers(300), "auto", lambda dp: dp, strict=True) as df:
        df.reset_state()
        for _ in df:
            time.sleep(0.003)             # the consumer is the bottleneck
        st = D.stats(df)
    a = st["parallel"]["autotune"]
    assert a["workers"] == 1 and a["decisions"] == []
    assert st["bottleneck"]["stage"] == "consumer"


@needs_2_cpus
def test_autotune_settles_on_a_steady_workload():
    with D.MultiThreadMapData(numbers(100000), "auto", sleepy, strict=True) as df:
        df.reset_state()
        t0 = time.perf_counter()
        it = iter(df)
        while time.perf_counter() - t0 < 4.0:
            next(it)
        a = D.stats(df)["parallel"]["autotune"]
        it.close()
    late = [d for d in a["decisions"] if d["t"] > 2.0 and d["from"] != d["to"]]
    assert not late, a["decisions"]
    assert a["settled"]


# -- the CPU count: affinity, and the cgroup's CPU quota (containers) ---------------------------
@pytest.mark.parametrize("files, quota", [
    ({"cpu.max": "200000 100000\n"}, 2.0),                           # cgroup v2, --cpus=2
    ({"cpu.max": "150000 100000\n"}, 1.5),
    ({"cpu.max": "max 100000\n"}, None),                             # v2, no limit
    ({"cpu/cpu.cfs_quota_us": "50000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0.5),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({"cpu.max": "garbage"}, None),
    ({}, None),                                                      # no cgroup files
])
def test_cgroup_cpu_quota_reads_v1_and_v2(tmp_path, files, quota):
    from dataflow._helpers import cgroup_cpu_quota
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(str(tmp_path)) == quota


def test_worker_counts_follow_a_cpu_quota_below_the_cpus_in_sight(tmp_path, monkeypatch):
    import dataflow._helpers as helpers
    from dataflow.parallel import cvthreads
    (tmp_path / "cpu.max").write_text("50000 100000\n")          # half a CPU: one worker
    monkeypatch.setattr(helpers, "_CGROUP", str(tmp_path))
    assert available_cpus() == 1
    assert AutoTuner().max_workers == 1
    assert cvthreads.threads_for(1) == 1
    df = D.MultiThreadMapData(D.DataFromList([[1], [2]], shuffle=False), None, lambda dp: dp)
    assert df.num_workers == 1
    (tmp_path / "cpu.max").write_text("6400000 100000\n")        # 64 CPUs: the affinity rules
    in_sight = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count()
    assert available_cpus() == in_sight
