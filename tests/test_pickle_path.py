"""Any picklable datapoint crosses processes: msgpack for what the codec handles, pickle (protocol
5, cloudpickle where pickle cannot) per object for the rest, its arrays out of band (shared memory
for results), structured dtypes natively; pickle only where the caller allows it."""
import dataclasses
import datetime
import fractions
import os
import pickle
import subprocess
import sys
import textwrap

import msgpack
import numpy as np
import pytest

import dataflow as D
from dataflow import serialize
from dataflow.parallel import transport

pytestmark = [pytest.mark.timeout(60)]

BIG = 1 << 15                    # elements: 128 KiB of int32, out of band


@dataclasses.dataclass
class Point:                     # importable: plain pickle, by reference
    x: int
    data: np.ndarray


def _make_values():
    """values(i): one datapoint with every kind of value the msgpack codec does not carry."""
    class Plain:                 # local: only cloudpickle can carry it (by value)
        def __init__(self, i):
            self.i = i

        def __eq__(self, other):
            return type(other).__name__ == "Plain" and other.i == self.i

    def values(i):
        structured = np.zeros(3, [("a", "<i4"), ("b", [("c", "<f8", (2,))]), ("d", "S3")])
        structured["a"] = i
        big_structured = np.zeros(BIG // 4, "i4,f8")
        big_structured["f0"] = i
        return [i, {i, "s"}, frozenset([i]), fractions.Fraction(i, 7), datetime.date(2020, 1, 1 + i % 28),
                Plain(i), Point(i, np.full(BIG, i, np.int32)), structured, big_structured,
                np.array([None, i, "x"], dtype=object), np.ma.masked_array([i, 2], mask=[0, 1]),
                [np.full(BIG, i, np.int32), {"meta": {i}}]]
    return values


values = _make_values()


def assert_values(got, i):
    want = values(i)
    assert got[0] == i
    assert got[1] == want[1] and type(got[1]) is set
    assert got[2] == want[2] and type(got[2]) is frozenset
    assert got[3] == want[3] and type(got[3]) is fractions.Fraction
    assert got[4] == want[4]
    assert got[5] == want[5]
    assert type(got[6]) is Point and got[6].x == i and np.array_equal(got[6].data, want[6].data)
    for k in (7, 8):
        assert got[k].dtype == want[k].dtype and got[k].tobytes() == want[k].tobytes()
    assert got[9].dtype == object and list(got[9]) == list(want[9])
    assert isinstance(got[10], np.ma.MaskedArray) and (got[10].mask == want[10].mask).all()
    assert np.array_equal(got[11][0], want[11][0]) and got[11][1] == {"meta": {i}}


def _memfd_ranges():
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            if "memfd:dataflow" in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                out.append((lo, hi))
    return out


def in_shared_memory(a):
    address = a.__array_interface__["data"][0]
    return any(lo <= address < hi for lo, hi in _memfd_ranges())


# -- the codec ----------------------------------------------------------------------------------
def test_pickle_only_where_allowed():
    with pytest.raises(TypeError, match="cannot serialize object of type 'set' at \\[1\\]"):
        serialize.dumps_oob([1, {2}], [])
    header = serialize.dumps_oob([1, {2}], [], allow_pickle=True)
    assert serialize.loads_oob(header, [], allow_pickle=True) == [1, {2}]
    with pytest.raises(ValueError, match="allow_pickle"):
        serialize.loads_oob(header, [])
    msg = serialize.dumps([1, {2}], allow_pickle=True)
    assert serialize.loads(msg, allow_pickle=True) == [1, {2}]
    with pytest.raises(ValueError, match="allow_pickle"):
        serialize.loads(msg)


def test_decided_per_object_the_array_beside_a_set_stays_out_of_band():
    big = np.arange(BIG, dtype=np.int32)
    s = set(range(20))
    buffers = []
    header = serialize.dumps_oob([big, {"meta": s}], buffers, allow_pickle=True)
    assert len(buffers) == 1 and np.shares_memory(buffers[0], big)    # zero-copy, not pickled
    # the header carries the set's own pickle and little more: nothing else was pickled
    assert len(header) < len(pickle.dumps(s, protocol=5)) + 64
    got = serialize.loads_oob(header, buffers, allow_pickle=True)
    assert np.array_equal(got[0], big) and got[1] == {"meta": s}


def test_arrays_inside_pickled_objects_are_out_of_band_buffers():
    p = Point(3, np.arange(BIG, dtype=np.int32))
    buffers = []
    header = serialize.dumps_oob([p], buffers, allow_pickle=True)
    assert len(buffers) == 1 and np.shares_memory(buffers[0], p.data)
    assert len(header) < 1024
    got = serialize.loads_oob(header, [bytearray(b) for b in buffers], allow_pickle=True)[0]
    assert got.x == 3 and np.array_equal(got.data, p.data) and got.data.flags.writeable
    msg = serialize.dumps([p, np.arange(10)], allow_pickle=True)       # one-message form too
    got = serialize.loads(msg, allow_pickle=True)
    assert np.array_equal(got[0].data, p.data) and np.array_equal(got[1], np.arange(10))


@pytest.mark.parametrize("dtype", [
    [("a", "<i4"), ("b", ">f8")],
    np.dtype([("a", "u1"), ("b", "<i8")], align=True),                 # padding
    [("a", "<i4"), ("b", [("c", "<f8", (2, 3)), ("d", "S5")])],         # nested, subarray
    {"names": ["x", "y"], "formats": ["<i2", "<i2"], "offsets": [0, 4], "itemsize": 8},
])
@pytest.mark.parametrize("n", [4, BIG])
def test_structured_dtypes_travel_natively(dtype, n):
    a = np.zeros(n, dtype)
    a.view(np.uint8)[:] = np.arange(a.nbytes, dtype=np.uint8)
    buffers = []
    header = serialize.dumps_oob({"a": a}, buffers)        # no pickle needed
    got = serialize.loads_oob(header, buffers)["a"]
    assert got.dtype == a.dtype and got.tobytes() == a.tobytes()
    if n == BIG:
        assert len(buffers) == 1 and np.shares_memory(buffers[0], a)
    got = serialize.loads(serialize.dumps(a))
    assert got.dtype == a.dtype and got.tobytes() == a.tobytes()


def test_a_crafted_structured_dtype_with_objects_is_refused():
    record = msgpack.packb([[["a", "|O"]], [1], False, bytes(8)])
    with pytest.raises(ValueError):
        serialize.loads_oob(msgpack.packb(msgpack.ExtType(5, record)), [])


def test_every_value_round_trips_through_the_codec():
    buffers = []
    header = serialize.dumps_oob(values(5), buffers, allow_pickle=True)
    assert_values(serialize.loads_oob(header, buffers, allow_pickle=True), 5)


def test_a_message_pickles_its_objects_once():
    """With ``to_pickle`` the headers only mark where each object goes; one pickle carries them
    all, its large buffers out of band, and headers decoded in order get them back."""
    objects, buffers = [], []
    dps = [[i, {"tags": {i, "s"}}, Point(i, np.full(BIG, i, np.int32)), (i, fractions.Fraction(i, 3))]
           for i in range(5)]
    headers = [serialize.dumps_oob(dp, buffers, allow_pickle=True, to_pickle=objects)
               for dp in dps]
    assert len(objects) == 15 and objects[0] is dps[0][1]["tags"] and buffers == []
    assert all(len(h) < 32 for h in headers)                # no pickle in the headers
    pickled = serialize.pickle_objects(objects, buffers)
    assert len(buffers) == 5 and np.shares_memory(buffers[0], dps[0][2].data)
    load = serialize.loader_oob(buffers, allow_pickle=True, pickled=pickled)
    for dp, header in zip(dps, headers):
        got = load(header)
        assert got[:2] == dp[:2] and got[3] == dp[3] and type(got[3]) is tuple
        assert got[2].x == dp[2].x and np.array_equal(got[2].data, dp[2].data)
    with pytest.raises(ValueError, match="does not carry that many"):
        load(headers[0])                                    # all five taken already
    with pytest.raises(ValueError, match="does not carry that many"):
        serialize.loads_oob(headers[0], buffers, allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle"):
        serialize.loader_oob(buffers, pickled=pickled)
    with pytest.raises(ValueError, match="malformed"):
        serialize.loader_oob(buffers, allow_pickle=True, pickled=[b"not a pickle", []])
    with pytest.raises(ValueError, match="allow_pickle"):
        serialize.dumps_oob([{1}], [], to_pickle=[])


def test_objects_that_do_not_pickle_together_leave_nothing_behind():
    objects, buffers = [], []
    serialize.dumps_oob([{1}, Point(0, np.zeros(BIG, np.int32)), (x for x in [])], buffers,
                        allow_pickle=True, to_pickle=objects)
    assert len(objects) == 3
    with pytest.raises(TypeError, match="do not pickle.*generator"):
        serialize.pickle_objects(objects, buffers)
    assert buffers == []
    # a datapoint that fails to encode takes its objects back out of the list
    class BadArray(np.ndarray):
        def view(self, *args, **kwargs):
            raise RuntimeError("no items")
    bad = np.zeros(2).view(BadArray)
    objects = [7]
    with pytest.raises(RuntimeError, match="no items"):
        serialize.dumps_oob([{2}, bad], buffers, allow_pickle=True, to_pickle=objects)
    assert objects == [7] and buffers == []


def test_a_task_message_carries_one_pickle():
    items = [(i, 10 + i, [i, {i}, fractions.Fraction(1, i + 1)]) for i in range(4)]
    frames = transport.encode_task(0, items, [])
    msg = msgpack.unpackb(frames[0], raw=False)
    assert msg[0] == transport.TASK and len(msg[4]) == 2 and len(msg[4][0]) > 0
    kind, _, run, got = transport.decode_task(frames)
    assert kind == transport.TASK and got == [list(it) for it in items]


def test_unpicklable_value_names_itself_and_the_datapoint():
    with pytest.raises(TypeError, match="cannot serialize object of type 'generator' at \\[1\\]"):
        transport.encode_task(0, [(0, 7, [1, (x for x in [])])], [])
    with pytest.raises(TypeError, match="datapoint #7"):
        transport.encode_task(0, [(0, 7, [1, (x for x in [])])], [])


# -- through processes --------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def zmq_send_helper_thread():
    """Large source arrays go to workers without a copy, for which pyzmq starts, once per
    process, a thread that frees them once sent: start it up front, so it is not a leak."""
    from zmq.utils.garbage import gc as zmq_gc
    with D.MultiProcessMapData(D.DataFromList([[np.zeros(1 << 17, np.uint8)]]), 1,
                               _identity_by_value(), strict=True) as df:
        df.reset_state()
        assert [dp[0].size for dp in df] == [1 << 17]
    assert zmq_gc.is_alive()


def _identity_by_value():
    def f(dp):
        return dp
    return f


def _as_result():
    vals = _make_values()

    def f(dp):
        return vals(dp[0])
    return f


def _identity(dp):
    return dp


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("start_method", ["fork", "spawn", "forkserver"])
def test_every_type_as_result_and_as_source_datapoint(start_method):
    n = 6
    with D.MultiProcessMapData(D.DataFromList([[i] for i in range(n)], shuffle=False), 2,
                               _as_result(), strict=True, ordered=True,
                               start_method=start_method) as df:
        df.reset_state()
        out = list(df)
        for i, got in enumerate(out):
            assert_values(got, i)
        # zero-copy: the plain array beside the set, and the array inside the dataclass
        assert in_shared_memory(out[0][11][0]) and in_shared_memory(out[0][6].data)
        del out, got
    with D.MultiProcessMapData(D.DataFromList([values(i) for i in range(n)], shuffle=False), 2,
                               _identity, strict=True, ordered=True,
                               start_method=start_method) as df:
        df.reset_state()
        for i, got in enumerate(df):
            assert_values(got, i)
        del got


@pytest.mark.usefixtures("no_leaks")
def test_every_type_through_the_runner_and_map_and_batch():
    class Source(D.DataFlow):
        def __iter__(self):
            for i in range(4):
                yield values(i)

        def __len__(self):
            return 4

    with D.MultiProcessRunnerZMQ(Source(), num_proc=2, hwm=4, start_method="spawn") as df:
        df.reset_state()
        got = list(df) + list(df)          # two passes of len(ds) datapoints
    assert len(got) == 8
    for dp in got:
        assert_values(dp, dp[0])
    del got, dp

    def pair(dp):
        return [dp[0], {dp[0]}, fractions.Fraction(dp[0], 2)]
    with D.MultiProcessMapAndBatchData(D.DataFromList([[i] for i in range(8)], shuffle=False),
                                       2, pair, 4, start_method="forkserver") as df:
        df.reset_state()
        batches = [b for _, b in zip(range(2), df)]
    for b in batches:
        assert [{i} for i in b[0]] == b[1]
        assert b[2] == [fractions.Fraction(int(i), 2) for i in b[0]]


def test_a_class_of_the_main_script_crosses_spawned_workers(tmp_path):
    script = tmp_path / "main_class.py"
    script.write_text(textwrap.dedent("""
        import dataflow as D

        class Record:
            def __init__(self, i):
                self.i = i

        def f(dp):
            return [Record(dp[0].i * 2), {dp[0].i}]

        src = D.DataFromList([[Record(i)] for i in range(5)], shuffle=False)
        with D.MultiProcessMapData(src, 2, f, strict=True, ordered=True,
                                   start_method="spawn") as df:
            df.reset_state()
            out = list(df)
        assert all(type(r) is Record for r, _ in out), [type(r) for r, _ in out]
        print([r.i for r, _ in out], [s for _, s in out])
    """))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=50, cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[0, 2, 4, 6, 8] [{0}, {1}, {2}, {3}, {4}]"


class LoadsNowhere:
    """Pickles in the worker; loading it fails (as a class the consumer cannot import does)."""

    def __reduce__(self):
        return (int, ("not a number",))


def returns_unloadable(dp):
    return [dp[0], LoadsNowhere()] if dp[0] == 5 else [dp[0]]


@pytest.mark.timeout(30)
def test_a_result_the_consumer_cannot_load_raises_instead_of_hanging(no_leaks):
    with D.MultiProcessMapData(D.DataFromList([[k] for k in range(12)], shuffle=False), 2,
                               returns_unloadable, strict=True, ordered=True,
                               on_error="skip") as df:
        df.reset_state()
        with pytest.raises(TypeError, match=r"could not be loaded in the consuming process: "
                                            r"ValueError.*not a number"):
            list(df)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_source_datapoint_the_worker_cannot_load_raises_instead_of_hanging(no_leaks,
                                                                            on_error):
    # the worker dropped the whole task as malformed, and the consumer waited for it forever
    src = [[k] for k in range(12)]
    src[5] = [LoadsNowhere()]
    with D.MultiProcessMapData(D.DataFromList(src, shuffle=False), 2, lambda dp: dp,
                               strict=True, on_error=on_error) as df:
        df.reset_state()
        with pytest.raises(ValueError, match="not a number") as info:
            list(df)
    assert any("loading datapoint #5 of the source" in n for n in info.value.__notes__)


Pair = __import__("collections").namedtuple("Pair", "image label")


class Colour(__import__("enum").IntEnum):
    RED = 1


def _subclassed(dp):
    import collections
    return [Pair(np.full(3, dp[0]), dp[0]), collections.OrderedDict(k=dp[0]),
            collections.defaultdict(list, v=[dp[0]]), Colour.RED]


@pytest.mark.timeout(60)
def test_subclasses_of_lists_tuples_dicts_and_ints_come_back_as_themselves(no_leaks):
    # between a consumer and its own workers they are pickled (by reference), so a namedtuple
    # datapoint keeps its fields, as serial MapData's; the formats (no pickle) keep base types
    expected = list(D.MapData(D.DataFromList([[k] for k in range(6)], shuffle=False),
                              _subclassed))
    with D.MultiProcessMapData(D.DataFromList([[k] for k in range(6)], shuffle=False), 2,
                               _subclassed, strict=True, ordered=True) as df:
        df.reset_state()
        got = list(df)
    for g, e in zip(got, expected):
        assert [type(x) for x in g] == [type(x) for x in e]
        assert g[0].label == e[0].label and (g[0].image == e[0].image).all()
        assert g[1:] == e[1:]
    plain = serialize.loads(serialize.dumps(expected[0]))
    assert [type(x) for x in plain] == [tuple, dict, dict, int]


def too_deep(dp):
    if dp[0] == 3:
        nested = []
        for _ in range(100000):
            nested = [nested]
        return nested
    return dp


@pytest.mark.timeout(60)
def test_a_result_too_deep_to_send_is_a_type_error_naming_it(no_leaks):
    with D.MultiProcessMapData(D.DataFromList([[k] for k in range(8)], shuffle=False), 2,
                               too_deep, strict=True, ordered=True) as df:
        df.reset_state()
        with pytest.raises(TypeError, match=r"too_deep returned datapoint #3 that cannot be "
                                            r"sent.*recursion"):
            list(df)
