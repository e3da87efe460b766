"""Tests for dataflow.serialize: exact round trips, errors, zero-copy and the out-of-band API."""
import collections
import datetime
import enum
import math
import mmap
import struct
import threading
import tracemalloc
import weakref

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import dataflow
from dataflow import serialize
from dataflow.serialize import DEFAULT_OOB_THRESHOLD, dumps, dumps_oob, loads, loads_oob


class Sub(np.ndarray):
    """An ndarray subclass, so that a buffer can be tracked with a weakref."""


def roundtrip(obj):
    return loads(dumps(obj))


def roundtrip_oob(obj, threshold=DEFAULT_OOB_THRESHOLD):
    buffers = []
    return loads_oob(dumps_oob(obj, buffers, threshold), buffers)


def assert_array_same(out, a):
    assert type(out) is np.ndarray
    assert out.dtype.str == a.dtype.str
    assert out.shape == a.shape
    assert out.tobytes() == a.tobytes()         # bit-exact, NaN payloads included
    if a.flags.f_contiguous and not a.flags.c_contiguous:
        assert out.flags.f_contiguous
    else:
        assert out.flags.c_contiguous


def assert_same(out, obj):
    """Equal value *and* equal type, recursively."""
    assert type(out) is type(obj), (out, obj)
    if isinstance(obj, np.ndarray):
        assert_array_same(out, obj)
    elif isinstance(obj, (list, tuple)):
        assert len(out) == len(obj)
        for x, y in zip(out, obj):
            assert_same(x, y)
    elif isinstance(obj, dict):
        assert list(out) == list(obj)
        for key in obj:
            assert_same(out[key], obj[key])
    elif isinstance(obj, (float, complex)):               # bit-exact: NaN and -0.0 included
        assert struct.pack("<2d", obj.real, obj.imag) == struct.pack("<2d", out.real, out.imag)
    elif isinstance(obj, np.generic):
        assert out.dtype == obj.dtype
        assert out.tobytes() == obj.tobytes() or out == obj
    else:
        assert out == obj


# ---------------------------------------------------------------- Python values

PLAIN_VALUES = [
    None, True, False, 0, 1, -1, 2**63 - 1, -2**63, 2**64 - 1, 2**64, -2**63 - 1,
    2**200, -2**200 + 7, 1.5, -0.0, float("inf"), float("nan"), 1e-310, 1 + 2j, -0.0j,
    "", "text", "üñíçødé \x00 ☃", b"", b"\x00\xffbytes", [], (), {}, [1, [2, [3]]],
    (1, (2, (3,))), [(), ((),)], {"a": 1, "b": [1, 2]}, {1: "x", None: 2, 1.5: 3, b"k": 4,
    (1, "t"): 5, True: 6, -2**100: 7}, ({"t": (1, [2.0, (None,)])},),
]


@pytest.mark.parametrize("obj", PLAIN_VALUES, ids=repr)
def test_plain_values_round_trip_with_type(obj):
    assert_same(roundtrip(obj), obj)
    assert_same(roundtrip_oob(obj), obj)


@given(st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary()
    | st.complex_numbers(),
    lambda children: st.lists(children, max_size=4) | st.tuples(children, children)
    | st.dictionaries(st.integers() | st.text(max_size=3) | st.tuples(st.integers()),
                      children, max_size=4),
    max_leaves=20))
@settings(deadline=None, max_examples=100)
def test_nested_python_values_round_trip(obj):
    assert_same(roundtrip(obj), obj)


def test_bytes_and_str_stay_distinct():
    out = roundtrip(["ab", b"ab", ("ab", b"ab")])
    assert [type(x) for x in out[:2]] == [str, bytes]
    assert [type(x) for x in out[2]] == [str, bytes]


def test_subclasses_become_their_base_type():
    class Color(enum.IntEnum):
        RED = 3

    class Name(str, enum.Enum):
        ALICE = "alice"

    class MyFloat(float):
        pass

    class MyList(list):
        pass

    Point = collections.namedtuple("Point", "x y")
    obj = [Color.RED, Name.ALICE, MyFloat(2.5), MyList([1]), Point(1, 2),
           collections.OrderedDict(b=1, a=2), collections.defaultdict(int, {"k": 1}),
           bytearray(b"xy"), memoryview(b"mv")]
    out = roundtrip(obj)
    assert_same(out, [3, "alice", 2.5, [1], (1, 2), {"b": 1, "a": 2}, {"k": 1}, b"xy", b"mv"])
    assert list(out[5]) == ["b", "a"]       # order kept


def test_int_subclass_beyond_64_bits():
    class Big(int):
        pass

    assert_same(roundtrip([Big(2**70), Big(-2**70), Big(5)]), [2**70, -2**70, 5])


def test_bool_is_not_an_int():
    out = roundtrip([True, 1, False, 0])
    assert [type(x) for x in out] == [bool, int, bool, int]


@given(st.integers(min_value=-2**300, max_value=2**300))
@settings(deadline=None, max_examples=100)
def test_ints_of_any_size(n):
    assert_same(roundtrip(n), n)
    assert_same(roundtrip_oob((n,)), (n,))


# ---------------------------------------------------------------- numpy scalars

SCALARS = [
    np.bool_(True), np.int8(-3), np.int16(-300), np.int32(7), np.int64(-2**62),
    np.uint8(255), np.uint16(65535), np.uint32(2**32 - 1), np.uint64(2**64 - 1),
    np.float16(1.5), np.float32(-2.25), np.float64(np.pi), np.longdouble(1) / 3,
    np.complex64(1 - 2j), np.complex128(3 + 4j), np.datetime64("2024-02-29T12:00", "ns"),
    np.datetime64("NaT", "ns"), np.timedelta64(5, "ms"), np.bytes_(b"ab"), np.bytes_(b""),
    np.str_("ü"), np.str_(""), np.void(b"\x01\x02"),
]


@pytest.mark.parametrize("x", SCALARS, ids=lambda x: f"{type(x).__name__}({x!r})")
def test_numpy_scalars_keep_their_type(x):
    for out in (roundtrip(x), roundtrip_oob([x])[0], roundtrip((x,))[0]):
        assert type(out) is type(x)
        assert out.dtype == x.dtype
        if isinstance(x, (np.datetime64, np.timedelta64)) and np.isnat(x):
            assert np.isnat(out)
        else:
            assert out == x


# ---------------------------------------------------------------- numpy arrays

DTYPES = (hnp.boolean_dtypes() | hnp.integer_dtypes(endianness="?")
          | hnp.unsigned_integer_dtypes(endianness="?") | hnp.floating_dtypes(endianness="?")
          | hnp.complex_number_dtypes(endianness="?") | hnp.datetime64_dtypes(endianness="?")
          | hnp.timedelta64_dtypes(endianness="?") | hnp.byte_string_dtypes(max_len=6)
          | hnp.unicode_string_dtypes(endianness="?", max_len=4)
          | st.just(np.dtype(np.longdouble)) | st.just(np.dtype(np.clongdouble)))


@st.composite
def arrays(draw):
    """Arrays of every supported dtype, any shape (zeros included), strided, transposed or F."""
    a = draw(hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0,
                                                 max_side=5)))
    if a.ndim:
        a = a[tuple(draw(st.slices(n)) for n in a.shape)]
        a = a.transpose(draw(st.permutations(range(a.ndim))))
    layout = draw(st.sampled_from(["as is", "F", "C"]))
    if layout == "F":
        a = np.asfortranarray(a)
    elif layout == "C":
        a = np.ascontiguousarray(a)
    return a


@given(arrays())
@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
def test_arrays_round_trip(a):
    assert_array_same(roundtrip(a), a)
    assert_array_same(roundtrip([a, (a,)])[1][0], a)


@given(arrays(), st.sampled_from([0, 1, 17, DEFAULT_OOB_THRESHOLD, 2**62]))
@settings(deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])
def test_arrays_round_trip_out_of_band(a, threshold):
    buffers = []
    header = dumps_oob({"a": a}, buffers, threshold)
    assert len(buffers) == (1 if a.nbytes >= threshold else 0)
    for b in buffers:
        assert isinstance(b, np.ndarray) and b.dtype == np.uint8 and b.ndim == 1
        assert b.nbytes == a.nbytes and b.flags.c_contiguous
        assert np.shares_memory(b, a) == bool(
            a.nbytes and (a.flags.c_contiguous or a.flags.f_contiguous))
    assert_array_same(loads_oob(header, buffers)["a"], a)


@pytest.mark.parametrize("dtype", [
    "?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", np.longdouble,
    "c8", "c16", np.clongdouble, "M8[ns]", "M8[D]", "m8[us]", "S3", "U2", "V4", ">f8", ">i4",
    "<U3", ">c8"])
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (5,), (2, 3, 4)])
def test_every_dtype_and_shape(dtype, shape):
    dtype, size = np.dtype(dtype), math.prod(shape)
    if dtype.kind == "U":       # random bytes are not valid code points
        a = np.array([chr(97 + i % 26) * (i % 3) for i in range(size)], dtype).reshape(shape)
    else:
        raw = np.random.default_rng(0).integers(0, 256, size=1024, dtype=np.uint8)
        a = raw[:dtype.itemsize * size].view(dtype).reshape(shape)
    assert_array_same(roundtrip(a), a)
    assert_array_same(roundtrip_oob(a, threshold=0), a)
    assert_array_same(roundtrip_oob(a, threshold=2**40), a)


def test_non_contiguous_arrays_keep_values_and_shape():
    base = np.arange(4 * 6 * 5, dtype=np.int32).reshape(4, 6, 5)
    for a in (base[::2, 1::3, ::-1], base.transpose(2, 0, 1), base[..., 2], base[::-1]):
        assert not (a.flags.c_contiguous or a.flags.f_contiguous) or a is base[..., 2]
        out = roundtrip(a)
        assert_array_same(out, a)
        np.testing.assert_array_equal(out, a)
        buffers = []
        loads_oob(dumps_oob(a, buffers, 0), buffers)
        assert not np.shares_memory(buffers[0], base)   # made contiguous by one copy


def test_fortran_arrays_are_stored_without_copy_and_come_back_fortran():
    a = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    buffers = []
    header = dumps_oob(a, buffers, 0)
    assert np.shares_memory(buffers[0], a)
    np.testing.assert_array_equal(buffers[0].view(a.dtype), a.ravel(order="F"))
    for out in (loads_oob(header, buffers), roundtrip(a)):
        assert out.flags.f_contiguous and not out.flags.c_contiguous
        np.testing.assert_array_equal(out, a)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")    # np.matrix
def test_array_subclasses_are_sent_as_ndarray(tmp_path):
    mm = np.memmap(tmp_path / "m.bin", dtype="f4", mode="w+", shape=(3, 2))
    mm[:] = 7
    for a in (mm, np.asmatrix([[1, 2]]), np.arange(4).view(Sub)):
        out = roundtrip(a)
        assert type(out) is np.ndarray
        np.testing.assert_array_equal(out, np.asarray(a))


def test_same_array_twice():
    a = np.arange(5)
    out = roundtrip([a, a, {"x": a}])
    for x in (out[0], out[1], out[2]["x"]):
        assert_array_same(x, a)


@pytest.mark.parametrize("nbytes", [0, 1, 64 << 20])
def test_array_sizes(nbytes):
    a = np.arange(nbytes, dtype=np.uint8) * np.uint8(37)
    buf = dumps([a])
    assert len(buf) >= nbytes
    assert_array_same(loads(buf)[0], a)
    assert_array_same(roundtrip_oob([a], threshold=0)[0], a)
    assert_array_same(roundtrip_oob([a], threshold=2)[0], a)


# ---------------------------------------------------------------- unsupported values

class Custom:
    pass


@pytest.mark.parametrize("obj, message", [
    ([0, {"mask": {1, 2}}], "cannot serialize object of type 'set' at [1]['mask']"),
    ({1, 2}, "cannot serialize object of type 'set' at the top level"),
    ((0, [1, Custom()]), "cannot serialize object of type 'Custom' at [1][1]"),
    ({"a": [datetime.datetime(2020, 1, 1)]},
     "cannot serialize object of type 'datetime' at ['a'][0]"),
    ([{frozenset(): 1}], "cannot serialize object of type 'frozenset' at [0] (as a dict key)"),
    ([np.array([None, 1])], "cannot serialize object of type 'ndarray' with dtype object at [0]"),
    ([1, np.zeros(1, "i4,f8")[0]], "cannot serialize object of type 'void' at [1]"),
    ([np.ma.masked_array([1, 2], mask=[0, 1])],
     "cannot serialize object of type 'MaskedArray' at [0]"),
    ([np.array(["a"], dtype=np.dtypes.StringDType())],
     "cannot serialize object of type 'ndarray' with dtype StringDType() at [0]"),
    ([[1, 2], [3, len]], "cannot serialize object of type 'builtin_function_or_method' "
                         "at [1][1]"),
])
def test_unsupported_values_name_type_and_path(obj, message):
    # the value's type and place, then what would carry it
    hint = " (only pickle carries it: pass allow_pickle=True where the reader is trusted)"
    with pytest.raises(TypeError) as info:
        dumps(obj)
    assert str(info.value) == message + hint
    buffers = ["sentinel"]
    with pytest.raises(TypeError) as info:
        dumps_oob(obj, buffers, 0)
    assert str(info.value) == message + hint
    assert buffers == ["sentinel"]      # nothing appended by a failed call


def test_failed_dumps_oob_appends_nothing():
    buffers = ["sentinel"]
    with pytest.raises(TypeError, match=r"'Custom' at \[1\]\[1\]"):
        dumps_oob([np.zeros(100), (np.ones(5), Custom())], buffers, 0)
    assert buffers == ["sentinel"]


def test_no_pickle_fallback_for_arbitrary_objects():
    with pytest.raises(TypeError, match="'Custom' at the top level"):
        dumps(Custom())


# ---------------------------------------------------------------- malformed input

def test_garbage_raises_value_error():
    good = bytes(dumps({"a": np.arange(10), "b": [1, (2, "x")], "c": 2**80}))
    bad_version = good[:4] + b"\x02" + good[5:]
    cases = [b"", b"DF", b"not a message at all, really", bytes(100), bad_version,
             good[:4] + b"\x01" + bytes(3) + struct.pack("<IQ", 2**32 - 1, 0)]
    cases += [good[:n] for n in range(len(good))]       # every truncation
    for garbage in cases:
        with pytest.raises(ValueError):
            loads(garbage)
    with pytest.raises(ValueError, match="magic"):
        loads(b"x" * 64)
    with pytest.raises(ValueError, match="version"):
        loads(bad_version)
    with pytest.raises(ValueError, match="truncated"):
        loads(good[:10])


@given(st.binary(max_size=200))
@settings(deadline=None, max_examples=200)
def test_random_bytes_after_a_valid_prefix_raise_value_error_or_decode(tail):
    data = b"DFMP\x01" + bytes(3) + struct.pack("<IQ", 0, len(tail)) + tail
    try:
        loads(data)
    except ValueError:
        pass
    with pytest.raises(ValueError):
        loads_oob(b"\xc1" + tail, [])       # 0xc1 is never valid msgpack


def test_crafted_headers_are_rejected():
    def header(*fields):
        return msgpack.packb(msgpack.ExtType(5, msgpack.packb(list(fields))))

    cases = [
        header("|O", [1], False, 0),          # object dtype from raw bytes: must never be made
        header("<i4,<f8", [1], False, 0),     # structured
        header("<f8", [-1], False, 0),        # negative dimension
        header("<f8", [100], False, 0),       # buffer too short
        header("<f8", [1], False, 5),         # no such buffer
        header("<f8", [1], False, -1),
        header("<f8", [2], False, b"short"),  # inline data too short
        msgpack.packb(msgpack.ExtType(99, b"")),
        msgpack.packb(msgpack.ExtType(4, b"\x02|O" + bytes(8))),
        msgpack.packb(msgpack.ExtType(2, msgpack.packb(3))),
        msgpack.packb([1, 2]) + b"extra",
    ]
    for data in cases:
        with pytest.raises(ValueError):
            loads_oob(data, [bytes(8)])
    for data in cases[:2]:
        with pytest.raises(ValueError, match="unsupported dtype"):
            loads_oob(data, [bytes(8)])


# ---------------------------------------------------------------- zero copy and writability

def data_offset(arr, buf):
    return (arr.__array_interface__["data"][0]
            - np.frombuffer(buf, np.uint8).__array_interface__["data"][0])


@pytest.mark.parametrize("big", [0, 100_000], ids=["joined", "filled-in-place"])
def test_dumps_returns_bytes_with_aligned_buffers(big):
    arrays = [np.arange(n, dtype=dt) for n, dt in [(3, "u1"), (7, "f8"), (0, "i4"), (5, "c16"),
                                                    (big, "u1")]]
    buf = dumps(["pad" * 7, arrays])
    assert type(buf) is bytes                   # as issue 2 has it: dumps(obj) -> bytes
    for a, out in zip(arrays, loads(buf)[1]):
        np.testing.assert_array_equal(out, a)
        assert np.shares_memory(out, np.frombuffer(buf, np.uint8)) == (out.nbytes > 0)
        if out.nbytes:
            assert data_offset(out, buf) % 64 == 0
    # the same message every time: the alignment gaps are zeros, not what memory held
    assert dumps(["pad" * 7, arrays]) == buf
    assert len(buf) > 64 * 1024 if big else len(buf) < 64 * 1024


def test_dumps_copies_a_large_array_once():
    a = np.ones(8 << 20, np.uint8)
    tracemalloc.start()
    try:
        msg = dumps([a])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(msg) > a.nbytes and peak < 1.2 * a.nbytes     # the message, no second copy


def test_loads_is_zero_copy_and_follows_buffer_writability():
    a = np.arange(1000, dtype=np.float32)
    msg = dumps({"a": a})
    ro = bytes(msg)
    out = loads(ro)["a"]
    assert np.shares_memory(out, np.frombuffer(ro, np.uint8))
    assert not out.flags.writeable
    with pytest.raises(ValueError):
        out[0] = 1

    out = loads(msg)["a"]                       # dumps gives bytes: read-only views
    assert not out.flags.writeable and np.shares_memory(out, np.frombuffer(msg, np.uint8))

    rw = bytearray(msg)
    out = loads(rw)["a"]
    assert out.flags.writeable and np.shares_memory(out, np.frombuffer(rw, np.uint8))
    out[:] = -1
    assert (loads(rw)["a"] == -1).all()         # writes go to the message itself
    assert (a >= 0).all()                       # and never back to the source array

    out = loads(memoryview(rw)[:])["a"]
    assert out.flags.writeable


def test_loads_from_mmap(tmp_path):
    a = np.arange(100, dtype=np.int64).reshape(10, 10)
    msg = dumps([a])
    anon = mmap.mmap(-1, len(msg))
    anon[:] = msg
    out = loads(anon)[0]
    assert out.flags.writeable and np.shares_memory(out, np.frombuffer(anon, np.uint8))
    np.testing.assert_array_equal(out, a)
    del out

    path = tmp_path / "msg.bin"
    path.write_bytes(msg)
    with open(path, "rb") as f:
        ro = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    out = loads(ro)[0]
    assert not out.flags.writeable
    np.testing.assert_array_equal(out, a)
    del out
    anon.close()
    ro.close()


def test_dumps_copies_the_source():
    a = np.arange(10)
    msg = dumps(a)
    a[:] = 0
    np.testing.assert_array_equal(loads(msg), np.arange(10))


# ---------------------------------------------------------------- out-of-band API

def test_oob_threshold_boundary():
    threshold = 1024
    at, below = np.zeros(threshold, np.uint8), np.ones(threshold - 1, np.uint8)
    buffers = []
    header = dumps_oob([at, below], buffers, threshold)
    assert len(buffers) == 1 and np.shares_memory(buffers[0], at)
    assert len(header) > threshold - 1        # the small one is inline
    out = loads_oob(header, buffers)
    assert_array_same(out[0], at)
    assert_array_same(out[1], below)
    assert np.shares_memory(out[0], buffers[0])
    assert out[1].flags.writeable and out[1].flags.owndata    # inline: an owned copy
    assert DEFAULT_OOB_THRESHOLD == 16 * 1024


def test_oob_indices_are_absolute_across_calls():
    big = [np.full(DEFAULT_OOB_THRESHOLD, i, np.uint8) for i in range(4)]
    buffers = ["unrelated"]
    h1 = dumps_oob({"x": big[0], "y": [big[1]]}, buffers)
    h2 = dumps_oob((big[2], 5, big[3]), buffers)
    assert len(buffers) == 5
    out1, out2 = loads_oob(h1, buffers), loads_oob(h2, buffers)
    assert_array_same(out1["x"], big[0])
    assert_array_same(out1["y"][0], big[1])
    assert_array_same(out2[0], big[2])
    assert_array_same(out2[2], big[3])
    assert out2[1] == 5
    assert np.shares_memory(out2[2], buffers[4])


def test_oob_accepts_any_buffer_of_sufficient_length():
    a = np.arange(10_000, dtype=np.float64).reshape(100, 100)
    buffers = []
    header = dumps_oob(a, buffers)
    raw = buffers[0].tobytes()
    out = loads_oob(header, [raw + b"trailing"])
    np.testing.assert_array_equal(out, a)
    assert not out.flags.writeable
    writable = bytearray(raw)
    out = loads_oob(header, [memoryview(writable)])
    assert out.flags.writeable and np.shares_memory(out, np.frombuffer(writable, np.uint8))
    other = np.frombuffer(raw, np.float64).copy()         # an ndarray of another dtype
    np.testing.assert_array_equal(loads_oob(header, [other]), a)
    with pytest.raises(ValueError):
        loads_oob(header, [raw[:-1]])
    with pytest.raises(ValueError):
        loads_oob(header, [])
    strided = np.zeros(2 * len(raw), np.uint8)[::2]
    with pytest.raises(ValueError, match="not contiguous"):
        loads_oob(dumps_oob(np.zeros(len(raw), np.uint8), [], 0), [strided])


def sub_owning(raw):
    return raw.view(Sub).copy()


def sub_over_plain(raw):
    return raw.view(Sub)


def sub_over_sub(raw):
    return raw.view(Sub)[:]


def sub_over_memory(raw):
    return Sub(raw.shape, np.uint8, buffer=memoryview(raw))


@pytest.mark.parametrize("make", [sub_owning, sub_over_plain, sub_over_sub, sub_over_memory])
def test_oob_result_keeps_the_buffer_object_alive(make):
    a = np.arange(DEFAULT_OOB_THRESHOLD, dtype=np.int32).reshape(-1, 64)
    buffers = []
    header = dumps_oob([a], buffers)
    b = make(buffers[0].copy())
    ref = weakref.ref(b)
    shared = [b]
    out = loads_oob(header, shared)[0]
    del b, shared, buffers
    assert type(out) is np.ndarray
    np.testing.assert_array_equal(out, a)
    view = out[::2].T
    del out
    assert ref() is not None                  # a view of the result keeps the buffer alive
    assert view.base is not None
    del view
    assert ref() is None                      # and nothing else does


def test_oob_result_is_a_writable_view_of_a_writable_buffer():
    a = np.arange(DEFAULT_OOB_THRESHOLD, dtype=np.uint8)
    buffers = []
    header = dumps_oob(a, buffers)
    b = buffers[0].copy().view(Sub)
    out = loads_oob(header, [b])
    out[0] = 99
    assert b[0] == 99
    b.flags.writeable = False
    assert not loads_oob(header, [b]).flags.writeable


# ---------------------------------------------------------------- misc

def test_public_api():
    assert dataflow.serialize is serialize
    assert set(serialize.__all__) == {"DEFAULT_OOB_THRESHOLD", "dumps", "dumps_oob", "loads",
                                      "loads_oob"}


def test_thread_safety():
    errors = []

    def work(i):
        try:
            for j in range(200):
                obj = [i, j, (np.full(j % 7, i), {"k": np.full(3000 * (j % 3), j % 100, np.int8)})]
                assert_same(roundtrip(obj), obj)
                assert_same(roundtrip_oob(obj, 1000), obj)
        except Exception as exc:       # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


# ---------------------------------------------------------------- the reused encoder
# dumps/dumps_oob reuse one encoder (and msgpack Packer) per thread.

class _EncodesWhenPickled:
    """Pickling it encodes its content with this codec, on the same thread, while the outer
    encoding is under way (the thread's encoder is busy then)."""

    def __init__(self, inner):
        self.inner = inner

    def __reduce__(self):
        return _rebuild_encoded, (bytes(serialize.dumps(self.inner, allow_pickle=True)),)

    def __eq__(self, other):
        return type(other) is _EncodesWhenPickled and _same(self.inner, other.inner)


def _rebuild_encoded(data):
    return _EncodesWhenPickled(serialize.loads(data, allow_pickle=True))


def _same(a, b):
    if isinstance(a, np.ndarray):
        return type(b) is np.ndarray and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


def test_an_encoding_inside_an_encoding_keeps_both_apart():
    big = np.arange(5000, dtype=np.float64)               # 40 KB: out of band
    inner = (1, {2, 3}, np.ones(3000), ("x", (4,)))
    buffers = []
    header = serialize.dumps_oob([big, _EncodesWhenPickled(inner), (5, 6)], buffers,
                                 allow_pickle=True)
    assert len(buffers) == 1 and buffers[0].nbytes == big.nbytes
    out = serialize.loads_oob(header, buffers, allow_pickle=True)
    assert _same(out[0], big) and out[1] == _EncodesWhenPickled(inner) and out[2] == (5, 6)


def test_a_failed_encoding_leaves_the_next_one_intact():
    for _ in range(3):
        buffers = [b"kept"]
        with pytest.raises(TypeError, match="'set' at \\[1\\]\\[0\\]"):
            serialize.dumps_oob([np.zeros(5000), ({1},)], buffers)
        assert buffers == [b"kept"]
        header = serialize.dumps_oob([7, (8, [9]), np.zeros(5000)], buffers)
        out = serialize.loads_oob(header, buffers)
        assert out[:2] == [7, (8, [9])] and _same(out[2], np.zeros(5000))


def test_threads_encode_at_once_without_mixing():
    def work(k, results, done):
        try:
            for i in range(300):
                value = [k, i, (k, {"i": i}), np.full(3000 + k, i, np.int64)]
                buffers = []
                header = serialize.dumps_oob(value, buffers, allow_pickle=True)
                if not _same(serialize.loads_oob(header, buffers, allow_pickle=True), value):
                    results.append((k, i))
                done[k] += 1
        except Exception as e:          # an error in a thread must fail the test, not end it
            results.append((k, e))

    bad, done = [], [0] * 4
    threads = [threading.Thread(target=work, args=(k, bad, done)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad
    assert done == [300] * 4
