"""Checkpoint and resume (issue 18) of what a pass accumulates besides positions: the error
policy's counts (``num_skipped``, ``num_replaced``, the errors ``max_errors`` is checked
against), and the cost of refilling a shuffle buffer."""
import json
import random

import pytest

import dataflow as D

SEED = 5
N = 20


def through_json(state):
    return json.loads(json.dumps(state))


def flaky(dp):
    if dp[0] % 4 == 1:
        raise ValueError(f"bad datapoint {dp[0]}")
    return [dp[0] * 10]


def build(kind, on_error, max_errors, strict, ordered):
    src = D.DataFromList([[k] for k in range(N)], shuffle=False)
    if kind == "serial":
        return D.MapData(src, flaky, on_error=on_error, max_errors=max_errors)
    cls = D.MultiThreadMapData if kind == "threads" else D.MultiProcessMapData
    return cls(src, 2, flaky, buffer_size=6, strict=strict, ordered=ordered,
               on_error=on_error, max_errors=max_errors)


def run(df, n_passes, got, stop_after=None):
    """Iterate passes, appending to ``got``; returns ``(error or None, pass reached)``."""
    try:
        for p in range(n_passes):
            for dp in df:
                got.append(dp[0])
                if stop_after is not None and len(got) == stop_after:
                    return None, p
    except ValueError as e:
        return e, None
    return None, n_passes


def policy_of(df):
    """Where the counts are: a MapData with an error policy runs it in its parallel map."""
    return getattr(df, "_parallel", None) or df


CASES = [
    # kind, on_error, max_errors, strict, ordered
    ("serial", "skip", 4, True, True),            # errors: 5 a pass, the 5th raises
    ("threads", "skip", 5, True, True),           # never raises
    ("threads", "skip", 2, True, True),
    ("threads", "replace", 0.3, True, True),      # 5 of 20 = 0.25 a pass: never raises
    ("threads", "replace", 3, False, True),
    ("processes", "skip", 5, True, False),        # unordered: each pass once, in any order
]


@pytest.mark.parametrize("kind, on_error, max_errors, strict, ordered", CASES)
def test_error_counts_survive_a_resume(no_leaks, kind, on_error, max_errors, strict, ordered):
    """A resumed run raises at the same datapoint as an uninterrupted one (max_errors counts the
    errors of the pass from before the state) and reports the same num_skipped/num_replaced."""
    n_passes = 3
    counter = "num_skipped" if on_error == "skip" else "num_replaced"
    D.set_seed(SEED)
    ref_df = build(kind, on_error, max_errors, strict, ordered)
    ref_df.reset_state()
    ref = []
    ref_err, _ = run(ref_df, n_passes, ref)
    ref_count = getattr(policy_of(ref_df), counter)
    ref_df.close()
    assert ref_count > 0
    assert (ref_err is None) == (max_errors in (5, 0.3))
    for k in sorted({1, 3, N - 1, N + 2, len(ref) - 1, len(ref)} | {random.Random(k).randrange(len(ref))
                                                          for k in range(2)}):
        if k <= 0 or k > len(ref) or k == len(ref) and ref_err is not None:
            continue
        D.set_seed(SEED)
        df = build(kind, on_error, max_errors, strict, ordered)
        df.reset_state()
        got = []
        _, p = run(df, n_passes, got, stop_after=k)
        state = through_json(df.state_dict())
        df.close()
        D.set_seed(SEED)
        df = build(kind, on_error, max_errors, strict, ordered)
        df.load_state_dict(state)
        df.reset_state()
        err, _ = run(df, n_passes - p, got)
        count = getattr(policy_of(df), counter)
        df.close()
        if ordered and on_error == "replace":
            # a replacement owed before the resumed run's first good result copies that one,
            # not the last good one before the state (a datapoint, which no state holds)
            replaced = {i for i in range(1, len(ref)) if ref[i] == ref[i - 1]}
            assert len(got) == len(ref)
            assert [x for i, x in enumerate(got) if i not in replaced] == \
                [x for i, x in enumerate(ref) if i not in replaced], f"resumed after {k}"
        elif ordered:
            assert got == ref, f"resumed after {k}"
        else:
            assert sorted(got) == sorted(ref), f"resumed after {k}"
        assert (err is None) == (ref_err is None), f"resumed after {k}"
        assert count == ref_count, f"resumed after {k}: {counter}"


def test_a_skipped_error_does_not_keep_the_source_iterating(tmp_path):
    """A serial map's skipped error kept its traceback, whose frames are the consumer's own,
    with the source's iterator suspended in them: an LMDB source (which refuses a second
    iteration at once) then refused its next pass, e.g. in a resumed pipeline."""
    path = str(tmp_path / "db.lmdb")
    D.LMDBSerializer.save(D.DataFromList([[k] for k in range(3)], shuffle=False), path)
    src = D.LMDBSerializer.load(path, shuffle=False)
    df = D.MapData(src, flaky, on_error="skip")
    df.reset_state()
    it = iter(df)
    assert next(it) == [0] and next(it) == [20]      # datapoint 1 raised and was skipped
    del it                                           # the pass is dropped
    assert [dp[0] for dp in src] == [0, 1, 2]        # the source iterates again at once
    df.close()


def test_counts_are_in_the_state_only_with_an_error_policy():
    df = build("serial", "raise", None, True, True)
    df.reset_state()
    next(iter(df))
    assert "errors" not in df.state_dict()["state"]
    df.close()


# -- shuffle buffers: what a resume reads again ---------------------------------------------------
class Counting(D.DataFlow):
    """A deterministic source that can only be replayed (a DataFlow with ``__iter__`` alone),
    counting the datapoints it makes."""
    made = 0

    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        for k in range(self.n):
            Counting.made += 1
            yield [k]


class CountingMap:
    """A map that counts its calls: the reads of a source that can say where it is."""
    calls = 0

    def __call__(self, dp):
        CountingMap.calls += 1
        return dp


def shuffled(source, buffer_size):
    return D.LocallyShuffleData(source, buffer_size, shuffle_interval=7)


def resumed_reads(build, k, counter, replay=False):
    """Take k datapoints, save, load into a new pipeline and take one more: returns
    (datapoints the resume made, the stream before + after, the uninterrupted stream)."""
    D.set_seed(SEED)
    ref_df = build()
    ref_df.reset_state()
    it = iter(ref_df)
    ref = [next(it)[0] for _ in range(k + 5)]
    ref_df.close()
    D.set_seed(SEED)
    df = build()
    df.reset_state()
    it = iter(df)
    got = [next(it)[0] for _ in range(k)]
    state = through_json(df.state_dict(replay=replay))
    df.close()
    D.set_seed(SEED)
    df2 = build()
    df2.load_state_dict(state)
    df2.reset_state()
    before = counter()
    it2 = iter(df2)
    got.append(next(it2)[0])
    made = counter() - before
    got += [next(it2)[0] for _ in range(4)]
    df2.close()
    return made, got, ref


@pytest.mark.parametrize("buffer_size", [10, 50])
def test_shuffle_buffer_resume_reads_the_buffer_whatever_the_step(buffer_size):
    """Over a source that can say where it is, a resume reads the buffered datapoints again
    and nothing else (plus the one datapoint the next step takes): the same number after 120
    steps as after 2,400, in the 3rd pass of the source."""
    def build():
        return shuffled(D.MapData(D.DataFromList([[k] for k in range(1000)], shuffle=False),
                                  CountingMap()), buffer_size)

    def counter():
        return CountingMap.calls

    reads = []
    for k in (120, 2400):
        made, got, ref = resumed_reads(build, k, counter)
        assert got == ref
        reads.append(made)
    assert reads[0] == reads[1] <= buffer_size + 1


def test_shuffle_buffer_over_a_replay_source_re_iterates_its_pass_once():
    """A source that can only be replayed is re-iterated once, from the start of the pass of
    the oldest buffered datapoint to the newest, whatever the number of runs of consecutive
    steps in the buffer (before: one re-iteration per run, and one more to continue)."""
    n, buffer_size, k = 1000, 30, 700

    def build():
        return shuffled(Counting(n), buffer_size)

    def counter():
        return Counting.made

    with pytest.raises(NotImplementedError, match="Counting.*replay=True"):
        D.set_seed(SEED)
        df = build()
        df.reset_state()
        next(iter(df))
        df.state_dict()
    made, got, ref = resumed_reads(build, k, counter, replay=True)
    assert got == ref
    # the newest buffered datapoint is the (k + buffer_size - 1)-th of the pass (a datapoint
    # enters the buffer buffer_size - 1 steps before it can come out), plus the next one read
    assert made == k + buffer_size + 1


def test_buffers_over_a_runner_with_several_copies_say_why_they_cannot(no_leaks):
    """A runner's position says where each copy is, not which datapoint follows: a buffer that
    would read its datapoints again from such positions says so (one copy is fine)."""
    def runner(copies):
        return D.MultiThreadRunner(lambda: D.DataFromList([[k] for k in range(40)]), 4, copies)

    for df in (shuffled(runner(2), 5), D.MultiThreadMapData(runner(2), 2, lambda dp: dp,
                                                            buffer_size=4)):
        D.set_seed(SEED)
        df.reset_state()
        next(iter(df))
        with pytest.raises(NotImplementedError, match="MultiThreadRunner hands over"):
            df.state_dict()
        df.close()
    made, got, ref = resumed_reads(lambda: shuffled(runner(1), 5), 17, lambda: 0)
    assert got == ref


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_fraction_of_errors_of_a_pass_of_unknown_length(no_leaks, kind):
    """max_errors as a fraction of the datapoints seen so far (the length is unknown) counts
    every result handed over, good ones included (with "skip" it counted the errors alone, so
    one error in a hundred exceeded 0.5), before and after a resume."""
    def bad(dp):
        if dp[0] in (50, 60, 61, 62):
            raise ValueError(f"bad datapoint {dp[0]}")
        return dp

    def build(limit):
        src = D.DataFromGenerator(lambda: iter([[k] for k in range(64)]))
        cls = D.MultiThreadMapData if kind == "threads" else D.MultiProcessMapData
        return cls(src, 2, bad, buffer_size=4, strict=True, ordered=True, on_error="skip",
                   max_errors=limit)

    for limit, raises_at in ((0.5, None), (0.05, 59)):       # 4 errors > 0.05 * 63 at #62
        df = build(limit)
        df.reset_state()
        got = []
        err, _ = run(df, 1, got)
        df.close()
        assert (err is None) == (raises_at is None) and len(got) == (raises_at or 60)
        for k in (10, 55):
            df = build(limit)
            df.reset_state()
            got = []
            run(df, 1, got, stop_after=k)
            state = through_json(df.state_dict(replay=True))
            df.close()
            df = build(limit)
            df.load_state_dict(state)
            df.reset_state()
            err2, _ = run(df, 1, got)
            assert (err2 is None) == (err is None) and len(got) == (raises_at or 60)
            assert df.num_skipped == (3 if err else 4)
            df.close()
