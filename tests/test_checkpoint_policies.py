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


def test_counts_are_in_the_state_only_with_an_error_policy():
    df = build("serial", "raise", None, True, True)
    df.reset_state()
    next(iter(df))
    assert "errors" not in df.state_dict()["state"]
    df.close()
