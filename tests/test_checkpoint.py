"""Checkpoint and resume (issue 18): state_dict() / load_state_dict() on every dataflow.

The central check: for a state taken after k datapoints, what was consumed before plus what a
freshly built pipeline yields after load_state_dict equals the uninterrupted stream, element
by element (or, for unordered maps, each datapoint exactly once)."""
import itertools
import json
import os
import queue
import random
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import dataflow as D
from dataflow import ops
from dataflow import rng as _rng

SEED = 7


# -- helpers --------------------------------------------------------------------------------------
def plain(x):
    """A datapoint as comparable Python values."""
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, dict):
        return {k: plain(v) for k, v in sorted(x.items())}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def through_json(state):
    return json.loads(json.dumps(state))


def numbers(n, shuffle=True):
    return D.DataFromList([[k] for k in range(n)], shuffle=shuffle)


def noisy(dp):
    """A map with randomness drawn from the datapoint's own stream."""
    return [dp[0], int(_rng.datapoint_rng().integers(1 << 30))]


def noisy_rs(dp):
    """The same from the legacy ``RandomState`` stream (what image augmentors draw from)."""
    return [dp[0], int(_rng.datapoint_random_state().randint(1 << 30))]


def noisy_or_failing(dp):
    """``noisy``, but datapoints 2, 7, 12, ... raise (for maps with an error policy)."""
    if dp[0] % 5 == 2:
        raise KeyError(f"no datapoint {dp[0]}")
    return noisy(dp)


def passes(df, n):
    return [[plain(x) for x in df] for _ in range(n)]


def reference(build, n_passes):
    D.set_seed(SEED)
    df = build()
    df.reset_state()
    try:
        return [(p, x) for p, one in enumerate(passes(df, n_passes)) for x in one]
    finally:
        df.close()


def consume(df, k, n_passes):
    """Take k datapoints over up to n_passes passes; return (taken, pass of the state)."""
    got = []
    if k == 0:
        return got, 0
    for p in range(n_passes):
        for x in df:
            got.append((p, plain(x)))
            if len(got) == k:
                return got, p
    return got, n_passes          # everything: the state is taken after the last StopIteration


def resume(build, state, first_pass, n_passes, load_first=True):
    D.set_seed(SEED)
    df = build()
    if load_first:
        df.load_state_dict(through_json(state))
        df.reset_state()
    else:
        df.reset_state()
        df.load_state_dict(through_json(state))
    try:
        return [(p, plain(x)) for p in range(first_pass, n_passes) for x in df]
    finally:
        df.close()


def check_every_step(build, n_passes=2, steps=None):
    ref = reference(build, n_passes)
    for k in (range(len(ref) + 1) if steps is None else steps(len(ref))):
        D.set_seed(SEED)
        df = build()
        df.reset_state()
        got, p = consume(df, k, n_passes)
        state = df.state_dict()
        df.close()
        got += resume(build, state, p, n_passes, load_first=k % 2 == 0)
        assert got == ref, f"resumed after {k} datapoints"
    return ref


def some_steps(n):
    """0, 1, the middle, the pass boundary region and the end."""
    return sorted({0, 1, n // 4, n // 2 - 1, n // 2, n // 2 + 1, n - 1, n})


# -- guarantee 1: exact resume of ordered pipelines at every step ---------------------------------
SERIAL = {
    "list": lambda: numbers(9, shuffle=False),
    "shuffled list": lambda: numbers(9),
    "map with random ops": lambda: D.MapData(
        D.DataFromList([[np.arange(24, dtype="uint8").reshape(4, 6)] for _ in range(7)]),
        [ops.RandomCrop(3, index=0), ops.RandomHorizontalFlip(index=0)]),
    "map that drops": lambda: D.MapData(numbers(9), lambda dp: None if dp[0] % 3 == 0
                                        else noisy(dp)),
    "batch": lambda: D.BatchData(D.MapData(numbers(11), noisy), 3),
    "batch with remainder": lambda: D.BatchData(D.MapData(numbers(11), noisy), 3, remainder=True),
    "batch map": lambda: D.BatchData(numbers(11), 3, remainder=True,
                                     per_batch_map=lambda b: [b[0] * 2]),
    "repeated": lambda: D.RepeatedData(D.MapData(numbers(4), noisy), 3),
    "fixed size": lambda: D.FixedSizeData(numbers(5), 3),
    "fixed size, fresh passes": lambda: D.FixedSizeData(numbers(5), 3, keep_state=False),
    "concat": lambda: D.ConcatData([numbers(3), D.MapData(numbers(4), noisy)]),
    "join": lambda: D.JoinData([numbers(5), D.MapData(numbers(5), noisy)]),
    # JoinData drops the others' passes when one input ends: their positions must say so
    "join of unequal composites": lambda: D.JoinData([
        numbers(6), D.ConcatData([numbers(3), numbers(4)]), D.RepeatedData(numbers(2), 4),
        D.BatchData(numbers(15), 2, remainder=True)]),
    "fixed size of a join": lambda: D.FixedSizeData(D.JoinData(
        [numbers(3), D.ConcatData([numbers(2), numbers(2)])]), 4, keep_state=False),
    "bucket": lambda: D.BucketBatchData(
        D.DataFromList([[np.zeros(k % 7)] for k in range(23)]), [3, 5], [2, 3, 2],
        pad_info={0: (None, 0)}),
    "bucket, dropping": lambda: D.BucketBatchData(
        D.DataFromList([[np.zeros(k % 7)] for k in range(23)]), [3, 5], [2, 3, 4],
        pad_info={0: (None, 0)}, drop_remainder=True),
    "composed": lambda: D.BatchData(D.RepeatedData(D.MapData(numbers(7), noisy), 2), 4,
                                    remainder=True),
    "select component": lambda: D.SelectComponent(D.MapData(numbers(6), noisy), [1, 0]),
    "random mix": lambda: D.RandomMixData([numbers(4), D.MapData(numbers(3), noisy)]),
    "random choose": lambda: D.RandomChooseData([(numbers(5), 0.3),
                                                 (D.BatchData(numbers(9), 2), 0.7)]),
    "repeated datapoint": lambda: D.RepeatedDataPoint(D.MapData(numbers(4), noisy), 3),
    "iterable (a list)": lambda: D.DataFromIterable([[k] for k in range(5)]),
    "cache": lambda: D.CacheData(D.MapData(numbers(5), noisy)),
    "cache, shuffled": lambda: D.BatchData(D.CacheData(D.MapData(numbers(7), noisy),
                                                       shuffle=True), 2, remainder=True),
    # two maps at the same stage see equal keys: the second's first datapoint had continued
    # the first's last stream (RandomState), and started it again after a resume
    "concat of maps on RandomState streams": lambda: D.ConcatData(
        [D.MapData(numbers(1, shuffle=False), noisy_rs),
         D.MapData(numbers(2, shuffle=False), noisy_rs)]),
    # a state taken as the other input's pass ends: JoinData (RandomMixData) drops the pass of
    # the batcher, whose loaded position then put its input back into the dropped pass
    "join with a batch by shape": lambda: D.JoinData(
        [numbers(3, shuffle=False), D.BatchDataByShape(numbers(7, shuffle=False), 2, 0)]),
    "random mix of a batch by shape": lambda: D.RandomMixData([D.BatchDataByShape(
        D.DataFromList([[k, np.zeros(2)] for k in range(5)], shuffle=False), 1, 1)]),
    # a state taken while the cache fills; the resumed pass may drop it before its first next()
    "random choose of a shuffled cache": lambda: D.RandomChooseData(
        [D.CacheData(numbers(4, shuffle=False), shuffle=True), numbers(4)]),
    # a serial map with an error policy over a source that runs on across its passes, its
    # pass dropped by RandomMixData: it read ahead of its consumer, and a resumed pass that was
    # dropped left that source one datapoint behind
    "random mix of a skipping map over a local shuffle": lambda: D.RandomMixData([D.MapData(
        D.LocallyShuffleData(numbers(4), 3, num_reuse=2, shuffle_interval=3),
        noisy_or_failing, on_error="skip")]),
    "batch by shape": lambda: D.BatchDataByShape(
        D.DataFromList([[np.zeros(k % 3), k] for k in range(11)]), 2, 0),
}


@pytest.mark.parametrize("name", sorted(SERIAL))
def test_serial_resumes_exactly_at_every_step(name):
    ref = check_every_step(SERIAL[name], n_passes=3)
    assert len(ref) > 3


@pytest.mark.parametrize("fixed_size", [False, True])
def test_batch_by_shape_resumes_with_held_datapoints_from_two_passes_of_its_input(fixed_size):
    """Its buffers persist across passes, so the datapoints it holds may come from two passes
    of its input; reading them back had read on past the end of the first pass."""
    def build():
        src = D.DataFromList([[100 + k, np.arange(k % 3 + 1)] for k in range(6 if fixed_size
                                                                               else 4)],
                             shuffle=not fixed_size)
        return D.BatchDataByShape(D.FixedSizeData(src, 4) if fixed_size else src, 2, 1)
    check_every_step(build, n_passes=24)


def endless_check(build, n):
    D.set_seed(SEED)
    df = build()
    df.reset_state()
    ref = [plain(x) for x in itertools.islice(iter(df), n)]
    for k in range(n + 1):
        D.set_seed(SEED)
        df = build()
        df.reset_state()
        got = [plain(x) for x in itertools.islice(iter(df), k)]
        state = df.state_dict()
        D.set_seed(SEED)
        df2 = build()
        df2.load_state_dict(through_json(state))
        df2.reset_state()
        got += [plain(x) for x in itertools.islice(iter(df2), n - k)]
        assert got == ref, f"resumed after {k} datapoints"


@pytest.mark.parametrize("num_reuse", [1, 2])
def test_locally_shuffled_resumes_exactly_at_every_step(num_reuse):
    endless_check(lambda: D.LocallyShuffleData(D.MapData(numbers(9), noisy), 4,
                                               num_reuse=num_reuse, shuffle_interval=2), 30)


def test_locally_shuffled_augmented_images_resume_exactly():
    """An augmentor draws from the datapoint's RandomState stream: after a resume, refilling
    the shuffle buffer maps datapoints again, and each must get its own stream, not continue
    the one of an equal key seen last."""
    def build():
        images = D.DataFromList([[k, np.arange(6, dtype=np.uint8).reshape(1, 6) + k]
                                 for k in range(3)], shuffle=False)
        flipped = D.AugmentImageComponent(images, [D.imgaug.Flip(horiz=True, prob=0.5)],
                                          index=1)
        return D.LocallyShuffleData(D.RepeatedDataPoint(flipped, 2), 4)
    endless_check(build, 12)


def test_locally_shuffled_in_fixed_size_passes():
    check_every_step(lambda: D.FixedSizeData(D.LocallyShuffleData(numbers(9), 4), 5),
                     n_passes=3)


PARALLEL = {
    "threads, ordered strict": lambda: D.MultiThreadMapData(
        D.MapData(numbers(23), noisy), 3, noisy, strict=True, ordered=True, buffer_size=7),
    "MapData with thread workers": lambda: D.MapData(
        numbers(23), [ops.Lambda(noisy)], num_parallel_workers=3),
    "batches of a parallel map": lambda: D.BatchData(D.MultiThreadMapData(
        numbers(23), 2, noisy, strict=True, ordered=True, buffer_size=5), 4, remainder=True),
}


@pytest.mark.parametrize("name", sorted(PARALLEL))
def test_parallel_ordered_resumes_exactly_at_every_step(no_leaks, name):
    check_every_step(PARALLEL[name], n_passes=2)


def test_process_map_resumes_exactly(no_leaks):
    check_every_step(lambda: D.MultiProcessMapData(
        D.MapData(numbers(17), noisy), 2, noisy, strict=True, ordered=True, buffer_size=6),
        n_passes=2, steps=some_steps)


def test_two_interruptions_in_a_row(no_leaks):
    def build():
        return D.BatchData(D.MultiThreadMapData(D.LocallyShuffleData(
            D.MapData(numbers(13), noisy), 5), 2, noisy, strict=True, ordered=True), 2)
    D.set_seed(SEED)
    df = build()
    df.reset_state()
    ref = [plain(x) for x in itertools.islice(iter(df), 40)]
    df.close()
    got = []
    state = None
    for stop in (11, 12, 29, 40):       # three interruptions; one right after a resume
        D.set_seed(SEED)
        df = build()
        if state is not None:
            df.load_state_dict(through_json(state))
        df.reset_state()
        it = iter(df)
        got += [plain(next(it)) for _ in range(stop - len(got))]
        state = df.state_dict()
        df.close()
    assert got == ref


def test_state_right_after_a_load_is_the_loaded_one(no_leaks):
    D.set_seed(SEED)
    df = D.MultiThreadMapData(D.BatchData(numbers(10), 2), 2, lambda b: b, strict=True,
                              ordered=True)
    df.reset_state()
    it = iter(df)
    next(it)
    state = through_json(df.state_dict())
    df.close()
    df2 = D.MultiThreadMapData(D.BatchData(numbers(10), 2), 2, lambda b: b, strict=True,
                               ordered=True)
    df2.load_state_dict(state)
    assert through_json(df2.state_dict()) == state
    df2.reset_state()
    assert through_json(df2.state_dict()) == state
    df2.close()


def test_end_of_pass_rule():
    """A state taken after the last datapoint but before StopIteration finishes that pass
    (empty) and then starts the next; one taken after StopIteration starts the next."""
    D.set_seed(SEED)
    df = numbers(4)
    df.reset_state()
    first = [x[0] for x in df]
    second = [x[0] for x in df]
    D.set_seed(SEED)
    df = numbers(4)
    df.reset_state()
    it = iter(df)
    [next(it) for _ in range(4)]
    before_stop = df.state_dict()
    assert list(it) == []
    after_stop = df.state_dict()
    for state, rest in ((before_stop, [[], second]), (after_stop, [second])):
        D.set_seed(SEED)
        again = numbers(4)
        again.load_state_dict(state)
        again.reset_state()
        assert [[x[0] for x in again] for _ in rest] == rest
    assert first != second


# -- guarantee 2: independent of worker count and executor ----------------------------------------
def test_state_moves_between_thread_process_and_serial_maps(no_leaks):
    def build(kind):
        src = D.MapData(numbers(30), noisy)
        if kind == "threads":
            return D.BatchData(D.MultiThreadMapData(src, 3, noisy, strict=True, ordered=True,
                                                    buffer_size=9), 4)
        if kind == "processes":
            return D.BatchData(D.MultiProcessMapData(src, 2, noisy, strict=True, ordered=True,
                                                     buffer_size=5), 4)
        return D.BatchData(D.MapData(src, noisy), 4)

    ref = reference(lambda: build("serial"), 2)
    for target in ("processes", "serial", "threads"):
        for k in (0, 3, 7, 9):
            D.set_seed(SEED)
            df = build("threads")
            df.reset_state()
            got, p = consume(df, k, 2)
            state = df.state_dict()
            df.close()
            got += resume(lambda: build(target), state, p, 2)
            assert got == ref, f"threads -> {target} after {k} batches"


# -- guarantee 3: exactly once for unordered maps -------------------------------------------------
class HeldUp:
    """A map function that holds datapoint ``victim`` in its worker until released, and
    records the key (run, index) of every datapoint it maps."""

    def __init__(self, victim, first_run_only=False):
        self.victim, self.first_run_only = victim, first_run_only
        self.release = threading.Event()
        self.entered = threading.Event()

    def __call__(self, dp):
        if dp[0] == self.victim and not self.release.is_set() and \
                not (self.first_run_only and _rng._local.key[0] != 0):
            self.entered.set()
            self.release.wait(30)
        return [dp[0], list(_rng._local.key)]


def keyed(dp):
    return [dp[0], list(_rng._local.key)]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("resume_in", ["threads", "processes"])
def test_resume_after_whole_runs_were_handed_over_past_the_watermark(no_leaks, resume_in):
    """A non-strict map's state is its watermark (the first datapoint whose result was not
    handed over) and what was handed over after it. Here datapoint 1 of the first run is held
    up in its worker while the other worker hands over the rest of that run and all of the
    next: the resumed map sends datapoint 1 again and skips the others. It counted the skipped
    ones as sent, so after a whole run of them its buffer looked full with nothing in it, and
    the consumer waited forever."""
    n = 5
    func = HeldUp(victim=1, first_run_only=True)
    df = D.MultiThreadMapData(numbers(n, shuffle=False), 2, func, buffer_size=3)
    df.reset_state()
    before = [plain(x) for _ in range(2) for x in df]       # two passes
    assert func.entered.wait(10)
    state = df.state_dict()
    func.release.set()
    df.close()
    keys = [tuple(x[1]) for x in before]
    assert (0, 1) not in keys and {(1, i) for i in range(n)} <= set(keys), keys

    kind = D.MultiThreadMapData if resume_in == "threads" else D.MultiProcessMapData
    df2 = kind(numbers(n, shuffle=False), 2, keyed, buffer_size=3)
    df2.load_state_dict(through_json(state))
    df2.reset_state()
    try:
        after = [plain(x) for _ in range(2) for x in df2]
        assert len(after) == 2 * n
        # the map is unordered: the resent datapoint 1 may come after many others on a
        # loaded machine (its worker thread not scheduled while the other maps hundreds)
        for _ in range(2000):
            if any(tuple(x[1]) == (0, 1) for x in after):
                break
            after += [plain(x) for x in df2]
    finally:
        df2.close()
    keys += [tuple(x[1]) for x in after]
    assert (0, 1) in keys, "the held-up datapoint was lost"
    assert len(keys) == len(set(keys)), "a datapoint was delivered twice"


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("resume_in", ["threads", "processes"])
def test_unordered_map_delivers_each_datapoint_once_across_a_checkpoint(no_leaks, strict,
                                                                        resume_in):
    n = 20
    func = HeldUp(victim=0)

    def build(f):
        if f is keyed and resume_in == "processes":
            return D.MultiProcessMapData(numbers(n, shuffle=False), 2, f, strict=strict,
                                         buffer_size=4)
        return D.MultiThreadMapData(numbers(n, shuffle=False), 3, f, strict=strict,
                                    buffer_size=6)

    D.set_seed(SEED)
    df = build(func)
    df.reset_state()
    it = iter(df)
    before = [plain(next(it)) for _ in range(7)]
    # datapoint 0 is in a worker (under load its thread may start on it only after the other
    # threads made these 7 results)
    assert func.entered.wait(10)
    assert all(x[0] != 0 for x in before)
    state = df.state_dict()               # answered without asking the blocked worker
    func.release.set()
    df.close()

    D.set_seed(SEED)
    df2 = build(keyed)
    df2.load_state_dict(through_json(state))
    df2.reset_state()
    after = [plain(x) for x in df2]               # the rest of the interrupted pass
    if not strict:
        after += [plain(x) for x in df2]          # and one more pass of an endless map
        keys = {tuple(x[1]) for x in before + after}
        # Results of run 0 may still be in a worker that started late (a process under load):
        # they come in a later pass, as in any non-strict run. Take passes until they do.
        later = []
        while {(0, i) for i in range(n)} - keys - set(later) and len(later) < 500 * n:
            later += [tuple(plain(x)[1]) for x in df2]
    df2.close()
    keys = [tuple(x[1]) for x in before + after]
    assert len(keys) == len(set(keys)), "a datapoint was delivered twice"
    if strict:
        assert sorted(x[0] for x in before + after) == list(range(n))
    else:
        assert len(keys) == 2 * n
        missing = {(0, i) for i in range(n)} - set(keys)
        assert missing <= set(later), "a datapoint of run 0 was lost"
        assert not set(keys) & set(later), "a datapoint was delivered twice"


# -- guarantee 4: small ---------------------------------------------------------------------------
MB = 1 << 20


class CountingMap:
    def __init__(self):
        self.calls = 0

    def __call__(self, dp):
        self.calls += 1
        return [np.full(MB, dp[0] % 251, dtype="uint8"), dp[0]]


@pytest.mark.parametrize("buffer_size", [4, 16])
def test_shuffle_buffer_state_holds_keys_not_megabyte_datapoints(buffer_size):
    counter = CountingMap()

    def build():
        return D.LocallyShuffleData(D.MapData(numbers(50), counter), buffer_size)

    sizes, recomputed = [], []
    for k in (buffer_size, 60, 140):
        D.set_seed(SEED)
        df = build()
        df.reset_state()
        it = iter(df)
        taken = [next(it)[1] for _ in range(k)]
        state = df.state_dict()
        nxt = [next(it)[1] for _ in range(5)]
        text = json.dumps(state)
        sizes.append(len(text))
        D.set_seed(SEED)
        df2 = build()
        df2.load_state_dict(json.loads(text))
        df2.reset_state()
        counter.calls = 0
        it2 = iter(df2)
        first = next(it2)[1]
        recomputed.append(counter.calls)
        assert [first] + [next(it2)[1] for _ in range(4)] == nxt
        assert len(taken) == k
    # a few hundred bytes per buffered datapoint (its key and input position), never a datapoint
    assert max(sizes) < 300 * buffer_size + 2000, sizes
    assert len(state["state"]["buffer"]) == buffer_size
    # resuming maps the buffered datapoints again, plus the next one it reads: not the k before
    assert max(recomputed) <= buffer_size + 1, recomputed


def test_state_of_a_map_is_a_few_ints_whatever_the_position(no_leaks):
    def build():
        return D.BatchData(D.MultiThreadMapData(D.MapData(numbers(400), CountingMap()), 2,
                                                lambda dp: dp, strict=True, ordered=True,
                                                buffer_size=8), 4)
    D.set_seed(SEED)
    df = build()
    df.reset_state()
    it = iter(df)
    sizes = []
    for k in range(60):
        next(it)
        if k in (1, 59):
            sizes.append(len(json.dumps(df.state_dict()["state"])))
    df.close()
    assert max(sizes) < 400 and abs(sizes[0] - sizes[1]) < 20, sizes


# -- guarantee 6: survives SIGKILL ----------------------------------------------------------------
SCRIPT = textwrap.dedent("""
    import json, os, sys
    import dataflow as D
    from dataflow import rng

    state_path, log_path = sys.argv[1], sys.argv[2]
    D.set_seed(5)
    def noisy(dp):
        return [dp[0], int(rng.datapoint_rng().integers(1000))]
    df = D.BatchData(D.MultiThreadMapData(D.LocallyShuffleData(D.MapData(
        D.DataFromList([[k] for k in range(40)]), noisy), 6), 2, noisy, strict=True,
        ordered=True, buffer_size=6), 3)
    lines = 0
    if os.path.exists(state_path):
        with open(state_path) as f:
            saved = json.load(f)
        df.load_state_dict(saved["dataflow"])
        lines = saved["lines"]
        with open(log_path, "r+") as f:      # forget what was logged after the last save
            kept = f.read().splitlines()[:lines]
            f.seek(0)
            f.truncate()
            f.write("".join(l + "\\n" for l in kept))
    df.reset_state()
    with open(log_path, "a") as log:
        it = iter(df)
        while lines < 60:
            batch = next(it)
            log.write(json.dumps([[int(a), int(b)] for a, b in zip(*batch)]) + "\\n")
            log.flush()
            lines += 1
            tmp = state_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"dataflow": df.state_dict(), "lines": lines}, f)
            os.replace(tmp, state_path)      # atomically: a kill leaves the old or the new
            print(lines, flush=True)
    df.close()
""")


def test_killed_and_restarted_run_consumes_what_an_uninterrupted_run_does(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(D.__file__)))

    def run(state, log, kill_after=None):
        proc = subprocess.Popen([sys.executable, str(script), str(state), str(log)],
                                stdout=subprocess.PIPE, text=True, env=env)
        try:
            if kill_after is not None:
                for _ in range(kill_after):
                    proc.stdout.readline()
                proc.kill()                      # SIGKILL
            proc.communicate(timeout=50)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.returncode

    assert run(tmp_path / "a.json", tmp_path / "a.log") == 0
    rng = random.Random(11)
    kills = 0
    for _ in range(3):
        code = run(tmp_path / "b.json", tmp_path / "b.log", kill_after=rng.randint(1, 18))
        kills += code == -9
    assert run(tmp_path / "b.json", tmp_path / "b.log") == 0
    assert kills >= 1
    assert (tmp_path / "b.log").read_text() == (tmp_path / "a.log").read_text()
    assert len((tmp_path / "a.log").read_text().splitlines()) == 60


# -- guarantee 7: sources that cannot say where they are ------------------------------------------
def test_generator_source_needs_replay_and_says_so():
    df = D.MapData(D.DataFromGenerator(lambda: ([k] for k in range(6))), lambda dp: dp)
    df.reset_state()
    it = iter(df)
    taken = [next(it)[0] for _ in range(2)]
    with pytest.raises(NotImplementedError, match="DataFromGenerator.*replay=True"):
        df.state_dict()
    state = through_json(df.state_dict(replay=True))
    df2 = D.MapData(D.DataFromGenerator(lambda: ([k] for k in range(6))), lambda dp: dp)
    df2.load_state_dict(state)
    df2.reset_state()
    assert taken + [x[0] for x in df2] == list(range(6))


def test_queue_source_and_user_dataflow_need_replay():
    q = queue.Queue()
    for k in range(5):
        q.put([k])
    df = D.DataFromQueue(q)
    df.reset_state()
    it = iter(df)
    next(it)
    with pytest.raises(NotImplementedError, match="DataFromQueue"):
        df.state_dict()
    assert df.state_dict(replay=True)["state"]["pos"] == 1

    class Counter(D.DataFlow):
        def __iter__(self):
            yield from ([k] for k in range(5))

    c = D.BatchData(Counter(), 2)
    it = iter(c)
    next(it)
    with pytest.raises(NotImplementedError, match="Counter"):
        c.state_dict()
    state = through_json(c.state_dict(replay=True))
    c2 = D.BatchData(Counter(), 2)
    c2.load_state_dict(state)
    assert [b[0].tolist() for b in c2] == [[2, 3]]


@pytest.mark.parametrize("k", [1, 3, 4, 5])
def test_repeated_datapoint_over_a_replayed_source_resumes_between_repeats(k):
    def build():
        return D.RepeatedDataPoint(D.DataFromGenerator(lambda: ([j] for j in range(4)), size=4),
                                   2)
    df = build()
    df.reset_state()
    it = iter(df)
    taken = [next(it)[0] for _ in range(k)]
    state = through_json(df.state_dict(replay=True))
    df2 = build()
    df2.load_state_dict(state)
    df2.reset_state()
    # the rest of the pass once (the held datapoint's remaining repeats, then the source
    # continued where it was, not restarted), then a whole new pass
    assert taken + [x[0] for x in df2] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [x[0] for x in df2] == [0, 0, 1, 1, 2, 2, 3, 3]


def _first_pass_empty():
    """A map over 3 datapoints that drops all of its first pass (and none of later ones)."""
    calls = itertools.count()
    return D.MapData(D.DataFromList([[k] for k in range(3)], shuffle=False),
                     lambda dp: None if next(calls) < 3 else dp)


@pytest.mark.parametrize("repeater", ["RepeatedData", "MultiProcessMapAndBatchData"])
def test_repeating_forever_from_a_state_before_any_datapoint_checks_the_first_pass(
        no_leaks, repeater):
    # the first pass of the input yields nothing: a fresh pipeline raises at once, and so
    # must one loaded with the state it had then (it used to take that pass as "resumed, may
    # have nothing left" and go on to the next pass, which yields)
    def build():
        src = _first_pass_empty()
        if repeater == "RepeatedData":
            return D.RepeatedData(src, -1)
        return D.MultiProcessMapAndBatchData(src, 1, keyed, 2)
    fresh = build()
    fresh.reset_state()
    state = through_json(fresh.state_dict())
    with pytest.raises(ValueError, match="produced no datapoint"):
        next(iter(fresh))
    loaded = build()
    loaded.load_state_dict(state)
    loaded.reset_state()
    try:
        with pytest.raises(ValueError, match="produced no datapoint"):
            next(iter(loaded))
    finally:
        for df in (fresh, loaded):
            getattr(df, "close", lambda: None)()


def test_a_runner_copy_resumed_before_its_pass_began_checks_that_pass(no_leaks):
    # the copy's pass yields nothing and it raises; the state taken then holds the copy's
    # position before that pass began: a resume raises again (it used to yield from the pass
    # after, as if resumed inside one)
    def build():
        return D.MultiThreadRunner(_first_pass_empty, 4, 1)
    df = build()
    df.reset_state()
    with pytest.raises(ValueError, match="produced no datapoint"):
        next(iter(df))
    state = through_json(df.state_dict())
    df.close()
    df2 = build()
    df2.load_state_dict(state)
    df2.reset_state()
    try:
        with pytest.raises(ValueError, match="produced no datapoint"):
            next(iter(df2))
    finally:
        df2.close()


@pytest.mark.parametrize("kind", ["serial", "thread", "process"])
def test_a_pass_resumed_at_its_end_and_dropped_leaves_the_source_at_the_next_pass(no_leaks,
                                                                                   kind):
    # RandomMixData resumed after the last datapoint of its pass ends that pass without asking
    # its input for more: a parallel map's state then kept the source where it was loaded
    # (mid-pass), so a resume of that state found the next pass empty
    def build():
        D.set_seed(SEED)
        if kind == "serial":
            m = D.MapData(numbers(3), noisy)
        else:
            m = D.MapData(numbers(3), noisy, num_parallel_workers=2,
                          python_multiprocessing=kind == "process")
        assert m.executor == kind
        return D.RandomMixData([m])

    def passes(df, n):
        df.reset_state()
        try:
            return [[tuple(dp) for dp in df] for _ in range(n)]
        finally:
            df.close()

    want = passes(build(), 2)
    df = build()
    df.reset_state()
    it = iter(df)
    assert [tuple(next(it)) for _ in range(3)] == want[0]
    state = through_json(df.state_dict())       # before the pass's end was seen
    df.close()
    df = build()
    df.load_state_dict(state)
    assert passes(df, 1) == [[]]
    state = through_json(df.state_dict())
    df = build()
    df.load_state_dict(state)
    assert passes(df, 1) == [want[1]]


def _drop_one(dp):
    return None if dp[0] == 1 else dp


@pytest.mark.parametrize("runs", ["aligned", "shorter"])
@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_a_non_strict_pass_resumed_after_its_last_result_resumes_again_exactly(no_leaks, kind,
                                                                               runs):
    # state 1 after the last result of a pass (its end not seen), resumed: that pass yields
    # nothing; state 2 then, resumed: the next pass must be the uninterrupted one. The map
    # recorded state 2 as the start of the next run of the source, with the source still
    # where state 1 had it: the next pass raised "produced no datapoint" (runs aligned with
    # passes) or drew another run's random numbers (runs of 4 in passes of 5)
    def build():
        D.set_seed(SEED)
        src = numbers(5, shuffle=False)
        if runs == "shorter":
            src = D.MapData(src, _drop_one)         # len 5, 4 datapoints per run
        cls = D.MultiThreadMapData if kind == "threads" else D.MultiProcessMapData
        return cls(src, 2, noisy, strict=False, ordered=True, buffer_size=1)

    def one_pass(df):
        try:
            return [tuple(dp) for dp in df]
        finally:
            df.close()

    df = build()
    df.reset_state()
    want = [[tuple(dp) for dp in df] for _ in range(2)]
    df.close()
    df = build()
    df.reset_state()
    it = iter(df)
    assert [tuple(next(it)) for _ in range(5)] == want[0]
    state = through_json(df.state_dict())
    df.close()
    df = build()
    df.load_state_dict(state)
    df.reset_state()
    assert one_pass(df) == []
    state = through_json(df.state_dict())
    df = build()
    df.load_state_dict(state)
    df.reset_state()
    assert one_pass(df) == want[1]


def test_repeating_forever_resumed_at_the_end_of_a_pass_goes_on_to_the_next():
    # a state taken after the last datapoint of a pass of the input, before its end was seen:
    # the resumed pass of the input has nothing left, which is no error
    def build():
        return D.RepeatedData(D.DataFromList([[k] for k in range(3)], shuffle=False), -1)
    df = build()
    df.reset_state()
    it = iter(df)
    assert [next(it)[0] for _ in range(3)] == [0, 1, 2]
    df2 = build()
    df2.load_state_dict(through_json(df.state_dict()))
    df2.reset_state()
    it2 = iter(df2)
    assert [next(it2)[0] for _ in range(4)] == [0, 1, 2, 0]


def test_repeated_datapoint_resumed_between_repeats_says_so_before_its_first_next():
    # a buffer above it records the position of each datapoint it takes before taking it:
    # right after iter() on a resumed RepeatedDataPoint that used to read "rep 0" (a new
    # datapoint), so a second resume filled the buffer with the next datapoint of the source
    # in place of the held repeat
    def build():
        D.set_seed(SEED)
        return D.BucketBatchData(D.RepeatedDataPoint(numbers(12), 3), [2, 4], [2, 3, 2],
                                 element_length_function=lambda dp: dp[0] % 7)

    def events(df, n, it=None):
        out = []
        for _ in range(n):
            if it is None:
                it = iter(df)
            try:
                out.append(np.asarray(next(it)[0]).tolist())
            except StopIteration:
                out.append("end")
                it = None
        return out, it

    def fresh(state=None):
        df = build()
        if state is not None:
            df.load_state_dict(state)
        df.reset_state()
        return df

    want, _ = events(fresh(), 14)
    bad = []
    for cut in range(10):
        df = fresh()
        got, _ = events(df, cut)
        df = fresh(through_json(df.state_dict()))
        more, _ = events(df, 1)
        df = fresh(through_json(df.state_dict()))
        rest, _ = events(df, 14 - cut - 1)
        if got + more + rest != want:
            bad.append(cut)
    assert not bad


@pytest.mark.parametrize("kind", ["serial", "threads", "processes"])
def test_a_pass_begins_at_iter_for_every_map(no_leaks, kind):
    # an iterator dropped mid-pass, a new one made but not started: the state is that of the
    # new pass, which is what the live pipeline yields next (parallel maps used to point at
    # the dropped pass)
    def build():
        src = D.DataFromList([[k] for k in range(7)], shuffle=True)
        if kind == "serial":
            return D.MapData(src, noisy)
        return (D.MultiThreadMapData if kind == "threads" else D.MultiProcessMapData)(
            src, 2, noisy, strict=True, ordered=True)
    D.set_seed(SEED)
    df = build()
    df.reset_state()
    it = iter(df)
    next(it), next(it)
    it2 = iter(df)
    del it
    state = through_json(df.state_dict())
    live = [dp for dp in it2]
    df.close() if kind != "serial" else None
    D.set_seed(SEED)
    df2 = build()
    df2.load_state_dict(state)
    df2.reset_state()
    assert len(live) == 7 and [dp for dp in df2] == live
    df2.close() if kind != "serial" else None


def test_a_pass_made_and_dropped_unstarted_counts_for_every_map(no_leaks):
    """JoinData, RandomMixData and RandomChooseData make a pass of an input and may end on
    another one before taking from it. Serial MapData counts that pass (it begins at iter());
    a strict parallel map counted it only once started, so all its later passes drew other
    random numbers than serial MapData's, and a serial state resumed it elsewhere."""
    def build(kind):
        src = D.DataFromList([[k] for k in range(5)], shuffle=True)
        if kind == "serial":
            return D.MapData(src, noisy)
        if kind == "MapData on threads":
            return D.MapData(src, D.native(noisy), num_parallel_workers=2)
        return (D.MultiThreadMapData if kind == "threads" else D.MultiProcessMapData)(
            src, 2, noisy, strict=True, ordered=True, buffer_size=3)
    out = {}
    for kind in ("serial", "MapData on threads", "threads", "processes"):
        D.set_seed(SEED)
        df = build(kind)
        df.reset_state()
        it = iter(df)
        del it                       # made and dropped unstarted
        out[kind] = passes(df, 2)
        df.close()
        assert out[kind] == out["serial"], kind
    # and as JoinData makes it: a state of the serial pipeline resumes the parallel one
    def joined(kind):
        return D.JoinData([numbers(2, shuffle=False), build(kind)])
    D.set_seed(SEED)
    ref = joined("serial")
    ref.reset_state()
    want = passes(ref, 3)
    ref.close()
    D.set_seed(SEED)
    df = joined("serial")
    df.reset_state()
    got = passes(df, 1)
    state = through_json(df.state_dict())
    df.close()
    D.set_seed(SEED)
    df = joined("threads")
    df.load_state_dict(state)
    df.reset_state()
    got += passes(df, 2)
    df.close()
    assert got == want


@pytest.mark.parametrize("seed", [5, 7])
def test_random_choose_of_a_parallel_map_resumes_and_matches_serial(no_leaks, monkeypatch,
                                                                     seed):
    """RandomChooseData makes passes of the map that it ends before taking from it: they count
    in the parallel map as in the serial one, also in a pipeline resumed from a state taken
    before the map's first pass began (a loaded position between passes)."""
    def build(parallel):
        def mapped():
            src = numbers(3, shuffle=False)
            if parallel:
                return D.MultiThreadMapData(src, 2, noisy, strict=True, ordered=True,
                                            buffer_size=4)
            return D.MapData(src, noisy)
        return lambda: D.RandomChooseData(
            [D.SelectComponent(numbers(1), [0, 0]), mapped()])
    monkeypatch.setattr(sys.modules[__name__], "SEED", seed)
    ref = check_every_step(build(True), n_passes=6)
    assert ref == reference(build(False), 6)
    assert sum(1 for _, dp in ref if len(dp) == 2) >= 3      # the map's datapoints are there


def test_proxy_subclass_without_state_inherits_its_input_position():
    class Doubled(D.ProxyDataFlow):
        def __iter__(self):
            for dp in self.ds:
                yield [dp[0] * 2]

    check_every_step(lambda: Doubled(numbers(6)), n_passes=2)


def test_parallel_map_over_a_generator_needs_replay(no_leaks):
    def build():
        return D.MultiThreadMapData(D.DataFromGenerator(lambda: ([k] for k in range(12))), 2,
                                    lambda dp: dp, strict=True, ordered=True, buffer_size=4)
    df = build()
    df.reset_state()
    it = iter(df)
    taken = [next(it)[0] for _ in range(5)]
    with pytest.raises(NotImplementedError, match="DataFromGenerator"):
        df.state_dict()
    state = through_json(df.state_dict(replay=True))
    df.close()
    df2 = build()
    df2.load_state_dict(state)
    df2.reset_state()
    assert taken + [x[0] for x in df2] == list(range(12))
    df2.close()


# the runners (each copy resumed from its own position): tests/test_checkpoint_runners.py


# -- format and mismatches ------------------------------------------------------------------------
def state_of(df):
    D.set_seed(SEED)
    df.reset_state()
    next(iter(df))
    return through_json(df.state_dict())


def test_state_is_json_with_format_and_fingerprint():
    state = state_of(D.BatchData(D.MapData(numbers(10), noisy), 2))
    assert state["format_version"] == 1 and state["seed"] == SEED
    assert state["fingerprint"]["class"] == "BatchData"
    assert state["fingerprint"]["params"]["batch_size"] == 2
    assert state["fingerprint"]["inputs"][0]["class"] == "MapData"


def test_fingerprint_mismatch_names_the_first_difference():
    state = state_of(D.BatchData(D.MapData(numbers(10), noisy), 2))
    with pytest.raises(ValueError, match="'batch_size' is 2 in the state, 3"):
        D.BatchData(D.MapData(numbers(10), noisy), 3).load_state_dict(state)
    with pytest.raises(ValueError, match="'MapData'.*'RepeatedData'"):
        D.BatchData(D.RepeatedData(numbers(10), 2), 2).load_state_dict(state)
    with pytest.raises(ValueError, match="'shuffle' is True in the state, False"):
        D.BatchData(D.MapData(numbers(10, shuffle=False), noisy), 2).load_state_dict(state)
    shuffled = state_of(D.LocallyShuffleData(numbers(10), 4))
    with pytest.raises(ValueError, match="'buffer_size' is 4 in the state, 5"):
        D.LocallyShuffleData(numbers(10), 5).load_state_dict(shuffled)
    pairs = D.MapData(numbers(10), lambda dp: [dp[0], -dp[0]])
    selected = state_of(D.SelectComponent(pairs, [1, 0]))
    with pytest.raises(ValueError, match=r"'idxs' is \[1, 0\] in the state, \[0\]"):
        D.SelectComponent(pairs, [0]).load_state_dict(selected)
    component = state_of(D.MapDataComponent(pairs, abs, index=0))
    with pytest.raises(ValueError, match="'index' is 0 in the state, 1"):
        D.MapDataComponent(pairs, abs, index=1).load_state_dict(component)


def test_unknown_format_and_other_seed_are_refused():
    state = state_of(numbers(5))
    with pytest.raises(ValueError, match="unknown state format version 99"):
        numbers(5).load_state_dict(dict(state, format_version=99))
    with pytest.raises(ValueError, match="not a dataflow state"):
        numbers(5).load_state_dict({"pass": 0})
    D.set_seed(SEED + 1)
    with pytest.raises(ValueError, match="set_seed"):
        numbers(5).load_state_dict(state)
    D.set_seed(None)


def test_unordered_state_does_not_load_into_an_ordered_map(no_leaks):
    df = D.MultiThreadMapData(numbers(10), 2, noisy, strict=True)
    state = state_of(df)
    df.close()
    with pytest.raises(ValueError, match="ParallelMapData.*MapData"):
        D.MapData(numbers(10), noisy).load_state_dict(state)


@pytest.mark.parametrize("reader", ["parallel map", "LocallyShuffleData"])
def test_a_reader_that_reads_an_unordered_map_again_refuses_to_checkpoint(no_leaks, reader):
    # it resumed by reading its input again from a recorded position and dropping the
    # datapoints it had read: an unordered map's results come in the order its workers finish,
    # so the datapoints dropped were other ones, and a resumed pass lost some and repeated
    # others (10-31 of 75 resumes of a checkpoint audit's pipeline)
    inner = D.MultiThreadMapData(numbers(12), 2, noisy, strict=True, buffer_size=4)
    if reader == "parallel map":
        df = D.MapData(inner, lambda dp: dp, num_parallel_workers=2)
    else:
        df = D.LocallyShuffleData(inner, 4)
    df.reset_state()
    it = iter(df)
    next(it)
    with pytest.raises(NotImplementedError, match="MultiThreadMapData is an unordered map.*"
                                                  "ordered=True"):
        df.state_dict()
    del it
    df.close()
    inner.close()
    # ordered, the same pipeline checkpoints (and resumes exactly, as tested above)
    ordered = D.MultiThreadMapData(numbers(12), 2, noisy, strict=True, ordered=True)
    df = D.MapData(ordered, lambda dp: dp, num_parallel_workers=2)
    df.reset_state()
    it = iter(df)
    next(it)
    assert df.state_dict()
    del it
    df.close()
    ordered.close()


# -- torch adapter --------------------------------------------------------------------------------
@pytest.mark.torch
def test_stateful_dataloader_checkpoints_the_pipeline(no_leaks):
    from torchdata.stateful_dataloader import StatefulDataLoader
    from dataflow.integrations.torch import as_iterable_dataset

    def build():
        return as_iterable_dataset(D.BatchData(D.MapData(numbers(20), noisy,
                                                         num_parallel_workers=2), 3))

    def rows(batches):
        return [b[1].tolist() for b in batches]

    D.set_seed(SEED)
    ds = build()
    ref = rows(b for _ in range(2) for b in StatefulDataLoader(ds, batch_size=None,
                                                               num_workers=0))
    ds.close()
    D.set_seed(SEED)
    ds = build()
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=0)
    it = iter(loader)
    got = rows(next(it) for _ in range(4))
    saved = through_json(loader.state_dict())
    ds.close()
    D.set_seed(SEED)
    ds = build()
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=0)
    loader.load_state_dict(saved)
    got += rows(loader) + rows(loader)
    ds.close()
    assert got == ref


@pytest.mark.torch
def test_torch_adapter_state_dict_takes_replay_as_the_dataflows_does(no_leaks):
    # its error said "Pass replay=True", and state_dict(replay=True) was a TypeError
    from dataflow.integrations.torch import as_iterable_dataset

    def build():
        return as_iterable_dataset(D.DataFromGenerator(lambda: iter([[k] for k in range(6)])))

    ds = build()
    it = iter(ds)
    got = [plain(next(it)) for _ in range(2)]
    with pytest.raises(NotImplementedError, match="replay=True"):
        ds.state_dict()
    state = through_json(ds.state_dict(replay=True))
    ds.close()
    again = build()
    again.load_state_dict(state)
    assert got + [plain(x) for x in again] == [[k] for k in range(6)]
    again.close()


@pytest.mark.parametrize("strict, ordered", [(True, True), (True, False), (False, True),
                                             (False, False)])
def test_load_into_a_running_pipeline(no_leaks, strict, ordered):
    """Loading a state into a pipeline that is being iterated (workers busy, results in
    flight) continues from the state; nothing of the abandoned iteration leaks in."""
    def build():
        return D.MultiThreadMapData(D.MapData(numbers(20, shuffle=False), noisy), 3, noisy,
                                    strict=strict, ordered=ordered, buffer_size=8)

    def key(x):
        return tuple(x[1]) if isinstance(x[1], list) else x[1]

    D.set_seed(SEED)
    df = build()
    df.reset_state()
    it = iter(df)
    before = [plain(next(it)) for _ in range(5)]
    state = through_json(df.state_dict())
    [next(it) for _ in range(6)]              # go on, then go back to the state
    it.close()                                # (a dataflow is iterated once at a time)
    df.load_state_dict(state)
    after = [plain(x) for x in df]
    df.close()
    got = before + after
    assert len(got) == 20
    assert len({key(x) for x in got}) == 20         # no datapoint twice
    if strict:
        assert sorted(x[0] for x in got) == list(range(20))
    # (a non-strict pass may end with datapoints borrowed from the next pass, its own last ones
    # carried over: which, depends on thread timing)
    if ordered:
        assert [x[0] for x in got] == list(range(20))


class Calls:
    def __init__(self):
        self.n = 0

    def __call__(self, dp):
        self.n += 1
        return dp


@pytest.mark.parametrize("k", [3, 350])
def test_resuming_a_parallel_map_reads_a_bounded_stretch_of_its_source(no_leaks, k):
    """Resume cost does not grow with the position: the source is repositioned by its
    position (a seek), then at most one chunk (64) is read again to reach the first datapoint
    not handed over, and the map refills its buffer."""
    calls = Calls()

    def build():
        return D.MultiThreadMapData(D.MapData(numbers(400), calls), 2, noisy, strict=True,
                                    ordered=True, buffer_size=8)
    D.set_seed(SEED)
    df = build()
    df.reset_state()
    it = iter(df)
    taken = [plain(next(it)) for _ in range(k)]
    state = through_json(df.state_dict())
    expected = plain(next(it))
    df.close()
    D.set_seed(SEED)
    df2 = build()
    df2.load_state_dict(state)
    df2.reset_state()
    calls.n = 0
    assert plain(next(iter(df2))) == expected
    assert calls.n <= 64 + 8 + 1, calls.n
    df2.close()
    assert len(taken) == k


@pytest.mark.parametrize("k", [0, 3, 5])
def test_map_and_batch_delivers_each_group_once_across_a_checkpoint(no_leaks, k):
    """MultiProcessMapAndBatchData (non-strict, unordered): no group twice across the
    checkpoint, and none lost beyond those still in its buffer."""
    def build():
        return D.MultiProcessMapAndBatchData(numbers(24, shuffle=False), 2, keyed, 4)

    D.set_seed(SEED)
    df = build()
    df.reset_state()
    it = iter(df)
    before = [next(it) for _ in range(k)]
    state = through_json(df.state_dict())
    df.close()
    D.set_seed(SEED)
    df2 = build()
    df2.load_state_dict(state)
    df2.reset_state()
    after = [b for _ in range(3) for b in df2]
    buffered = df2.buffer_size
    df2.close()
    keys = [tuple(np.asarray(b[1][0]).tolist()) for b in before + after]
    assert len(keys) == len(set(keys)), "a group was delivered twice"
    missing = {(0, i) for i in range(len(keys))} - set(keys)
    assert len(missing) <= buffered, (missing, keys)


def test_state_of_a_pipeline_not_reset_yet_is_its_start():
    def build():
        return D.BatchData(D.LocallyShuffleData(D.RandomMixData(
            [D.MapData(numbers(5), noisy), D.MapData(numbers(4), noisy)]), 3), 2)
    D.set_seed(SEED)
    df = build()
    state = through_json(df.state_dict())       # before reset_state: no random state yet
    df.reset_state()
    ref = [plain(x) for x in itertools.islice(iter(df), 12)]
    D.set_seed(SEED)
    df2 = build()
    df2.load_state_dict(state)
    df2.reset_state()
    assert [plain(x) for x in itertools.islice(iter(df2), 12)] == ref


def random_pipeline(r):
    """A pipeline of 2-5 serial dataflows drawn from ``r`` (a seeded random.Random), with the
    datapoints ``[int, int]`` throughout (so that any stage composes with any other)."""
    def source():
        return D.MapData(numbers(r.randint(3, 7), shuffle=r.random() < 0.5), noisy)

    df = source()
    for _ in range(r.randint(1, 4)):
        kind = r.choice(["map", "repeat", "fixed", "shuffle", "concat", "join", "mix",
                         "repeat point", "cache"])
        if kind == "map":
            df = D.MapData(df, lambda dp: None if dp[1] % 5 == 0 else [dp[0], dp[1] + 1])
        elif kind == "repeat":
            df = D.RepeatedData(df, r.randint(1, 3))
        elif kind == "fixed":
            df = D.FixedSizeData(df, r.randint(2, 6), keep_state=r.random() < 0.5)
        elif kind == "shuffle":
            df = D.FixedSizeData(D.LocallyShuffleData(df, r.randint(1, 4)), r.randint(3, 6))
        elif kind == "concat":
            df = D.ConcatData([df, source()])
        elif kind == "join":
            df = D.MapData(D.JoinData([df, source()]), lambda dp: dp[:2])
        elif kind == "mix":
            df = D.RandomChooseData([(df, 0.5), (source(), 0.5)])
        elif kind == "repeat point":
            df = D.RepeatedDataPoint(df, 2)
        else:
            df = D.CacheData(df, shuffle=r.random() < 0.5)
    if r.random() < 0.5:
        df = D.BatchData(df, r.randint(1, 3), remainder=True)
    return df


@pytest.mark.parametrize("seed", range(30))
def test_random_compositions_resume_exactly(seed):
    check_every_step(lambda: random_pipeline(random.Random(seed)), n_passes=3)


@pytest.mark.parametrize("workers, processes", [(0, False), (2, False), (2, True)],
                         ids=["serial", "threads", "processes"])
def test_close_keeps_the_pass_numbers_and_the_position_as_serial_mapdata_does(
        no_leaks, workers, processes):
    # after close() a parallel map started again at pass 0: an epoch loop written as
    # "with df: for dp in df" drew epoch 0's random numbers every epoch, and a state_dict()
    # taken after close() said pass 0 (a resume repeated what was handed over)
    def build():
        return D.MapData(numbers(10), noisy, num_parallel_workers=workers,
                         python_multiprocessing=processes)
    D.set_seed(SEED)
    df = build()
    df.reset_state()
    epochs = []
    for _ in range(3):
        with df:
            epochs.append(sorted(plain(x) for x in df))
    assert epochs == [sorted(one) for one in passes_of_serial(3)]
    assert epochs[0] != epochs[1] != epochs[2]
    it = iter(df)
    taken = [plain(next(it)) for _ in range(4)]
    df.close()
    state = through_json(df.state_dict())
    it.close()
    D.set_seed(SEED)
    again = build()
    again.load_state_dict(state)
    again.reset_state()
    rest = [plain(x) for x in again]
    again.close()
    D.set_seed(SEED)
    assert sorted(taken + rest) == sorted(passes_of_serial(4)[3])


def passes_of_serial(n):
    D.set_seed(SEED)
    df = D.MapData(numbers(10), noisy)
    df.reset_state()
    return passes(df, n)
