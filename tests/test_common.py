import logging
import sys
import threading
from collections import Counter

import numpy as np
import pytest

import dataflow
from dataflow import (BatchData, BatchDataByShape, CacheData, ConcatData, DataFlow,
                      DataFromGenerator, DataFromList, FixedSizeData, JoinData,
                      LocallyShuffleData, MapData, MapDataComponent, PrintData, RandomChooseData,
                      RandomMixData, RepeatedData, RepeatedDataPoint, SelectComponent,
                      TestDataSpeed, set_seed)


@pytest.fixture(autouse=True)
def _no_global_seed():
    set_seed(None)
    yield
    set_seed(None)


class Counting(DataFlow):
    """[0], [1], ..., [n-1]; counts its passes and resets."""

    def __init__(self, n, start=0):
        self.n, self.start = n, start
        self.passes = 0
        self.resets = 0

    def reset_state(self):
        self.resets += 1

    def __len__(self):
        return self.n

    def __iter__(self):
        self.passes += 1
        for i in range(self.start, self.start + self.n):
            yield [i]


def lst(df):
    """One pass (``list(df)`` would call ``len(df)``, which may raise NotImplementedError)."""
    return list(iter(df))


def take(df, n):
    it = iter(df)
    out = [next(it) for _ in range(n)]
    it.close()
    return out


def flat(dps):
    return [dp[0] for dp in dps]


def assert_not_reentrant(df):
    a = iter(df)
    next(a)
    b = iter(df)
    with pytest.raises(RuntimeError, match="reentrant"):
        next(b)
    a.close()


# ------------------------------------------------------- tensorpack's old method names

class _OldStyle(DataFlow):
    """Written as before tensorpack 0.9: get_data() and size(), no __iter__/__len__."""

    def get_data(self):
        for i in range(5):
            yield [i]

    def size(self):
        return 5


class _OldStyleProxy(dataflow.ProxyDataFlow):
    def get_data(self):
        for dp in self.ds.get_data():
            yield [dp[0] * 10]


def test_old_style_get_data_and_size_become_iter_and_len():
    df = _OldStyle()
    assert list(df) == [[i] for i in range(5)] and len(df) == 5
    assert list(df.get_data()) == list(df) and df.size() == 5
    proxy = _OldStyleProxy(_OldStyle())
    proxy.reset_state()
    assert list(proxy) == [[i * 10] for i in range(5)] and len(proxy) == 5
    batches = BatchData(MapData(_OldStyle(), lambda dp: [dp[0] + 1]), 2, remainder=True)
    batches.reset_state()
    assert [b[0].tolist() for b in batches] == [[1, 2], [3, 4], [5]]


def test_a_dataflow_made_with_tensorpacks_metaclass_named():
    # tensorpack code may name DataFlowMeta (six.add_metaclass(DataFlowMeta) in old scripts)
    from dataflow.base import DataFlowMeta

    class Named(dataflow.DataFlow, metaclass=DataFlowMeta):
        def get_data(self):
            yield from ([i] for i in range(3))

        def size(self):
            return 3
    df = Named()
    df.reset_state()
    assert list(df) == [[0], [1], [2]] and len(df) == 3


def test_old_style_dataflow_in_worker_processes(no_leaks):
    df = dataflow.MultiProcessMapData(_OldStyle(), 2, lambda dp: [dp[0] + 1], strict=True)
    df.reset_state()
    try:
        assert sorted(df) == [[i + 1] for i in range(5)]    # exactly once each, any order
    finally:
        df.close()


def test_new_style_iter_wins_over_get_data():
    class Both(DataFlow):
        def __iter__(self):
            yield ["iter"]

        def get_data(self):
            yield ["get_data"]

    assert list(Both()) == [["iter"]]


def test_own_attributes_named_like_the_replay_count_are_left_alone():
    # a tensorpack dataflow may keep its own _pos, _pass, _resume or _in_pass: the count kept
    # for state_dict(replay=True) overwrote them (a pass read 0, 1 for _pos, or crashed)
    class Reader(DataFlow):
        def __init__(self):
            self._pos, self._pass, self._resume, self._in_pass = 100, "x", [1], 5

        def __len__(self):
            return 2

        def __iter__(self):
            for i in range(2):
                yield [i, self._pos, self._pass, self._resume, self._in_pass]

    df = Reader()
    df.reset_state()
    expected = [[0, 100, "x", [1], 5], [1, 100, "x", [1], 5]]
    assert list(df) == expected and list(df) == expected
    assert (df._pos, df._pass, df._resume, df._in_pass) == (100, "x", [1], 5)
    it = iter(df)
    next(it)
    state = df.state_dict(replay=True)         # the count is still kept, elsewhere
    again = Reader()
    again.load_state_dict(state)
    assert list(iter(again)) == expected[1:]


def test_a_counted_user_dataflow_is_freed_when_dropped_and_its_copies_count_apart():
    import copy
    import gc
    import pickle
    import weakref

    df = _Counted()
    df.reset_state()
    it = iter(df)
    next(it)
    # the count refers to its dataflow weakly: no reference cycle keeps a dropped one alive
    pickled = pickle.dumps(df)
    shallow = copy.copy(df)
    gone = weakref.ref(df)
    gc.disable()
    try:
        del df, it
        assert gone() is None
    finally:
        gc.enable()
    restored = pickle.loads(pickled)            # a pickled copy brings its count along
    assert restored.state_dict(replay=True)["state"]["pos"] == 1
    assert next(iter(restored)) == [0]          # (a new pass starts from the top)
    next(iter(shallow))
    assert shallow.state_dict(replay=True)["state"]["pos"] == 1   # its own count


class _Counted(DataFlow):
    def __len__(self):
        return 3

    def __iter__(self):
        for i in range(3):
            yield [i]


# ---------------------------------------------------------------- MapData

def test_mapdata_maps_in_order_and_drops_none():
    df = MapData(Counting(6), lambda dp: None if dp[0] % 2 else [dp[0] * 10])
    df.reset_state()
    assert lst(df) == [[0], [20], [40]]
    assert len(df) == 6  # tensorpack: len of the source, even when some are dropped


def test_mapdata_func_gets_shallow_copy():
    src = [[1, "a"], [2, "b"]]

    def f(dp):
        dp[0] = -dp[0]
        return dp

    df = MapData(DataFromList(src, shuffle=False), f)
    df.reset_state()
    assert lst(df) == [[-1, "a"], [-2, "b"]]
    assert src == [[1, "a"], [2, "b"]]


def test_mapdata_dict_datapoints():
    df = MapData(DataFromList([{"x": 1}, {"x": 2}], shuffle=False),
                 lambda dp: {**dp, "y": dp["x"] + 1})
    df.reset_state()
    assert lst(df) == [{"x": 1, "y": 2}, {"x": 2, "y": 3}]


def test_mapdata_generator_result_is_type_error():
    def my_bad_mapper(dp):
        if dp[0] == 2:
            yield dp
        return

    def wrapper(dp):
        if dp[0] < 2:
            return dp
        return my_bad_mapper(dp)

    df = MapData(Counting(5), wrapper)
    df.reset_state()
    it = iter(df)
    assert next(it) == [0] and next(it) == [1]
    with pytest.raises(TypeError) as ei:
        next(it)
    msg = str(ei.value)
    assert "wrapper" in msg and "datapoint 2" in msg


def test_mapdata_sets_the_key_in_the_thread_that_resumes_its_pass(no_leaks):
    """The datapoint key is set in the running thread's storage, even when one pass moves to
    another thread, and is cleared outside the map call in both threads."""
    import threading
    from dataflow import rng as drng

    def key_of(dp):
        return [dp[0], tuple(drng._local.key)]

    df = MapData(DataFromList([[k] for k in range(4)], shuffle=False), key_of)
    df.reset_state()
    it = iter(df)
    got = [next(it), next(it)]
    seen = {}

    def other():
        got.append(next(it))
        got.append(next(it))
        seen["key"] = drng._local.key

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert [dp[0] for dp in got] == [0, 1, 2, 3]
    assert [dp[1][1] for dp in got] == [0, 1, 2, 3]      # the key's index, in both threads
    assert len({dp[1][0] for dp in got}) == 1            # one pass
    assert seen["key"] is None and drng._local.key is None


# ---------------------------------------------------------------- MapDataComponent

def test_mapdatacomponent_list_tuple_and_none():
    src = [(1, "a"), (2, "b"), (3, "c")]
    df = MapDataComponent(DataFromList(src, shuffle=False),
                          lambda x: None if x == 2 else x * 100, index=0)
    df.reset_state()
    assert lst(df) == [[100, "a"], [300, "c"]]
    assert src == [(1, "a"), (2, "b"), (3, "c")]


def test_mapdatacomponent_dict_key_and_source_untouched():
    src = [{"img": 1, "label": 5}, {"img": 2, "label": 6}]
    df = MapDataComponent(DataFromList(src, shuffle=False), lambda v: v + 1, index="label")
    df.reset_state()
    assert lst(df) == [{"img": 1, "label": 6}, {"img": 2, "label": 7}]
    assert src[0]["label"] == 5


# ---------------------------------------------------------------- BatchData

def test_batchdata_remainder_false_drops_last_batch():
    df = BatchData(Counting(10), 3)
    df.reset_state()
    assert len(df) == 3
    out = lst(df)
    assert len(out) == 3
    assert [b[0].tolist() for b in out] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


def test_batchdata_remainder_true_keeps_last_batch():
    df = BatchData(Counting(10), 3, remainder=True)
    df.reset_state()
    assert len(df) == 4
    out = lst(df)
    assert [b[0].tolist() for b in out] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert len(BatchData(Counting(9), 3, remainder=True)) == 3


def test_batchdata_dtypes():
    src = [[i, float(i), bool(i % 2), np.full((2, 2), i, np.uint8), f"s{i}", np.int16(i),
            {"k": i}] for i in range(4)]
    df = BatchData(DataFromList(src, shuffle=False), 4)
    df.reset_state()
    (b,) = lst(df)
    assert b[0].dtype == np.int32 and b[0].tolist() == [0, 1, 2, 3]
    assert b[1].dtype == np.float32
    assert b[2].dtype == np.bool_ and b[2].tolist() == [False, True, False, True]
    assert b[3].dtype == np.uint8 and b[3].shape == (4, 2, 2) and b[3][3, 1, 1] == 3
    assert b[4].dtype.kind == "U" and b[4].tolist() == ["s0", "s1", "s2", "s3"]
    assert b[5].dtype == np.int16
    assert b[6] == [{"k": 0}, {"k": 1}, {"k": 2}, {"k": 3}]  # unbatchable -> list


def test_batchdata_bools_mixed_with_other_values_are_not_cast_to_bool():
    # numpy casts anything to bool: 'xyz' and 2 became True; a mixed component is int32 (0.11's
    # rule for bools), which refuses what is no number, naming it
    assert BatchData.aggregate_batch([[True], [2]])[0].tolist() == [1, 2]
    assert BatchData.aggregate_batch([[True], [np.bool_(False)]])[0].dtype == np.bool_
    with pytest.raises(ValueError, match="component 0 as int32: datapoint 2 has a NoneType"):
        BatchData.aggregate_batch([[True], [2.5], [None]])
    with pytest.raises(ValueError, match="datapoint 1 has a str"):
        BatchData.aggregate_batch([[True], ["xyz"]])


def test_batchdata_numpy_bools_mixed_with_other_values_are_not_cast_to_bool():
    # a first numpy bool took numpy's cast of everything to bool: 13, 1.5 and 'zx' became True;
    # numbers now take numpy's common type, anything else is refused, naming the datapoint
    t, f = np.array([True]), np.array([False])
    assert BatchData.aggregate_batch([[t], [f], [[True]]])[0].dtype == np.bool_
    b = BatchData.aggregate_batch([[t], [np.array([13])]])[0]
    assert b.dtype == np.int64 and b.tolist() == [[1], [13]]
    b = BatchData.aggregate_batch([[t], [np.array([1.5], np.float32)]])[0]
    assert b.dtype == np.float32 and b.tolist() == [[1.0], [1.5]]
    b = BatchData.aggregate_batch([[np.bool_(True)], [2.5]])[0]
    assert b.dtype == np.float64 and b.tolist() == [1.0, 2.5]
    with pytest.raises(ValueError, match=r"datapoint 2 has a ndarray of dtype <U2, which is "
                                         r"neither boolean nor a number"):
        BatchData.aggregate_batch([[t], [f], [np.array(["zx"])]])
    with pytest.raises(ValueError, match="datapoint 1 has a NoneType, which"):
        BatchData.aggregate_batch([[np.bool_(True)], [None]])
    with pytest.raises(ValueError, match="not of one consistent shape"):
        BatchData.aggregate_batch([[t], [np.array([1, 2])]])


def test_batchdata_refuses_values_its_dtype_would_change():
    # the first value sets the dtype (tensorpack's rule), which stored 2.5 as 2, 300 in uint8
    # as 44 and 1e40 in float32 as inf, silently
    with pytest.raises(ValueError, match=r"component 0 as int32.*datapoint 2 has 2\.5, which "
                                         r"int32 would store as 2.*make the first one a float"):
        BatchData.aggregate_batch([[1], [2.0], [2.5]])
    with pytest.raises(ValueError, match=r"datapoint 1 has 300, which uint8 would store as 44."
                                         r".*the first is uint8, datapoint 1's int64"):
        BatchData.aggregate_batch([[np.array([1], np.uint8)], [np.array([300])]])
    with pytest.raises(ValueError, match=r"'x' as float32.*1e\+40, which float32 would store "
                                         r"as inf"):
        BatchData.aggregate_batch([{"x": np.float32(1)}, {"x": 1e40}])
    # values of one type too: Python floats into float32, Python ints into a numpy int's dtype
    with pytest.raises(ValueError, match=r"datapoint 1 has 1e\+40, which float32 would store "
                                         r"as inf"):
        BatchData.aggregate_batch([[1.0], [1e40]])
    with pytest.raises(ValueError, match=r"component 0 as uint8: datapoint 1 has 300\."):
        BatchData.aggregate_batch([[np.uint8(1)], [300]])
    with pytest.raises(ValueError, match=r"component 0 as int32: datapoint 2 has 1099511627776\."):
        BatchData.aggregate_batch([[np.int32(1)], [2], [2 ** 40]])
    # what the dtype stores as it is (or rounds, float64 into float32) still batches
    assert BatchData.aggregate_batch([[1], [2.0], [True]])[0].tolist() == [1, 2, 1]
    b = BatchData.aggregate_batch([[1.0], [float("inf")], [float("nan")]])[0]
    assert b.dtype == np.float32 and b[1] == np.inf and np.isnan(b[2])
    b = BatchData.aggregate_batch([[np.array([1.5], np.float32)], [np.array([1.1])],
                                   [np.array([np.nan])], [np.array([np.inf])]])[0]
    assert b.dtype == np.float32 and b[1, 0] == np.float32(1.1) and np.isnan(b[2, 0])
    assert BatchData.aggregate_batch([[np.array([1], np.uint8)], [np.array([200])]])[0].dtype \
        == np.uint8


def test_batchdata_refuses_what_is_no_string_in_a_string_component():
    # numpy stored None as 'None' and 5 as '5' (tensorpack too)
    with pytest.raises(ValueError, match=r"component 0 as strings.*datapoint 2 has None "
                                         r"\(NoneType\), which would be stored as 'None'"):
        BatchData.aggregate_batch([["a"], [b"b"], [None]])
    with pytest.raises(ValueError, match=r"datapoint 1 has 5 \(int\)"):
        BatchData.aggregate_batch([[np.str_("a")], [5]])
    b = BatchData.aggregate_batch([["ab"], [b"c"], [np.str_("d")]])[0]
    assert b.tolist() == ["ab", "c", "d"]
    assert BatchData.aggregate_batch([[np.array(["a"])], [["bc"]]])[0].tolist() == [["a"],
                                                                                     ["bc"]]


def test_batchdata_big_python_int_falls_back_to_int64():
    b = BatchData.aggregate_batch([[2 ** 40], [1]])
    assert b[0].dtype == np.int64 and b[0].tolist() == [2 ** 40, 1]
    # beyond int64: named (it was a bare OverflowError)
    with pytest.raises(ValueError, match=r"component 0 as int64: datapoint 1 has "
                                         r"1180591620717411303424\."):
        BatchData.aggregate_batch([[1], [2 ** 70]])


def test_batchdata_numpy_strings_are_not_cut_to_the_first_width():
    # tensorpack 0.11 gives [['a'], ['c']] (the first value's dtype, <U1)
    dps = [[np.array(["a"]), np.array([b"x"])], [np.array(["ccc"]), np.array([b"yyy"])]]
    (batch,) = list(BatchData(DataFromList(dps, shuffle=False), 2))
    assert batch[0].tolist() == [["a"], ["ccc"]]
    assert batch[1].tolist() == [[b"x"], [b"yyy"]]


def test_batchdata_dicts_and_use_list():
    src = [{"a": np.zeros(3, np.float64) + i, "b": i} for i in range(4)]
    df = BatchData(DataFromList(src, shuffle=False), 2)
    df.reset_state()
    out = lst(df)
    assert set(out[0]) == {"a", "b"}
    assert out[0]["a"].shape == (2, 3) and out[0]["a"].dtype == np.float64
    assert out[1]["b"].tolist() == [2, 3]
    ul = BatchData(DataFromList(src, shuffle=False), 2, use_list=True)
    ul.reset_state()
    out = lst(ul)
    assert isinstance(out[0]["a"], list) and out[0]["b"] == [0, 1]


def test_batchdata_tuple_datapoints_give_lists():
    out = BatchData.aggregate_batch([(1, 2.0), (3, 4.0)])
    assert isinstance(out, list) and out[0].tolist() == [1, 3]


def test_batchdata_shape_mismatch_message():
    src = [[np.zeros((2, 3)), 0], [np.zeros((2, 3)), 1], [np.zeros((4, 3)), 2]]
    df = BatchData(DataFromList(src, shuffle=False), 3)
    df.reset_state()
    with pytest.raises(ValueError) as ei:
        lst(df)
    msg = str(ei.value)
    assert "component 0" in msg
    assert "(2, 3)" in msg and "(4, 3)" in msg
    assert "datapoint 2" in msg


def test_batchdata_shape_mismatch_message_names_dict_key():
    with pytest.raises(ValueError, match="'img'.*\\(5,\\).*\\(6,\\)"):
        BatchData.aggregate_batch([{"img": np.zeros(5)}, {"img": np.zeros(6)}])


def test_batchdata_batch_larger_than_data():
    with pytest.raises(ValueError, match="batch_size=5"):
        BatchData(Counting(3), 5)
    df = BatchData(Counting(3), 5, remainder=True)
    df.reset_state()
    assert len(df) == 1 and lst(df)[0][0].tolist() == [0, 1, 2]
    # unknown length: no construction-time check
    BatchData(DataFromGenerator(lambda: iter([[1]])), 5)
    with pytest.raises(ValueError):
        BatchData(Counting(3), 0)


@pytest.mark.parametrize("make", [
    lambda ds: BatchData(ds, 1), lambda ds: MapData(ds, lambda dp: dp),
    lambda ds: FixedSizeData(ds, 1),
    lambda ds: dataflow.MultiThreadMapData(ds, 2, lambda dp: dp),
], ids=["BatchData", "MapData", "FixedSizeData", "MultiThreadMapData"])
def test_a_list_in_place_of_a_dataflow_is_a_type_error(make):
    # it was "AttributeError: 'list' object has no attribute 'reset_state'", later
    with pytest.raises(TypeError, match=r"expected a DataFlow \(with __iter__ and reset_state\), "
                                        r"got list: wrap a list in DataFromList"):
        make([[1], [2]])


@pytest.mark.parametrize("make, match", [
    (lambda: dataflow.ConcatData([Counting(2), "a"]), r"df_lists\[1\] must be a DataFlow"),
    (lambda: dataflow.JoinData(["a"]), r"df_lists\[0\] must be a DataFlow"),
    (lambda: dataflow.RandomMixData([Counting(2), 3]), r"df_lists\[1\] must be a DataFlow"),
    (lambda: dataflow.RandomChooseData([Counting(2), "x"]), r"df_lists\[1\] must be a DataFlow"),
    (lambda: dataflow.MapDataComponent(Counting(2), 5), "MapDataComponent: func must be callable"),
    (lambda: dataflow.SelectComponent(Counting(2), 0), "SelectComponent: idxs must be a list"),
    (lambda: DataFromGenerator(5), "DataFromGenerator: gen must be a callable"),
    (lambda: dataflow.DataFromQueue(None), r"DataFromQueue: queue must have a get\(\) method"),
    (lambda: dataflow.RandomChooseData(5), "RandomChooseData: df_lists must be a list of "
     "dataflows or of \\(dataflow, probability\\) pairs, got 5"),
], ids=["ConcatData", "JoinData", "RandomMixData", "RandomChooseData", "MapDataComponent",
        "SelectComponent", "DataFromGenerator", "DataFromQueue", "RandomChooseData-int"])
def test_arguments_of_the_wrong_kind_are_refused_when_built(make, match):
    # each failed only at reset_state() or the first datapoint, with a bare Python error
    # ("'str' object has no attribute 'reset_state'", "'int' object is not callable")
    with pytest.raises(TypeError, match=match):
        make()


def test_batch_size_none_is_named():
    with pytest.raises(ValueError, match="BatchData: batch_size must be a positive int, got None"):
        BatchData(Counting(3), None)
    assert BatchData(Counting(3), 2.0).batch_size == 2       # a whole float, as tensorpack


@pytest.mark.parametrize("make, match", [
    (lambda ds: dataflow.RepeatedData(ds, 2.5), "RepeatedData: num must be an int >= 0, or -1"),
    (lambda ds: FixedSizeData(ds, 2.9), "FixedSizeData: size must be an int >= 0, got 2.9"),
    (lambda ds: dataflow.RepeatedDataPoint(ds, 1.9), "RepeatedDataPoint: num must be a positive"),
    (lambda ds: dataflow.LocallyShuffleData(ds, 2.5), "buffer_size must be a positive int"),
    (lambda ds: dataflow.LocallyShuffleData(ds, 10, shuffle_interval=0),
     "shuffle_interval must be a positive int, got 0"),
    (lambda ds: dataflow.LocallyShuffleData(ds, 10, num_reuse="2"), "num_reuse must be a"),
    (lambda ds: dataflow.TestDataSpeed(ds, None), "TestDataSpeed: size must be a positive int"),
    # len() could not return it: an OverflowError at len()
    (lambda ds: FixedSizeData(ds, 10**20), "FixedSizeData: size must be at most"),
], ids=["RepeatedData", "FixedSizeData", "RepeatedDataPoint", "buffer_size",
        "shuffle_interval", "num_reuse", "TestDataSpeed", "FixedSizeData-huge"])
def test_counts_that_are_not_ints_are_refused(make, match):
    # 2.5 passes became 2 (and None a bare int() TypeError), an explicit interval of 0 became 1
    with pytest.raises(ValueError, match=match):
        make(DataFromList([[1], [2]]))


def test_whole_float_counts_are_taken_as_tensorpack_int_did():
    # tensorpack passed these through int(): FixedSizeData(ds, 3.0), TestDataSpeed(ds, 1e4)
    src = DataFromList([[1], [2]], shuffle=False)
    df = FixedSizeData(src, 3.0)
    df.reset_state()
    assert len(df) == 3 and list(iter(df)) == [[1], [2], [1]]
    df = RepeatedDataPoint(src, np.float64(2.0))
    df.reset_state()
    assert df.num == 2 and list(df) == [[1], [1], [2], [2]]
    speed = TestDataSpeed(src, 1e1, warmup=2.0)
    assert (speed.test_size, speed.warmup) == (10, 2) and type(speed.test_size) is int


def test_joindata_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="JoinData: df_lists must hold at least one dataflow"):
        dataflow.JoinData([])                  # it yielded [] forever


def test_batchdata_rejects_non_list_datapoint():
    with pytest.raises(ValueError, match="list, tuple or dict"):
        BatchData.aggregate_batch([1, 2])


@pytest.mark.parametrize("dps, match", [
    ([[1], [3, 4]], "datapoint 1 of the batch has 2 components, datapoint 0 has 1 component"),
    ([[1, 2], [3]], "datapoint 1 of the batch has 1 component, datapoint 0 has 2 components"),
    ([{"a": 1, "b": 2}, {"a": 1}], r"datapoint 1 of the batch has the keys \['a'\], "
                                   r"datapoint 0 has the keys \['a', 'b'\]"),
    ([{"a": 1}, {"a": 1, "b": 2}], r"has the keys \['a', 'b'\], datapoint 0 has the keys"),
    ([[1], {"a": 1}], r"has the keys \['a'\], datapoint 0 has 1 component"),
    ([[1], 7], "datapoint 1 of the batch has type int"),
])
def test_batchdata_datapoints_of_another_structure_are_named(dps, match):
    # tensorpack sizes the batch from the first datapoint: extra components vanished silently,
    # missing ones raised a bare IndexError or KeyError
    with pytest.raises(ValueError, match=match):
        list(BatchData(DataFromList(dps, shuffle=False), 2))


# ---------------------------------------------------------------- BatchDataByShape

def _shaped(sizes):
    return DataFromList([[np.zeros(s), i] for i, s in enumerate(sizes)], shuffle=False)


def test_batchdatabyshape_groups_by_shape():
    df = BatchDataByShape(_shaped([1, 2, 1, 2, 3, 1, 2]), 2, idx=0)
    df.reset_state()
    out = lst(df)
    assert [(b[0].shape, b[1].tolist()) for b in out] == [((2, 1), [0, 2]), ((2, 2), [1, 3])]
    # leftovers ([5] of shape 1, [6] of shape 2) are kept for the next pass
    out2 = lst(df)
    assert [b[1].tolist() for b in out2][:2] == [[5, 0], [6, 1]]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("wrap", [
    lambda d: dataflow.RepeatedData(d, -1),
    lambda d: FixedSizeData(d, 2),
    lambda d: dataflow.MultiThreadMapData(d, 2, lambda dp: dp),         # non-strict: endless
    lambda d: dataflow.MultiProcessRunnerZMQ(d, 1),
    lambda d: dataflow.MapData(dataflow.RepeatedData(d, -1), lambda dp: dp),
], ids=["RepeatedData", "FixedSizeData", "MultiThreadMapData", "MultiProcessRunnerZMQ",
        "MapData-RepeatedData"])
def test_batchdatabyshape_fills_batches_over_passes_when_repeated(wrap):
    # as tensorpack's HED pipeline does: no pass yields a batch, yet the buffers fill up; a
    # repeater took the empty passes for a dataflow that would never yield, and raised
    df = wrap(BatchDataByShape(_shaped([1, 2, 3]), 3, idx=0))
    df.reset_state()
    try:
        batch = next(iter(df))
    finally:
        df.close()
    # one of each shape per pass: the first batch of any shape (an unordered map may hand
    # over another shape's first) holds that shape's datapoint from three passes
    size = batch[0].shape[1]
    assert batch[0].shape == (3, size) and batch[1].tolist() == [size - 1] * 3
    nothing = dataflow.DataFromGenerator(lambda: iter(()))
    empty = dataflow.RepeatedData(BatchDataByShape(nothing, 3, idx=0), -1)
    empty.reset_state()
    with pytest.raises(ValueError, match="produced no datapoint"):
        next(iter(empty))


def test_batchdatabyshape_not_reentrant():
    df = BatchDataByShape(_shaped([1] * 8), 2, idx=0)
    df.reset_state()
    assert_not_reentrant(df)


# ---------------------------------------------------------------- FixedSizeData

def test_fixedsizedata_keep_state():
    df = FixedSizeData(Counting(5), 3, keep_state=True)
    df.reset_state()
    assert len(df) == 3
    assert [flat(lst(df)) for _ in range(3)] == [[0, 1, 2], [3, 4, 0], [1, 2, 3]]


def test_fixedsizedata_no_keep_state():
    df = FixedSizeData(Counting(5), 3, keep_state=False)
    df.reset_state()
    assert [flat(lst(df)) for _ in range(2)] == [[0, 1, 2], [0, 1, 2]]
    df6 = FixedSizeData(Counting(5), 6, keep_state=False)
    df6.reset_state()
    assert [flat(lst(df6)) for _ in range(2)] == [[0, 1, 2, 3, 4, 0]] * 2


def test_fixedsizedata_empty_source_and_reentrancy():
    df = FixedSizeData(Counting(0), 3)
    df.reset_state()
    with pytest.raises(ValueError, match="no datapoint"):
        lst(df)
    df = FixedSizeData(Counting(5), 4)
    df.reset_state()
    assert_not_reentrant(df)


# ---------------------------------------------------------------- RepeatedData / RepeatedDataPoint

def test_repeateddata_finite():
    df = RepeatedData(Counting(3), 2)
    df.reset_state()
    assert len(df) == 6
    assert flat(lst(df)) == [0, 1, 2, 0, 1, 2]


def test_repeateddata_infinite():
    df = RepeatedData(Counting(3), -1)
    df.reset_state()
    with pytest.raises(NotImplementedError, match="infinite"):
        len(df)
    assert flat(take(df, 8)) == [0, 1, 2, 0, 1, 2, 0, 1]


def test_repeateddata_infinite_empty_source_raises_instead_of_hanging():
    df = RepeatedData(Counting(0), -1)
    df.reset_state()
    with pytest.raises(ValueError, match="no datapoint"):
        next(iter(df))


def test_repeateddatapoint():
    df = RepeatedDataPoint(Counting(3), 2)
    df.reset_state()
    assert len(df) == 6
    assert flat(lst(df)) == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError):
        RepeatedDataPoint(Counting(3), 0)


# ---------------------------------------------------------------- RandomChooseData

def test_randomchoosedata_probabilities_and_stop():
    a, b = Counting(50, start=0), Counting(50, start=1000)
    df = RandomChooseData([(a, 1.0), (b, 0.0)])
    df.reset_state()
    assert a.resets == 1 and b.resets == 1
    assert flat(lst(df)) == list(range(50))


def test_randomchoosedata_mixes_and_stops_at_first_exhausted():
    a, b = Counting(30, start=0), Counting(30, start=1000)
    df = RandomChooseData([a, b])
    df.reset_state()
    out = flat(lst(df))
    from_a = [x for x in out if x < 1000]
    from_b = [x - 1000 for x in out if x >= 1000]
    assert from_a == list(range(len(from_a))) and from_b == list(range(len(from_b)))
    assert 30 in (len(from_a), len(from_b))  # stopped when one was exhausted
    assert from_a and from_b


def test_randomchoosedata_seeded_and_bad_probs():
    def run():
        df = RandomChooseData([[Counting(20), 0.3], [Counting(20, start=100), 0.7]])
        df.reset_state()
        return flat(lst(df))

    set_seed(5)
    r1 = run()
    set_seed(5)
    assert run() == r1
    with pytest.raises(ValueError, match="sum to 1"):
        RandomChooseData([(Counting(2), 0.5), (Counting(2), 0.6)])


@pytest.mark.parametrize("entries, match", [
    (lambda a, b: [(a, 0.5), b], "first entry is a pair; entry 1 is a bare Counting"),
    (lambda a, b: [a, (b, 0.5)], r"first entry is a dataflow; entry 1 is a tuple of 2 items "
     r"\(Counting, float\)"),
    (lambda a, b: [(a, 0.5), (b, 0.3, 1)], r"entry 1 is a tuple of 3 items"),
])
def test_randomchoosedata_refuses_mixed_entries_when_built(entries, match):
    # "too many values to unpack" when built, or "'tuple' object has no attribute
    # 'reset_state'" later, before
    with pytest.raises(ValueError, match="RandomChooseData: df_lists must hold only dataflows "
                       "or only .*" + match):
        RandomChooseData(entries(Counting(2), Counting(2)))


# ---------------------------------------------------------------- RandomMixData

def test_randommixdata():
    a, b = Counting(20, start=0), Counting(10, start=100)
    df = RandomMixData([a, b])
    df.reset_state()
    assert len(df) == 30
    out = flat(lst(df))
    assert sorted(out) == list(range(20)) + list(range(100, 110))
    assert [x for x in out if x < 100] == list(range(20))  # each source keeps its order
    assert out != list(range(20)) + list(range(100, 110))


def test_randommixdata_seeded():
    def run():
        df = RandomMixData([Counting(20), Counting(20, start=100)])
        df.reset_state()
        return flat(lst(df))

    set_seed(11)
    r1 = run()
    set_seed(11)
    assert run() == r1
    set_seed(12)
    assert run() != r1


# ---------------------------------------------------------------- ConcatData / JoinData

def test_concatdata():
    df = ConcatData([Counting(2), Counting(3, start=10)])
    df.reset_state()
    assert len(df) == 5
    assert flat(lst(df)) == [0, 1, 10, 11, 12]


def test_joindata_lists_and_dicts():
    df = JoinData([DataFromList([[1, 2], [3, 4]], shuffle=False),
                   DataFromList([(5,), (6,)], shuffle=False)])
    df.reset_state()
    assert len(df) == 2
    assert lst(df) == [[1, 2, 5], [3, 4, 6]]
    dd = JoinData([DataFromList([{"a": 1}], shuffle=False),
                   DataFromList([{"b": 2}], shuffle=False)])
    dd.reset_state()
    assert lst(dd) == [{"a": 1, "b": 2}]


def test_joindata_length_mismatch_warns_and_stops_at_shortest(caplog):
    with caplog.at_level(logging.WARNING, logger="dataflow"):
        df = JoinData([Counting(3), Counting(5, start=10)])
    assert "[3, 5]" in caplog.text
    df.reset_state()
    assert len(df) == 3
    assert lst(df) == [[0, 10], [1, 11], [2, 12]]


def test_joindata_mixed_types_and_reset_once():
    c = Counting(2)
    df = JoinData([c, DataFromList([{"a": 1}, {"a": 2}], shuffle=False)])
    df.reset_state()
    with pytest.raises(TypeError, match="all dicts"):
        lst(df)
    c2 = Counting(2)
    same = JoinData([c2, c2])
    same.reset_state()
    assert c2.resets == 1


# ---------------------------------------------------------------- SelectComponent

def test_selectcomponent():
    df = SelectComponent(DataFromList([[1, 2, 3], [4, 5, 6]], shuffle=False), [2, 0])
    df.reset_state()
    assert lst(df) == [[3, 1], [6, 4]]
    dd = SelectComponent(DataFromList([{"a": 1, "b": 2}], shuffle=False), ["b"])
    dd.reset_state()
    assert lst(dd) == [[2]]


# ---------------------------------------------------------------- LocallyShuffleData

def test_locallyshuffle_without_shuffle_is_a_delayed_fifo():
    df = LocallyShuffleData(Counting(10), buffer_size=4, shuffle_interval=10 ** 9)
    df.reset_state()
    assert len(df) == 10
    # never ends: two "epochs" and more come from one iterator
    assert flat(take(df, 25)) == [i % 10 for i in range(25)]
    # the buffer and position persist: a new iteration continues the stream
    assert flat(take(df, 5)) == [5, 6, 7, 8, 9]
    df.reset_state()
    assert flat(take(df, 3)) == [0, 1, 2]


def test_locallyshuffle_over_an_empty_input_names_itself():
    # the error named RepeatedData(num=-1), which the user never built
    df = LocallyShuffleData(DataFromList([], shuffle=False), 3)
    df.reset_state()
    with pytest.raises(ValueError, match="LocallyShuffleData: a pass of DataFromList produced "
                                         "no datapoint"):
        next(iter(df))


def test_locallyshuffle_num_reuse():
    df = LocallyShuffleData(Counting(5), buffer_size=3, num_reuse=2, shuffle_interval=10 ** 9)
    df.reset_state()
    assert len(df) == 10
    assert flat(take(df, 8)) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_locallyshuffle_shuffles_locally():
    n, buf = 60, 10
    df = LocallyShuffleData(Counting(n), buffer_size=buf)
    df.reset_state()
    out = flat(take(df, 3 * n))
    assert out[:n] != list(range(n))
    counts = Counter(out)
    assert set(counts) == set(range(n))
    assert all(2 <= c <= 4 for c in counts.values())


def test_locallyshuffle_seeded_and_not_reentrant():
    def run():
        df = LocallyShuffleData(Counting(30), buffer_size=9)
        df.reset_state()
        return flat(take(df, 40))

    set_seed(3)
    r1 = run()
    set_seed(3)
    assert run() == r1
    set_seed(None)
    assert run() != run()
    df = LocallyShuffleData(Counting(30), buffer_size=2)
    df.reset_state()
    assert_not_reentrant(df)


# ---------------------------------------------------------------- CacheData

def test_cachedata_reads_source_once():
    src = Counting(5)
    df = CacheData(src)
    df.reset_state()
    assert flat(lst(df)) == [0, 1, 2, 3, 4]
    assert flat(lst(df)) == [0, 1, 2, 3, 4]
    assert src.passes == 1
    df.reset_state()  # clears the cache
    lst(df)
    assert src.passes == 2


def test_cachedata_partial_first_pass_is_not_cached():
    src = Counting(5)
    df = CacheData(src)
    df.reset_state()
    assert flat(take(df, 2)) == [0, 1]
    assert flat(lst(df)) == [0, 1, 2, 3, 4]
    assert src.passes == 2


def test_cachedata_shuffle_permutation_and_seed():
    def run():
        df = CacheData(Counting(30), shuffle=True)
        df.reset_state()
        return [flat(lst(df)) for _ in range(3)]

    set_seed(9)
    p = run()
    assert p[0] == list(range(30))  # first pass: source order
    assert sorted(p[1]) == list(range(30)) and p[1] != p[0] and p[2] != p[1]
    set_seed(9)
    assert run() == p


def test_cachedata_not_reentrant_while_filling():
    df = CacheData(Counting(5))
    df.reset_state()
    assert_not_reentrant(df)


@pytest.mark.parametrize("shuffle", [False, True])
def test_cachedata_not_reentrant_when_reading_the_cache(shuffle):
    # as tensorpack's guard: every pass, not only the one that fills the cache
    df = CacheData(Counting(5), shuffle=shuffle)
    df.reset_state()
    assert len(lst(df)) == 5
    assert_not_reentrant(df)
    assert sorted(x[0] for x in lst(df)) == list(range(5))


# ---------------------------------------------------------------- PrintData

def test_printdata_prints_structure_and_passes_through(capsys, caplog):
    src = [[np.arange(6, dtype=np.int16).reshape(2, 3), 1.5, [1, 2, 3, 4, 5]], [None, 0, []]]
    df = PrintData(DataFromList(src, shuffle=False), num=1, name="mine", max_list=2)
    with caplog.at_level(logging.INFO, logger="dataflow"):
        df.reset_state()
        out = lst(df)
    assert len(out) == 2 and all(o is s for o, s in zip(out, src))
    printed = capsys.readouterr().out
    assert "datapoint 0/1 with 3 components" in printed
    assert "int16" in printed and "(2, 3)" in printed and "[0, 5]" in printed
    assert "with value 1.5" in printed
    assert "list of len 5" in printed and "..." in printed
    assert "datapoint 1/1" not in printed  # only num datapoints
    assert "mine" in caplog.text
    lst(df)
    assert capsys.readouterr().out == ""  # as tensorpack: once per reset_state
    df.reset_state()
    lst(df)
    assert "datapoint 0/1" in capsys.readouterr().out


def test_printdata_dict_datapoint(capsys):
    df = PrintData(DataFromList([{"img": np.zeros((4, 4), np.float32)}], shuffle=False))
    df.reset_state()
    lst(df)
    printed = capsys.readouterr().out
    assert "img: ndarray:float32 of shape (4, 4)" in printed


# ---------------------------------------------------------------- TestDataSpeed

def test_testdataspeed_with_tqdm_loops_source(capsys):
    src = Counting(7)
    speed = TestDataSpeed(src, size=20, warmup=3).start()
    assert isinstance(speed, float) and speed > 0
    assert src.resets == 1
    assert src.passes == 4  # 23 datapoints from a source of 7
    assert "datapoints/s" in capsys.readouterr().out


def test_testdataspeed_progress_bar_leaves_no_thread_behind(capsys, monkeypatch):
    # tqdm's monitor thread, started by its first bar, would live until exit, and with a
    # second thread running, process dataflows no longer fork their workers by default
    import tqdm
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 10)     # tqdm's default (see conftest)
    before = {t.ident for t in threading.enumerate()}
    TestDataSpeed(Counting(7), size=20).start()
    assert {t.name for t in threading.enumerate() if t.ident not in before} == set()
    assert "datapoints/s" in capsys.readouterr().out


def test_testdataspeed_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # makes ``import tqdm`` fail
    t = TestDataSpeed(Counting(10), size=30)
    monkeypatch.setattr(t, "print_interval", 0.0)
    speed = t.start_test()
    assert isinstance(speed, float) and speed > 0
    out = capsys.readouterr().out
    assert "30/30 datapoints" in out and "datapoints/s" in out


def test_testdataspeed_iter_runs_test_then_yields_data(capsys):
    df = TestDataSpeed(Counting(4), size=2)
    df.reset_state()
    assert flat(lst(df)) == [0, 1, 2, 3]
    assert "datapoints/s" in capsys.readouterr().out


def test_exported_from_package():
    for name in ["MapData", "MapDataComponent", "BatchData", "BatchDataByShape", "FixedSizeData",
                 "RepeatedData", "RepeatedDataPoint", "RandomChooseData", "RandomMixData",
                 "ConcatData", "JoinData", "SelectComponent", "LocallyShuffleData", "CacheData",
                 "PrintData", "TestDataSpeed"]:
        assert getattr(dataflow, name).__module__ == "dataflow.common"


# -- copies keep inline attributes -----------------------------------------------------------------
class _NoDictRead(DataFlow):
    """A dataflow whose ``__dict__`` must not be read. pickle's default restore (and
    ``copy.copy``'s) writes the attributes into ``__dict__``, which turns the copy's inline
    attribute values into a real dict (CPython 3.11/3.12), after which every ``self.x`` of its
    loops takes the slow lookup."""

    def __init__(self, n):
        self.n = n
        self.label = "inline"

    @property
    def __dict__(self):
        raise AssertionError("the copy's __dict__ was read")

    def __iter__(self):
        for i in range(self.n):
            yield [i, self.label]

    def __len__(self):
        return self.n


def test_copies_restore_attributes_without_reading_the_instance_dict():
    import copy
    import pickle
    df = _NoDictRead(3)
    for dup, batches in ((pickle.loads(pickle.dumps(df)), 3), (copy.copy(df), 3),
                         (copy.deepcopy(df), 3),
                         (pickle.loads(pickle.dumps(BatchData(df, 2, remainder=True))), 2)):
        dup.reset_state()
        assert len(list(dup)) == batches
    copied = pickle.loads(pickle.dumps(df))
    assert (copied.n, copied.label) == (3, "inline")
    assert list(copied) == [[0, "inline"], [1, "inline"], [2, "inline"]]


def test_serial_mapdata_names_the_datapoint_of_an_error_as_the_parallel_maps_do():
    def f(dp):
        if dp[0] == 3:
            raise ValueError("bad value")
        return dp

    df = MapData(DataFromList([[k] for k in range(5)], shuffle=False), f)
    df.reset_state()
    with pytest.raises(ValueError, match="bad value") as info:
        list(df)
    assert info.value.__notes__ == ["(raised in map function " + f.__qualname__ +
                                    " on datapoint #3)"]
