"""dataflow.formats.codec: msgpack-numpy's exact bytes, pickle, sniffing, zero-copy decoding,
allow_pickle and errors."""
import pickle

import msgpack
import msgpack_numpy
import numpy as np
import pytest

from dataflow.formats import codec

RNG = np.random.RandomState(0)
VALUES = [
    [np.arange(4, dtype="uint8").reshape(2, 2), np.int64(3), 3],
    {"a": np.zeros((3, 5), "f4"), b"b": [1.5, "x", b"y", None, True, False], "c": 1 + 2j},
    [np.zeros(2, dtype=[("a", "<i4"), ("b", "<f8", (2,))])],
    [np.arange(6).reshape(2, 3).T, np.arange(10, dtype=">i4"), np.array(2.5)],
    [np.float32(2), np.bool_(True), np.float64(1.5), -5, 2**40, -2**40, "ü" * 40, np.str_("s")],
    [RNG.rand(100, 100), RNG.randint(0, 256, 150_000).astype("uint8"), b"z" * 70_000, 7],
    (RNG.rand(3000, 3).T, "tuple", {"k": np.zeros(20_000, "u1")}),
    [np.zeros(2**16, "u1"), np.zeros(2**16 - 1, "u1"), np.zeros(255, "u1"), np.zeros((0, 4))],
    [np.array([1, "a"], dtype=object)],
    {1: "int key"},
    [],
    [np.zeros(20_000, "<U3")],
    [np.zeros((2, 200, 300), "u1"), np.zeros((5, 5, 5, 5), "<c8")],
]


def same(a, b):
    if isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and \
            (np.array_equal(a, b) if b.dtype != object else list(a) == list(b))
    if isinstance(b, (list, tuple)):
        return isinstance(a, list) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(b, dict):
        return isinstance(a, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in b)
    return a == b and (type(a) is type(b) or isinstance(b, (np.float64, np.str_)))


@pytest.mark.parametrize("i", range(len(VALUES)))
def test_msgpack_bytes_are_msgpack_numpys(i):
    v = VALUES[i]
    assert codec.dumps(v) == msgpack_numpy.packb(v, use_bin_type=True)
    assert codec.dumps(v, "msgpack") == codec.dumps(v)


@pytest.mark.parametrize("i", range(len(VALUES)))
def test_round_trips_and_agrees_with_msgpack_numpy(i):
    v = VALUES[i]
    b = codec.dumps(v)
    got = codec.loads(b)
    assert same(got, v)
    ref = msgpack_numpy.unpackb(b, raw=False, strict_map_key=False)
    assert same(got, ref) or isinstance(v, dict)
    assert same(codec.loads(codec.dumps(v, "pickle")), v) or isinstance(v, tuple)


def test_both_decoders_give_the_same_values():
    for v in VALUES:
        b = codec.dumps(v)
        small = msgpack.unpackb(b, raw=False, strict_map_key=False,
                                object_hook=codec._HOOKS[True])
        walked = codec._Walker(b, True, None).value()
        assert same(walked, small)


@pytest.mark.parametrize("v", [
    {"nd": 3, "x": 1}, {"nd": True}, {"complex": True, "data": "1+2j"}, {b"nd": 1},
    {b"nd": True, b"data": b"xx"}, {"nd": False, "type": "<f4"},
])
def test_user_maps_with_record_keys_stay_maps_as_msgpack_numpy_reads_them(v):
    # "nd" and "complex" keys made the map an array (KeyError) or a complex number
    b = codec.dumps(v)
    assert msgpack_numpy.unpackb(b, raw=False, strict_map_key=False) == v
    assert codec.loads(b) == v
    assert codec._Walker(b, True, None).value() == v
    assert codec.loads(codec.dumps([v, np.zeros(20_000, "u1")]))[0] == v


def test_records_with_str_keys_of_older_writers_are_arrays():
    rec = {"nd": True, "type": "<i2", "kind": "", "shape": [2], "data": b"\x01\x00\x02\x00"}
    assert codec.loads(msgpack.packb(rec, use_bin_type=True)).tolist() == [1, 2]


@pytest.mark.parametrize("wrap", [lambda a: [a], lambda a: {"a": [a]}])
def test_a_shape_header_of_the_wrong_length_is_an_error(wrap):
    # a 2-dimension shape holding one 2-byte uint (cc 80) was read as the shape (204, 128)
    good = codec.dumps(wrap(np.zeros((204, 128), np.uint8)))
    assert b"\x92\xcc\xcc\xcc\x80" in good
    bad = good.replace(b"\x92\xcc\xcc\xcc\x80", b"\x92\xcc\x80")
    with pytest.raises(ValueError):                 # msgpack's own reader: "incomplete input"
        msgpack.unpackb(bad)
    with pytest.raises(codec.DecodeError):
        codec.loads(bad)


FLAT = [
    [RNG.randint(0, 256, 150_000).astype("uint8"), 7],
    [np.zeros((3, 200, 40), "<f4"), 0, 127, 128, 255, 256, 2**16, 2**32, -1, -32, -33, -200,
     -2**20, -2**40, 1.5],
    [np.zeros(30_000, ">i2"), np.zeros((2, 10_000), "u1"), np.array(7.0)],
    # byte strings (bin 32, bin 16, bin 8) as an encoded image's bytes and its label
    [b"\x01" + np.zeros(20_000, "f8").tobytes(), 3, b"", b"ab" * 100, b"c" * 300],
    [np.zeros(20_000, "u1"), [1, 2]],                  # a nested list: not flat
    [np.zeros(20_000, "u1"), None],
    [np.zeros((200, 200), "u1"), "s"],
]


@pytest.mark.parametrize("i", range(len(FLAT)))
def test_flat_list_fast_path_gives_the_walkers_values(i):
    b = codec.dumps(FLAT[i])
    assert len(b) >= codec.ZERO_COPY_MIN
    walked = codec._Walker(b, True, None).value()
    fast = codec.flat_list(b)
    assert same(walked, FLAT[i])
    if i < 4:
        assert fast is not None and same(fast, walked)
        arrays = [a for a in fast if isinstance(a, np.ndarray)]
        assert all(not a.flags.writeable and a.flags.aligned for a in arrays)
        assert [type(x) for x in fast] == [type(x) for x in FLAT[i]]   # bytes stay bytes
    else:
        assert fast is None
    assert codec.flat_list(bytearray(b)) is None or \
        not any(isinstance(a, np.ndarray) and a.flags.writeable
                for a in codec.flat_list(bytearray(b)))
    assert codec.flat_list(b[:-1]) is None              # truncated: the walker names it
    with pytest.raises(codec.DecodeError):
        codec.loads(b[:-1])


def test_flat_list_copies_unaligned_arrays():
    # a 1-byte int before the array puts its data at an odd offset
    v = [np.arange(5000, dtype="<f8"), 3]
    b = codec.dumps(v)
    got = codec.flat_list(b)
    assert got[0].flags.aligned and not got[0].flags.writeable
    np.testing.assert_array_equal(got[0], v[0])


@pytest.mark.parametrize("n", [10, 3000])
def test_datetime_arrays_which_msgpack_numpy_cannot_write(n):
    # msgpack-numpy raises on datetime64 arrays ("cannot include dtype 'M' in a buffer"); we
    # write the same layout (type "<M8[ns]", raw bytes), which its decoder reads
    v = [np.arange(n).astype("M8[ns]"), 1]
    b = codec.dumps(v)
    for got in (codec.loads(b), msgpack_numpy.unpackb(b, raw=False)):
        assert got[0].dtype == np.dtype("M8[ns]")
        np.testing.assert_array_equal(got[0], v[0])


def test_pickle_is_tensorpacks_default_protocol():
    b = codec.dumps([1, np.zeros(3)], "pickle")
    assert b[:2] == bytes([0x80, pickle.HIGHEST_PROTOCOL])
    assert codec.sniff(b) == "pickle"


def test_sniff():
    assert codec.sniff(msgpack.packb({})) == "msgpack"           # b"\x80", the empty map
    assert codec.sniff(codec.dumps({"a": 1})) == "msgpack"
    for proto in (2, 3, 4, 5):
        assert codec.sniff(pickle.dumps([1], protocol=proto)) == "pickle"
    assert codec.loads(b"\x80") == {}


def test_large_arrays_are_read_only_views_of_the_buffer():
    v = [np.arange(20_000, dtype="uint8"), np.arange(10_000, dtype="float64"), 3]
    b = codec.dumps(v)
    # place the buffer so that the float64 data starts on an 8-byte boundary
    data_off = len(b) - 1 - v[1].nbytes
    pad = -data_off % 8
    buf = bytearray(pad) + bytearray(b)
    got = codec.loads(memoryview(buf)[pad:])
    whole = np.frombuffer(buf, np.uint8)
    for arr, want in zip(got[:2], v[:2]):
        assert not arr.flags.writeable and arr.flags.aligned and not arr.flags.owndata
        assert np.shares_memory(arr, whole)
        np.testing.assert_array_equal(arr, want)
    small = codec.loads(codec.dumps([np.arange(4.0)]))[0]      # the C path: a copy, read-only
    assert not small.flags.writeable


def test_unaligned_array_bytes_are_copied_to_aligned_memory():
    v = [np.arange(3000, dtype="float64")]
    b = codec.dumps(v)
    shifted = bytearray(1) + bytearray(b)          # the data now starts one byte later
    arr = codec.loads(memoryview(shifted)[1:])[0]
    assert arr.flags.aligned and not arr.flags.writeable
    np.testing.assert_array_equal(arr, v[0])


def test_allow_pickle_false_refuses_pickles_and_object_arrays():
    with pytest.raises(codec.PickleRefusedError, match="file f, record 3: .*allow_pickle=False"):
        codec.loads(codec.dumps([1], "pickle"), allow_pickle=False, where="file f, record 3")
    obj = codec.dumps([np.array([1, "a"], dtype=object)])
    with pytest.raises(codec.PickleRefusedError, match="object array"):
        codec.loads(obj, allow_pickle=False)
    big_obj = codec.dumps([np.array([1, "a"], dtype=object), b"x" * 20_000])
    with pytest.raises(codec.PickleRefusedError, match="object array"):
        codec.loads(big_obj, allow_pickle=False)
    assert codec.loads(codec.dumps([np.zeros(3)]), allow_pickle=False)[0].shape == (3,)


@pytest.mark.parametrize("buf, match", [
    (b"\x92\x01", "neither a pickle nor valid msgpack"),
    (b"\xc1", "neither a pickle nor valid msgpack"),
    (b"\x80\x05garbage", "does not unpickle"),
    (codec.dumps([np.zeros(5000)])[:-3], "truncated"),
    (codec.dumps([np.zeros(5000)]) + b"\x00", "extra data"),
    (codec.dumps([b"x" * 20_000, 1])[:-1], "truncated"),
], ids=["short-list", "reserved-byte", "bad-pickle", "cut-array", "extra-byte", "cut-list"])
def test_bad_values_raise_decode_error_naming_where(buf, match):
    with pytest.raises(codec.DecodeError, match=f"W: .*{match}"):
        codec.loads(buf, where="W")


def test_array_whose_data_does_not_match_its_shape():
    good = codec.dumps([np.zeros(3000, "f8"), 1])
    bad = good.replace(b"\xc4\x05shape\x91\xcd\x0b\xb8", b"\xc4\x05shape\x91\xcd\x0b\xb9")
    assert bad != good
    with pytest.raises(codec.DecodeError, match="needs 24008 bytes"):
        codec.loads(bad)


def test_dumps_errors():
    with pytest.raises(ValueError, match="unknown format"):
        codec.dumps([1], format="json")
    with pytest.raises(TypeError, match="set"):
        codec.dumps([{1, 2}])
    with pytest.raises(TypeError, match="datetime64"):
        codec.dumps([np.datetime64("2020-01-01")])


def test_msgpack_int_out_of_range_error_names_the_int():
    # was "cannot encode an object of type builtins.int"; tensorpack's msgpack raises too
    with pytest.raises(TypeError, match=r"the int 18446744073709551616 as msgpack: .*-2\*\*63 "
                                        r"to 2\*\*64 - 1"):
        codec.dumps([1, {"k": 2**64}])
    with pytest.raises(TypeError, match=r"the int -9223372036854775809 "):
        codec.Encoder()([-2**63 - 1])
    with pytest.raises(TypeError, match=r"the int of 16610 bits"):
        codec.dumps([np.zeros(20_000, "u1"), 10**5000])
    assert codec.loads(codec.dumps([2**64 - 1, -2**63])) == [2**64 - 1, -2**63]


def test_small_batch_decodes_in_order_and_finds_the_bad_value():
    vals = [[i, np.full(3, i, "f4")] for i in range(10)]
    batch = codec.SmallBatch(True, size=4)
    assert [batch.add(codec.dumps(v)) for v in vals[:4]] == [False, False, False, True]
    got = batch.decode()
    assert [g[0] for g in got] == [0, 1, 2, 3] and not got[1][1].flags.writeable
    assert len(batch) == 0
    # a value missing its last item borrows the next value's first byte: found, not misread
    bufs = [codec.dumps(v) for v in vals[:3]]
    bufs[1] = bufs[1][:-1]
    for b in bufs:
        batch.add(b)
    with pytest.raises(codec.BatchError) as err:
        batch.decode()
    assert err.value.index == 1 and [d[0] for d in err.value.done] == [0]
    bad = codec.SmallBatch(False)
    bad.add(codec.dumps([np.array([1, "a"], dtype=object)]))
    with pytest.raises(codec.BatchError) as err:
        bad.decode()
    assert isinstance(err.value.error, codec.PickleRefusedError)


SAME_LAYOUT = {
    "int and array": [[i, np.full(16, i, "f4")] for i in range(40)],
    "wide numbers": [[1000 + i, -40000 - i, 2**40 + i, 0.5 + i, np.float32(i).item(),
                      np.arange(6, dtype=">i2").reshape(2, 3) + i] for i in range(30)],
    "arrays": [[np.full((2, 3, 4), i, "u1"), np.full(5, i, "<c8"), np.zeros((0, 3))]
               for i in range(20)],
    # one length, different layouts: the unpacker decodes them
    "fixint then uint8": [[5, 200], [200, 5]],
    "shapes": [[np.zeros((2, 3), "u1")], [np.zeros((3, 2), "u1")]],
    "dtypes": [[np.zeros(4, "<i4")], [np.zeros(4, "<f4")]],
    "not flat": [[[1, 2], 3], [[4, 5], 6]],
    "0-d array": [[np.array(1.0)], [np.array(2.0)]],
    "strings": [["ab", 1], ["cd", 2]],
}


@pytest.mark.parametrize("name", SAME_LAYOUT)
def test_small_batch_same_layout_gives_the_unpackers_values(name):
    vals = SAME_LAYOUT[name]
    bufs = [codec.dumps(v) for v in vals]
    if name in ("int and array", "wide numbers", "arrays"):
        assert len(set(map(len, bufs))) == 1
        assert codec._same_layout(b"".join(bufs), len(bufs)) is not None
    batch = codec.SmallBatch(True, size=1000)
    for b in bufs:
        batch.add(b)
    got = batch.decode()
    ref = [msgpack.unpackb(b, raw=False, strict_map_key=False, object_hook=codec._HOOKS[True])
           for b in bufs]
    assert len(got) == len(ref)
    for g, r, v in zip(got, ref, vals):
        assert same(g, r) and same(g, v)
        assert [type(x) for x in g] == [type(x) for x in r]
        for a in g:
            if isinstance(a, np.ndarray):
                assert not a.flags.writeable and a.flags.aligned


def test_small_batch_same_length_but_not_one_layout_is_not_misread():
    # equal lengths and a first value with a layout, but another value differs in a header byte
    a, b = codec.dumps([1, np.zeros(3, "<f4")]), codec.dumps([1, np.zeros(3, "<i4")])
    assert len(a) == len(b)
    assert codec._same_layout(a + b, 2) is None
    # values of different lengths that add up to a multiple are not split as rows
    batch = codec.SmallBatch(True)
    for v in ([1, 2, 3], [1], [1, 2, 3, 4, 5]):
        batch.add(codec.dumps(v))
    assert batch.decode() == [[1, 2, 3], [1], [1, 2, 3, 4, 5]]


@pytest.mark.parametrize("fmt", codec.FORMATS)
def test_encoder_gives_dumps_bytes_in_a_reused_buffer(fmt):
    enc = codec.Encoder(fmt)
    for v in VALUES + FLAT:
        buf = enc(v)
        assert bytes(buf) == codec.dumps(v, fmt)
    if fmt == "msgpack":
        first = enc([np.zeros(3), 1])
        enc([2])
        with pytest.raises(ValueError):         # the last buffer ends with the next call
            bytes(first)
        with pytest.raises(TypeError):
            enc([object()])
        assert bytes(enc([3])) == codec.dumps([3])      # an error leaves no partial bytes
        enc.release()
    with pytest.raises(ValueError):
        codec.Encoder("json")


def test_dumps_reentrant_and_bounded_pool():
    # a value that is long returns no packer to the pool (its buffer would stay)
    n = len(codec._PACKERS)
    codec.dumps({"a": np.zeros(2 << 20, "u1")})
    assert len(codec._PACKERS) <= max(n, 1)
    with pytest.raises(TypeError):
        codec.dumps([object()])
    assert codec.dumps([1, {"b": 2}]) == msgpack.packb([1, {"b": 2}], use_bin_type=True)


def test_loads_of_no_buffer_names_it():
    # "object of type 'int' has no len()" before
    for bad in (5, None):
        with pytest.raises(TypeError, match="codec.loads needs a bytes-like object .* got "
                                            f"{type(bad).__name__}"):
            codec.loads(bad)
