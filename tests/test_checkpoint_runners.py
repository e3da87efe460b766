"""Checkpoint and resume of the runners (issue 18): each copy resumes from its own position.

A runner's copies hand over datapoints in the order they finish, so its stream is not
reproducible element by element; what a resume must keep is each copy's own stream: for every
copy, what the caller received from it before the state plus what it yields after the resume is
a prefix of that copy's uninterrupted stream (nothing lost, nothing twice), and every pass still
has ``len(ds)`` datapoints. The map inside each copy tags every datapoint with its random
stream's key ``(pass, index, copy)``, which says which copy made it and where."""
import collections
import json
import random

import pytest

import dataflow as D
from dataflow import checkpoint as _ckpt
from dataflow import rng as _rng

SEED = 11
N = 20                      # datapoints per pass of a copy: more than MARK_EVERY


def tagged(dp):
    """``[value, pass, index, copy, random draw]``: where in which copy this datapoint was
    made, and a number from its own random stream."""
    p, i, c = _rng._local.key
    return [dp[0], p, i, c, int(_rng.datapoint_rng().integers(1 << 30))]


def copy_df(shuffle):
    return D.MapData(D.DataFromList([[k] for k in range(N)], shuffle=shuffle), tagged)


def build(kind, copies=2, shuffle=True):
    if kind == "threads":
        return D.MultiThreadRunner(lambda: copy_df(shuffle), 4, copies)
    return D.MultiProcessRunner(copy_df(shuffle), 4, copies)


def through_json(state):
    return json.loads(json.dumps(state))


def take(df, k, n_passes):
    """k datapoints over up to n_passes passes; returns (taken, pass of the state)."""
    got = []
    if k == 0:
        return got, 0
    for p in range(n_passes):
        for dp in df:
            got.append(dp)
            if len(got) == k:
                return got, p
    return got, n_passes


def check_copies(items, made):
    """Each copy's datapoints, in the order received, are its stream from its start: datapoint
    j of copy c is index j % N of its pass j // N, and equals what the uninterrupted run made
    there (``made``: (copy, pass, index) -> datapoint)."""
    by_copy = collections.defaultdict(list)
    for dp in items:
        by_copy[dp[3]].append(dp)
    for c, seq in by_copy.items():
        assert [(dp[1], dp[2]) for dp in seq] == [(j // N, j % N) for j in range(len(seq))], \
            f"copy {c} lost or repeated datapoints"
        for dp in seq:
            want = made.get((c, dp[1], dp[2]))
            assert want is None or want == dp, f"copy {c} made another datapoint at {dp[1:3]}"
        # a copy's pass visits every value once
        for p in {dp[1] for dp in seq}:
            values = [dp[0] for dp in seq if dp[1] == p]
            assert len(set(values)) == len(values)


def uninterrupted(kind, n_passes, **kw):
    D.set_seed(SEED)
    df = build(kind, **kw)
    df.reset_state()
    try:
        items = [dp for _ in range(n_passes) for dp in df]
    finally:
        df.close()
    return items, {(dp[3], dp[1], dp[2]): dp for dp in items}


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_runner_resumes_each_copy_where_it_stopped(no_leaks, kind):
    n_passes = 2
    total = N * n_passes
    ref, made = uninterrupted(kind, n_passes + 1)
    check_copies(ref, made)
    rnd = random.Random(kind)
    steps = sorted({0, 1, N - 1, N, N + 1, total - 1, total} | set(rnd.sample(range(total), 4)))
    for k in steps:
        D.set_seed(SEED)
        df = build(kind)
        df.reset_state()
        before, p = take(df, k, n_passes)
        state = through_json(df.state_dict())
        assert len(state["state"]["copies"]) == 2
        df.close()
        D.set_seed(SEED)
        df2 = build(kind)
        if k % 2:
            df2.load_state_dict(state)
            df2.reset_state()
        else:                                   # load into workers that already started
            df2.reset_state()
            df2.load_state_dict(state)
        try:
            after = [dp for _ in range(p, n_passes) for dp in df2]
        finally:
            df2.close()
        assert len(before) + len(after) == total, f"step {k}: passes have len(ds) datapoints"
        check_copies(before + after, made)


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_a_copy_whose_last_mark_ends_a_pass_resumes_into_the_next_pass(no_leaks, kind):
    """A copy's mark comes on its 1st, 17th, ... datapoint; with passes of 17 datapoints the
    17th is the last of the first pass, so the mark is "at the end of pass 0". A copy resumed
    there has nothing left of that pass: it goes on with the next one. It raised "a pass of
    MapData produced no datapoint" (found when two interruptions in a row put a copy there)."""
    n = _ckpt.MARK_EVERY + 1

    def make():
        return D.MapData(D.DataFromList([[k] for k in range(n)], shuffle=False), tagged)
    runner = {"threads": lambda: D.MultiThreadRunner(make, 4, 1),
              "processes": lambda: D.MultiProcessRunner(make(), 4, 1)}[kind]
    for k in (n, n + 3):                        # the mark, then the mark and 3 after it
        df = runner()
        df.reset_state()
        before, _ = take(df, k, 2)
        state = through_json(df.state_dict())
        df.close()
        df = runner()
        df.load_state_dict(state)
        df.reset_state()
        try:
            after, _ = take(df, n, 2)
        finally:
            df.close()
        assert [(dp[0], dp[1], dp[2]) for dp in before + after] == \
            [(j % n, j // n, j % n) for j in range(k + n)], f"resumed after {k}"


def test_two_interruptions_and_state_moves_from_threads_to_processes(no_leaks):
    """A state of thread copies loads into process copies (as many), twice in a row; the copies'
    streams continue (their random draws are keyed by (pass, index, copy), and an unshuffled
    source is the same in both)."""
    _, made = uninterrupted("threads", 4, shuffle=False)
    n_passes = 3
    D.set_seed(SEED)
    df = build("threads", shuffle=False)
    df.reset_state()
    got, _ = take(df, 13, n_passes)
    state = through_json(df.state_dict())
    df.close()
    for kind, k in (("processes", 21), ("threads", None)):
        D.set_seed(SEED)
        df = build(kind, shuffle=False)
        df.load_state_dict(state)
        df.reset_state()
        try:
            first = state["state"]["pass"]
            if k is None:
                got += [dp for _ in range(first, n_passes) for dp in df]
            else:
                more, _ = take(df, k, n_passes - first)
                got += more
                state = through_json(df.state_dict())
        finally:
            df.close()
    assert len(got) == n_passes * N
    check_copies(got, made)


def test_state_between_iter_and_first_next_is_the_loaded_one(no_leaks):
    D.set_seed(SEED)
    df = build("threads")
    df.reset_state()
    take(df, 5, 1)
    state = through_json(df.state_dict())
    df.close()
    df2 = build("threads")
    df2.load_state_dict(state)
    assert through_json(df2.state_dict()) == state
    df2.reset_state()
    it = iter(df2)
    assert through_json(df2.state_dict()) == state
    next(it)
    assert through_json(df2.state_dict()) != state
    df2.close()


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_a_state_needs_as_many_copies(no_leaks, kind):
    D.set_seed(SEED)
    df = build(kind, copies=2)
    df.reset_state()
    take(df, 3, 1)
    state = through_json(df.state_dict())
    df.close()
    name = "num_thread" if kind == "threads" else "num_proc"
    with pytest.raises(ValueError, match=f"{name}=2.*{name}=3"):
        build(kind, copies=3).load_state_dict(state)


def test_state_of_a_runner_over_another_pipeline_is_refused():
    state = through_json(build("threads").state_dict())
    other = D.MultiThreadRunner(lambda: D.BatchData(copy_df(True), 2), 4, 2)
    with pytest.raises(ValueError, match="MapData.*BatchData"):
        other.load_state_dict(state)


def test_state_is_small_and_asks_no_copy(no_leaks):
    """A copy's position is its dataflow's few ints and how many datapoints follow the last
    one it attached: at most MARK_EVERY - 1 are made again on resume."""
    D.set_seed(SEED)
    df = build("processes")
    df.reset_state()
    take(df, 37, 3)
    state = df.state_dict()
    df.close()
    assert len(json.dumps(state)) < 1500
    for entry in state["state"]["copies"]:
        assert entry is None or 0 <= entry["skip"] < _ckpt.MARK_EVERY


@pytest.mark.parametrize("kind", ["threads", "processes"])
def test_runner_of_a_source_that_cannot_say_where_it_is(no_leaks, kind):
    """A copy that cannot say where it is (a generator) keeps today's rule: state_dict() names
    it, and replay=True drops what the pass handed over (exact with one copy)."""
    def gen_df():
        return D.DataFromGenerator(lambda: iter([[k] for k in range(6)]), size=6)

    def build_gen():
        if kind == "threads":
            return D.MultiThreadRunner(gen_df, 3, 1)
        return D.MultiProcessRunner(gen_df(), 3, 1)

    df = build_gen()
    df.reset_state()
    it = iter(df)
    taken = [next(it)[0] for _ in range(4)]
    with pytest.raises(NotImplementedError, match="DataFromGenerator.*replay=True"):
        df.state_dict()
    state = through_json(df.state_dict(replay=True))
    rest = [x[0] for x in it]
    df.close()
    df2 = build_gen()
    df2.load_state_dict(state)
    df2.reset_state()
    assert taken + [x[0] for x in df2] == taken + rest == list(range(6))
    df2.close()


def test_the_prefetch_aliases_are_the_runners():
    assert D.PrefetchDataZMQ is D.MultiProcessRunnerZMQ
    assert D.PrefetchData is D.MultiProcessRunner
    assert D.MultiThreadPrefetchData is D.MultiThreadRunner


def test_zmq_runner_resumes(no_leaks):
    D.set_seed(SEED)
    _, made = uninterrupted("processes", 3, copies=1)
    D.set_seed(SEED)
    df = D.MultiProcessRunnerZMQ(copy_df(True), num_proc=1, hwm=4)
    df.reset_state()
    got, _ = take(df, 23, 2)
    state = through_json(df.state_dict())
    df.close()
    D.set_seed(SEED)
    df = D.MultiProcessRunnerZMQ(copy_df(True), num_proc=1, hwm=4)
    df.load_state_dict(state)
    df.reset_state()
    try:
        got += list(df)
    finally:
        df.close()
    assert len(got) == 2 * N
    check_copies(got, made)


class Opaque(D.ProxyDataFlow):
    def _get_position(self):
        raise NotImplementedError("Opaque keeps no position")


def test_runner_of_copies_whose_position_raises_falls_back_to_replay(no_leaks):
    """A copy whose dataflow raises NotImplementedError when asked where it is makes the
    runner's state a replay position (state_dict() names the runner)."""
    def copy():
        return Opaque(D.DataFromList([[k] for k in range(6)], shuffle=False))

    df = D.MultiThreadRunner(copy, 3, 1)
    df.reset_state()
    it = iter(df)
    taken = [next(it)[0] for _ in range(2)]
    with pytest.raises(NotImplementedError, match="MultiThreadRunner.*replay=True"):
        df.state_dict()
    state = through_json(df.state_dict(replay=True))
    assert state["state"]["pos"] == 2
    df.close()
    df2 = D.MultiThreadRunner(copy, 3, 1)
    df2.load_state_dict(state)
    df2.reset_state()
    assert taken + [x[0] for x in df2] == list(range(6))
    df2.close()


def test_autotuned_runner_records_the_copies_it_adds(no_leaks):
    """With num_proc="auto" the copy count changes while it runs: its state is a replay
    position, and datapoints of copies added later are recorded without error."""
    df = D.MultiProcessRunner(copy_df(False), 8, "auto")
    df.reset_state()
    try:
        got = [dp for _ in range(3) for dp in df]
        assert len(got) == 3 * N
        assert "replay_of" in df.state_dict(replay=True)["state"]
    finally:
        df.close()


@pytest.mark.parametrize("kind", ["threads", "processes", "zmq"])
def test_runner_iterated_without_reset_state_or_after_close_records_its_copies(no_leaks, kind):
    """A runner, like the maps, starts its workers at the first next() when reset_state() was
    not called, or again after close(); its records of the copies are then the new ones (they
    were the old ones, or none: a TypeError without reset_state, and after close() a state
    that started every copy afresh, repeating what the caller had)."""
    def make():
        src = D.DataFromList([[k] for k in range(10)], shuffle=False)
        if kind == "threads":
            return D.MultiThreadRunner(lambda: src, 3, 1)
        if kind == "zmq":
            return D.MultiProcessRunnerZMQ(src, 1, hwm=3)
        return D.MultiProcessRunner(src, 3, 1)
    df = make()
    try:
        assert list(df) == [[k] for k in range(10)]        # no reset_state() before
        df.close()
        it = iter(df)
        first = [next(it)[0] for _ in range(3)]
        state = through_json(df.state_dict())
    finally:
        df.close()
    df = make()
    df.load_state_dict(state)
    try:
        rest = [dp[0] for dp in df]
    finally:
        df.close()
    assert first + rest == list(range(10))
