"""``list(df)`` works on dataflows of unknown length, and ``len()`` still raises something that
``except NotImplementedError`` catches (tensorpack's contract)."""
import pytest

import dataflow as D


def _gen():
    return iter([[1], [2], [3]])


@pytest.mark.parametrize("make", [
    lambda: D.DataFromGenerator(_gen),
    lambda: D.DataFromIterable(x for x in [[1], [2], [3]]),
    lambda: D.MapData(D.DataFromGenerator(_gen), lambda dp: dp),
    lambda: D.MapDataComponent(D.DataFromGenerator(_gen), lambda x: x, 0),
])
def test_list_tuple_sorted_iterate_a_dataflow_of_unknown_length(make):
    assert list(make()) == [[1], [2], [3]]
    assert tuple(make()) == ([1], [2], [3])
    assert sorted(make(), reverse=True) == [[3], [2], [1]]
    with pytest.raises(NotImplementedError):
        len(make())
    with pytest.raises(TypeError):
        len(make())


def test_the_error_type_is_both():
    assert issubclass(D.UnknownLengthError, NotImplementedError)
    assert issubclass(D.UnknownLengthError, TypeError)

    class Plain(D.DataFlow):
        def __iter__(self):
            yield [0]
    with pytest.raises(D.UnknownLengthError, match="Plain does not know its length"):
        len(Plain())
    assert list(Plain()) == [[0]]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("make", [
    lambda: D.RepeatedData(D.DataFromGenerator(_gen), -1),
    lambda: D.LocallyShuffleData(D.DataFromGenerator(_gen), 2),
    lambda: D.MapData(D.LocallyShuffleData(D.DataFromGenerator(_gen), 2), lambda dp: dp),
    lambda: D.MultiProcessRunnerZMQ(D.DataFromGenerator(_gen), 2),
    lambda: D.MultiThreadRunner(lambda: D.DataFromGenerator(_gen), 4, 2),
    lambda: D.MultiProcessMapAndBatchData(D.DataFromGenerator(_gen), 2, lambda dp: dp, 2),
], ids=["RepeatedData-1", "LocallyShuffleData", "MapData-over-it", "MultiProcessRunnerZMQ",
        "MultiThreadRunner", "MultiProcessMapAndBatchData"])
def test_list_of_an_endless_dataflow_fails_at_once(make, no_leaks):
    # these never end a pass over an input of unknown length: list() ran forever on three
    df = make()
    try:
        with pytest.raises(D.EndlessError, match="endless|never ends|infinite"):
            len(df)                 # before reset_state() too (MultiThreadRunner's was not)
        df.reset_state()
        with pytest.raises(D.EndlessError, match="endless|never ends|infinite"):
            list(df)
        with pytest.raises(NotImplementedError):
            len(df)
        assert not issubclass(D.EndlessError, TypeError)
    finally:
        df.close()


def _drop_all(dp):
    return None


def _keep_every_fifth(dp):
    return dp if dp[0] % 5 == 0 else None


@pytest.mark.timeout(60)
def test_map_and_batch_of_a_map_that_drops_everything_raises_instead_of_waiting(no_leaks):
    # the source repeats forever inside, so no pass ends: it waited for a batch for ever
    df = D.MultiProcessMapAndBatchData(D.DataFromGenerator(_gen), 1, _drop_all, 2)
    df.reset_state()
    with pytest.raises(ValueError, match="map_func dropped every datapoint .* whole passes of "
                                         "the source"):
        next(iter(df))
    df.close()
    # a map that drops most datapoints goes on batching what it keeps
    df = D.MultiProcessMapAndBatchData(
        D.DataFromGenerator(lambda: iter([[i] for i in range(7)])), 1, _keep_every_fifth, 2)
    df.reset_state()
    it = iter(df)
    assert all(set(next(it)[0].tolist()) <= {0, 5} for _ in range(5))
    df.close()
