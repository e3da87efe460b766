import queue

import numpy as np
import pytest

import dataflow
from dataflow import (DataFlow, DataFromGenerator, DataFromIterable, DataFromList, DataFromQueue,
                      FakeData, UnknownLengthError, set_seed)


@pytest.fixture(autouse=True)
def _no_global_seed():
    set_seed(None)
    yield
    set_seed(None)


def _passes(df, n=1):
    df.reset_state()
    return [list(iter(df)) for _ in range(n)]  # list(df) would probe len()


# ---------------------------------------------------------------- DataFromList

def test_datafromlist_no_shuffle_keeps_order_every_pass():
    lst = [[i] for i in range(7)]
    df = DataFromList(lst, shuffle=False)
    assert len(df) == 7
    p1, p2 = _passes(df, 2)
    assert p1 == lst and p2 == lst


def test_datafromlist_shuffle_is_a_permutation_and_changes():
    lst = [[i] for i in range(50)]
    df = DataFromList(lst, shuffle=True)
    passes = _passes(df, 3)
    for p in passes:
        assert sorted(p) == lst
    # equal passes, or a pass equal to the identity, are practically impossible for 50 items
    assert not (passes[0] == passes[1] == passes[2])
    assert passes[0] != lst


def test_datafromlist_set_seed_reproducible_and_unseeded_differs():
    lst = [[i] for i in range(40)]

    def run():
        df = DataFromList(lst)
        return _passes(df, 2)

    set_seed(123)
    a = run()
    set_seed(123)
    b = run()
    assert a == b
    set_seed(124)
    c = run()
    assert c != a
    set_seed(None)
    d, e = run(), run()
    assert d != e


def test_datafromlist_without_reset_state_is_a_clear_error():
    df = DataFromList([[1], [2]], shuffle=True)
    with pytest.raises(RuntimeError, match="reset_state"):
        list(iter(df))


def test_datafromlist_dict_datapoints():
    lst = [{"a": i} for i in range(3)]
    (p,) = _passes(DataFromList(lst, shuffle=False))
    assert p == lst


@pytest.mark.parametrize("lst, match", [
    ({"a": 1, "b": 2}, "got a dict without the key 0"),
    ({3, 4, 5}, "supporting len\\(\\) and indexing .*got a set"),
    (frozenset([1]), "got a frozenset"),
    ({"a": 1}.keys(), "got a dict_keys"),
    ((i for i in range(3)), "got a generator"),
])
@pytest.mark.parametrize("shuffle", [False, True])
def test_datafromlist_refuses_what_is_not_a_sequence_when_built(lst, match, shuffle):
    # these failed only at the first pass (KeyError 0, "'set' object is not subscriptable")
    with pytest.raises(TypeError, match="DataFromList: lst must be a sequence.*" + match):
        DataFromList(lst, shuffle=shuffle)


def test_datafromlist_takes_any_indexable_sequence():
    arr = np.arange(6).reshape(3, 2)
    (p,) = _passes(DataFromList(arr, shuffle=False))
    assert [a.tolist() for a in p] == arr.tolist()
    for lst, want in ((range(4), [0, 1, 2, 3]), ("abc", ["a", "b", "c"]),
                      ({0: "x", 1: "y"}, ["x", "y"])):
        df = DataFromList(lst, shuffle=True)
        assert sorted(_passes(df)[0]) == want
    # a dict keyed 0 .. n - 1 gives its values in order without shuffling too (tensorpack
    # iterated it there, giving the keys)
    assert _passes(DataFromList({1: "y", 0: "x"}, shuffle=False)) == [["x", "y"]]


# ---------------------------------------------------------------- DataFromGenerator

def test_datafromgenerator_function_reiterable():
    def gen():
        for i in range(4):
            yield [i]

    df = DataFromGenerator(gen)
    assert _passes(df, 2) == [[[0], [1], [2], [3]]] * 2
    with pytest.raises(NotImplementedError):
        len(df)


@pytest.mark.parametrize("cls", [DataFromGenerator, DataFromIterable])
def test_a_generator_object_second_pass_raises(cls):
    df = cls(([i] for i in range(3)))      # DataFromIterable's pass was silently empty
    df.reset_state()
    assert list(iter(df)) == [[0], [1], [2]]
    with pytest.raises(RuntimeError, match=f"{cls.__name__} wraps an iterator .*already exhausted"):
        list(iter(df))


@pytest.mark.parametrize("cls", [DataFromGenerator, DataFromIterable])
def test_a_generator_object_partial_pass_resumes(cls):
    df = cls(([i] for i in range(4)))
    df.reset_state()
    it = iter(df)
    assert next(it) == [0]
    it.close()
    assert list(iter(df)) == [[1], [2], [3]]


@pytest.mark.parametrize("cls", [DataFromGenerator, DataFromIterable])
def test_wrapping_a_reiterable_begins_no_pass_of_it(cls):
    class Counted:                 # iter() does work, as it starts a parallel map's pass
        passes = 0

        def __iter__(self):
            Counted.passes += 1
            return iter([[1]])

    df = cls(Counted())            # whether it is one-shot was asked by calling iter() on it
    assert Counted.passes == 0
    assert list(iter(df)) == [[1]] and list(iter(df)) == [[1]]
    assert Counted.passes == 2


def test_datafromgenerator_size_gives_len():
    assert len(DataFromGenerator(lambda: iter([[1]]), size=1)) == 1


def test_datafromgenerator_len_is_that_of_a_sized_gen_as_in_tensorpack():
    # tensorpack 0.11: len(DataFromGenerator(gen)) is len(gen), so a list has its length
    df = DataFromGenerator([[1], [2], [3]])
    assert len(df) == 3 and _passes(df, 2) == [[[1], [2], [3]]] * 2
    assert len(dataflow.BatchData(df, 2, remainder=True)) == 2
    with pytest.raises(ValueError, match="batch_size=4 is larger than the dataflow"):
        dataflow.BatchData(df, 4)        # as tensorpack's assert: no batch would come

    class NoLen(DataFlow):               # a dataflow of unknown length, tensorpack-style
        def __iter__(self):
            yield [1]

        def __len__(self):
            raise NotImplementedError

    for gen in (NoLen(), lambda: iter([[1]]), iter([[1]])):
        with pytest.raises(UnknownLengthError):
            len(DataFromGenerator(gen))


# ---------------------------------------------------------------- DataFromIterable

def test_datafromiterable_with_len():
    df = DataFromIterable([[0], [1], [2]])
    assert len(df) == 3
    assert _passes(df, 2) == [[[0], [1], [2]]] * 2


def test_datafromiterable_without_len():
    class It:
        def __iter__(self):
            return iter([[5], [6]])

    df = DataFromIterable(It())
    with pytest.raises(NotImplementedError):
        len(df)
    assert _passes(df, 2) == [[[5], [6]]] * 2


@pytest.mark.parametrize("error", [NotImplementedError, ValueError])
def test_datafromiterable_whose_len_raises_has_no_length(error):
    # tensorpack takes any exception from len() as "no length"; it was raised when built
    class It:
        def __iter__(self):
            return iter([[5], [6]])

        def __len__(self):
            raise error

    df = DataFromIterable(It())
    with pytest.raises(UnknownLengthError):
        len(df)
    assert _passes(df) == [[[5], [6]]]


# ---------------------------------------------------------------- DataFromQueue

def test_datafromqueue_yields_queue_items():
    q = queue.Queue()
    for i in range(3):
        q.put([i])
    df = DataFromQueue(q)
    df.reset_state()
    it = iter(df)
    assert [next(it) for _ in range(3)] == [[0], [1], [2]]
    q.put([9])
    assert next(it) == [9]
    it.close()
    # endless: list() fails at once (as tensorpack's) instead of blocking on the queue
    with pytest.raises(NotImplementedError, match="endless"):
        list(df)


def test_datafromqueue_is_not_reentrant():
    q = queue.Queue()
    for i in range(4):
        q.put([i])
    df = DataFromQueue(q)
    df.reset_state()
    a = iter(df)
    assert next(a) == [0]
    b = iter(df)
    with pytest.raises(RuntimeError, match="reentrant"):
        next(b)
    a.close()
    # once the first iteration is over, a new one works
    c = iter(df)
    assert next(c) == [1]
    c.close()


# ---------------------------------------------------------------- FakeData

def test_fakedata_shapes_dtypes_domain_len():
    df = FakeData([[2, 3], [4]], size=5, dtype=["float32", "int64"], domain=[(0, 1), (10, 20)])
    assert len(df) == 5
    (p,) = _passes(df)
    assert len(p) == 5
    for dp in p:
        assert dp[0].shape == (2, 3) and dp[0].dtype == np.float32
        assert dp[1].shape == (4,) and dp[1].dtype == np.int64
        assert (dp[0] >= 0).all() and (dp[0] < 1).all()
        assert (dp[1] >= 10).all() and (dp[1] < 20).all()
    assert not np.array_equal(p[0][0], p[1][0])


def test_fakedata_single_dtype_and_list_domain():
    df = FakeData([[3]], size=2, dtype="uint8", domain=[0, 255])
    (p,) = _passes(df)
    assert p[0][0].dtype == np.uint8


def test_fakedata_non_random_repeats_same_datapoint():
    df = FakeData([[3], [2]], size=4, random=False)
    (p,) = _passes(df)
    for dp in p[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(dp, p[0]))
        assert dp is not p[0]  # a shallow copy, as in tensorpack


def test_fakedata_seeded():
    set_seed(7)
    a = _passes(FakeData([[3]], size=3))
    set_seed(7)
    b = _passes(FakeData([[3]], size=3))
    assert all(np.array_equal(x[0], y[0]) for x, y in zip(a[0], b[0]))


def test_fakedata_dtype_count_mismatch():
    with pytest.raises(ValueError):
        FakeData([[1], [2]], dtype=["float32"])


@pytest.mark.parametrize("kwargs, error, match", [
    # size="3" gave len() 3 and size=1.5 len() 1; the others failed at the first datapoint
    # inside numpy, naming no argument
    (dict(shapes=[[2]], size="3"), ValueError, "FakeData: size must be an int >= 0, got '3'"),
    (dict(shapes=[[2]], size=1.5), ValueError, "FakeData: size must be an int >= 0, got 1.5"),
    (dict(shapes=[[-1]]), ValueError, r"FakeData: shapes\[0\] must be an int >= 0, got -1"),
    (dict(shapes=5), TypeError, "FakeData: shapes must be a list of shapes"),
    (dict(shapes=[[2]], dtype="floot"), TypeError, "FakeData: not a numpy dtype: 'floot'"),
    (dict(shapes=[[2]], random="False"), TypeError, "FakeData: random must be True or False"),
])
def test_fakedata_refuses_bad_arguments_when_built(kwargs, error, match):
    with pytest.raises(error, match=match):
        FakeData(**kwargs)
    assert len(FakeData([[2, 3]], size=1e3)) == 1000       # a whole float, as int() took it
    assert len(FakeData([range(2, 4)], size=np.float32(5))) == 5   # any sequence; numpy floats


def test_datafromgenerator_refuses_a_bad_size_when_built():
    # size=-1 made len() raise Python's "__len__() should return >= 0"
    with pytest.raises(ValueError, match="DataFromGenerator: size must be an int >= 0, got -1"):
        DataFromGenerator(lambda: iter([[1]]), size=-1)


def test_exported_from_package():
    for name in ["DataFromList", "DataFromGenerator", "DataFromIterable", "DataFromQueue",
                 "FakeData"]:
        assert getattr(dataflow, name).__module__ == "dataflow.raw"
