"""LMDBSerializer, LMDBData, LMDBDataDecoder, CaffeLMDB: layout, round trips, sharing of the
environment, worker processes, zero-copy arrays and bad input."""
import gc
import mmap
import os
import pickle
import struct

import lmdb
import msgpack
import msgpack_numpy
import numpy as np
import pytest

import dataflow
from dataflow import (CaffeLMDB, DataFromList, LMDBData, LMDBDataDecoder, LMDBSerializer,
                      MultiProcessMapData, MultiProcessRunnerZMQ)
from dataflow.formats import codec
from dataflow.formats.lmdb import LMDBFormatError


def datapoints(n=10, big=False):
    rng = np.random.RandomState(n)
    size = 40_000 if big else 12
    return [[rng.randint(0, 256, size).astype("uint8"), i, rng.rand(3, 2).astype("float32"),
             "s%d" % i, b"b%d" % i] for i in range(n)]


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert len(g) == len(w)
        for x, y in zip(g, w):
            if isinstance(y, np.ndarray):
                assert isinstance(x, np.ndarray) and x.dtype == y.dtype
                np.testing.assert_array_equal(x, y)
            else:
                assert type(x) is type(y) and x == y


def load_all(path, **kw):
    df = LMDBSerializer.load(path, shuffle=False, **kw)
    df.reset_state()
    out = list(df)
    df.close()
    return out


def raw_records(path, subdir=False):
    env = lmdb.open(path, subdir=subdir, readonly=True, lock=False)
    with env.begin() as txn:
        recs = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    env.close()
    return recs


# -- layout --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["msgpack", "pickle"])
def test_file_layout_is_tensorpacks(tmp_path, fmt):
    dps = datapoints(3)
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path, format=fmt)
    assert sorted(os.listdir(tmp_path)) == ["x.lmdb", "x.lmdb-lock"]
    recs = raw_records(path)
    assert [k for k, _ in recs] == [b"00000000", b"00000001", b"00000002", b"__keys__"]
    if fmt == "msgpack":
        for (_, v), dp in zip(recs, dps):
            assert v == msgpack_numpy.packb(dp, use_bin_type=True)
        assert recs[-1][1] == msgpack.packb([b"00000000", b"00000001", b"00000002"],
                                            use_bin_type=True)
    else:
        for (_, v), dp in zip(recs, dps):
            assert v[:2] == b"\x80\x05"
            assert_same([pickle.loads(v)], [dp])
        assert pickle.loads(recs[-1][1]) == [b"00000000", b"00000001", b"00000002"]


def test_directory_layout(tmp_path):
    d = tmp_path / "db"
    d.mkdir()
    dps = datapoints(4)
    LMDBSerializer.save(DataFromList(dps, shuffle=False), str(d))
    assert sorted(os.listdir(d)) == ["data.mdb", "lock.mdb"]
    assert len(raw_records(str(d), subdir=True)) == 5
    assert_same(load_all(str(d)), dps)


@pytest.mark.parametrize("fmt", ["msgpack", "pickle"])
@pytest.mark.parametrize("big", [False, True])
def test_round_trip(tmp_path, fmt, big):
    dps = datapoints(20, big=big)
    path = tmp_path / "x.lmdb"
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path, format=fmt)   # a PathLike
    got = load_all(path)
    assert_same(got, dps)
    if fmt == "msgpack":     # read-only arrays, as tensorpack's msgpack path gives them
        assert not got[0][0].flags.writeable and not got[0][2].flags.writeable
    else:
        assert got[0][0].flags.writeable


def test_empty_dataflow(tmp_path):
    path = str(tmp_path / "e.lmdb")
    LMDBSerializer.save(DataFromList([], shuffle=False), path)
    assert raw_records(path) == [(b"__keys__", msgpack.packb([]))]
    df = LMDBSerializer.load(path)
    df.reset_state()
    assert len(df) == 0 and list(df) == []


def test_small_write_frequency_and_tuple_datapoints(tmp_path):
    dps = [(i, np.full(3, i)) for i in range(23)]
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path, write_frequency=4)
    got = load_all(path)
    assert [dp[0] for dp in got] == list(range(23))
    assert all(type(dp) is list for dp in got)          # msgpack: tuples come back as lists


def test_shuffle_visits_every_datapoint_in_a_new_order(tmp_path):
    dps = [[i] for i in range(200)]
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path)
    df = LMDBSerializer.load(path)            # shuffle=True is the default
    df.reset_state()
    assert len(df) == 200
    a, b = [dp[0] for dp in df], [dp[0] for dp in df]
    assert sorted(a) == sorted(b) == list(range(200))
    assert a != list(range(200)) and a != b
    df.close()


def test_seeded_shuffle_is_reproducible(tmp_path):
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(DataFromList([[i] for i in range(50)], shuffle=False), path)
    orders = []
    for _ in range(2):
        dataflow.set_seed(7)
        df = LMDBSerializer.load(path)
        df.reset_state()
        orders.append([dp[0] for dp in df])
        df.close()
    dataflow.set_seed(None)
    assert orders[0] == orders[1]


# -- saving: refusals and nothing left behind ------------------------------------------------------
def test_save_refuses_existing_file_and_directory_with_data(tmp_path):
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(DataFromList([[1]], shuffle=False), path)
    with pytest.raises(FileExistsError, match="x.lmdb"):
        LMDBSerializer.save(DataFromList([[2]], shuffle=False), path)
    d = tmp_path / "d"
    d.mkdir()
    LMDBSerializer.save(DataFromList([[1]], shuffle=False), str(d))
    with pytest.raises(FileExistsError, match="data.mdb"):
        LMDBSerializer.save(DataFromList([[2]], shuffle=False), str(d))
    assert load_all(path) == [[1]]


def test_save_needs_a_dataflow_and_a_known_format(tmp_path):
    with pytest.raises(TypeError, match="DataFlow"):
        LMDBSerializer.save([[1]], str(tmp_path / "x.lmdb"))
    with pytest.raises(ValueError, match="format"):
        LMDBSerializer.save(DataFromList([[1]]), str(tmp_path / "x.lmdb"), format="json")
    assert os.listdir(tmp_path) == []


def test_unencodable_datapoint_names_index_and_type_and_leaves_nothing(tmp_path):
    dps = [[1], [2], [{3, 4}], [5]]
    path = str(tmp_path / "x.lmdb")
    with pytest.raises(TypeError, match=r"datapoint 2 \(a list\).*msgpack.*set.*format=.pickle."):
        LMDBSerializer.save(DataFromList(dps, shuffle=False), path, write_frequency=1)
    assert os.listdir(tmp_path) == []


def test_error_in_source_leaves_nothing(tmp_path):
    def gen():
        yield [1]
        raise RuntimeError("source broke")
    path = str(tmp_path / "x.lmdb")
    with pytest.raises(RuntimeError, match="source broke"):
        LMDBSerializer.save(dataflow.DataFromGenerator(gen), path)
    assert os.listdir(tmp_path) == []


# -- loading: sharing the environment -------------------------------------------------------------
def test_two_loads_of_one_path_in_one_process(tmp_path):
    dps = datapoints(30, big=True)
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path)
    a = LMDBSerializer.load(path, shuffle=False)
    b = LMDBSerializer.load(path, shuffle=False)
    raw = LMDBData(path, shuffle=True)
    for df in (a, b, raw):
        df.reset_state()
    got_a, got_b = [], []
    for x, y, r in zip(a, b, raw):          # interleaved passes over one environment
        got_a.append(x)
        got_b.append(y)
        assert isinstance(r[0], bytes) and isinstance(r[1], bytes)
    assert_same(got_a, dps)
    assert_same(got_b, dps)
    a.close()
    assert_same(list(b), dps)                # the other reader keeps the environment
    b.close()
    raw.close()


@pytest.mark.parametrize("shuffle", [False, True])    # page scan; py-lmdb + address
def test_arrays_are_views_of_the_file_and_outlive_the_reader(tmp_path, shuffle):
    dps = datapoints(5, big=True)
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path)
    df = LMDBSerializer.load(path, shuffle=shuffle)
    df.reset_state()
    got = sorted(df, key=lambda dp: dp[1])
    df.close()                                # the reader is closed
    arr = got[3][0]
    assert not arr.flags.writeable and not arr.flags.owndata
    base = arr
    while not isinstance(base, mmap.mmap):    # the array's memory is the file's mapping
        base = base.obj if isinstance(base, memoryview) else base.base
        assert base is not None
    os.unlink(path)
    gc.collect()
    assert_same(got, dps)                     # still readable after close and unlink


def test_replaced_file_is_read_again(tmp_path):
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(DataFromList([[1]], shuffle=False), path)
    assert load_all(path) == [[1]]
    os.unlink(path)
    os.unlink(path + "-lock")
    LMDBSerializer.save(DataFromList([[2], [3]], shuffle=False), path)
    assert load_all(path) == [[2], [3]]


def _plus_one(dp):
    return [dp[0] + 1] + dp[1:]


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_upstream_of_multiprocess_runner(tmp_path, no_leaks, start_method):
    dps = datapoints(40, big=True)
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path)
    src = LMDBSerializer.load(path, shuffle=True)
    src.reset_state()
    first = list(src)                # the parent holds the environment when the workers start
    with MultiProcessRunnerZMQ(src, num_proc=2, start_method=start_method) as df:
        df.reset_state()
        got = list(df) + list(df)
    assert len(got) == 80 and set(dp[1] for dp in got) <= set(range(40))
    for dp in got:
        np.testing.assert_array_equal(dp[0], dps[dp[1]][0])
    assert_same(sorted(first, key=lambda dp: dp[1]), dps)
    src.close()
    del got, dp, first


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_lmdb_source_inside_process_workers(tmp_path, no_leaks, start_method):
    dps = datapoints(30)
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path)
    src = LMDBSerializer.load(path, shuffle=False)
    with MultiProcessMapData(src, 2, _plus_one, strict=True, ordered=True,
                             start_method=start_method) as df:
        df.reset_state()
        got = list(df)
    assert [dp[1] for dp in got] == list(range(30))
    for dp, d in zip(got, dps):
        np.testing.assert_array_equal(dp[0], d[0] + 1)
    src.close()


# -- LMDBData, LMDBDataDecoder ---------------------------------------------------------------------
def test_lmdbdata_yields_raw_key_value_pairs(tmp_path):
    dps = datapoints(5)
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path)
    df = LMDBData(path, shuffle=False)
    df.reset_state()
    assert len(df) == 5
    pairs = list(df)
    assert [k for k, _ in pairs] == [b"%08d" % i for i in range(5)]
    assert all(type(v) is bytes for _, v in pairs)
    assert_same([codec.loads(v) for _, v in pairs], dps)
    df.close()


def test_lmdbdatadecoder_names_a_decoder_that_is_no_function(tmp_path):
    # it failed at the first record with "'int' object is not callable"
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(DataFromList([[1]], shuffle=False), path)
    df = LMDBData(path, shuffle=False)
    with pytest.raises(TypeError, match=r"decoder must be callable as decoder\(key, value\)"):
        LMDBDataDecoder(df, 5)
    df.close()


def test_lmdbdata_keys_list_and_format_string(tmp_path):
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(DataFromList([[i] for i in range(10)], shuffle=False), path)
    df = LMDBData(path, shuffle=True, keys=[b"00000002", "00000005"])
    df.reset_state()
    assert len(df) == 2
    assert sorted(codec.loads(v)[0] for _, v in df) == [2, 5]
    df.close()
    df = LMDBData(path, shuffle=True, keys="{:0>8d}")      # tensorpack 0.11 fails on this
    df.reset_state()
    assert sorted(codec.loads(v)[0] for _, v in df) == list(range(10))
    df.close()


def test_lmdbdata_without_keys_record_walks_the_keys(tmp_path):
    path = str(tmp_path / "plain.lmdb")
    env = lmdb.open(path, subdir=False)
    with env.begin(write=True) as txn:
        for k in (b"a", b"b", b"c"):
            txn.put(k, k * 2)
    env.close()
    df = LMDBData(path, shuffle=True)
    df.reset_state()
    assert len(df) == 3 and sorted(df) == [[b"a", b"aa"], [b"b", b"bb"], [b"c", b"cc"]]
    df.close()
    with pytest.raises(LMDBFormatError, match=r"plain.lmdb.*__keys__"):
        LMDBSerializer.load(path)


def test_lmdbdatadecoder_applies_decoder_and_drops_none(tmp_path):
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(DataFromList([[i] for i in range(6)], shuffle=False), path)

    def decoder(k, v):
        i = codec.loads(v)[0]
        return None if i % 2 else [k, i * 10]
    df = LMDBDataDecoder(LMDBData(path, shuffle=False), decoder)
    df.reset_state()
    assert list(df) == [[b"00000000", 0], [b"00000002", 20], [b"00000004", 40]]
    df.close()


# -- CaffeLMDB -------------------------------------------------------------------------------------
def _varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _datum(c, h, w, data=None, label=0, float_data=None, encoded=False):
    """A caffe.Datum protobuf, written field by field (as protoc's encoder would)."""
    out = _varint(1 << 3) + _varint(c) + _varint(2 << 3) + _varint(h) + \
        _varint(3 << 3) + _varint(w)
    if data is not None:
        out += _varint(4 << 3 | 2) + _varint(len(data)) + data
    out += _varint(5 << 3) + _varint(label)
    if float_data is not None:
        packed = struct.pack("<%df" % len(float_data), *float_data)
        out += _varint(6 << 3 | 2) + _varint(len(packed)) + packed
    if encoded:
        out += _varint(7 << 3) + _varint(1)
    return out


def _caffe_db(path, values):
    env = lmdb.open(path, subdir=False)
    with env.begin(write=True) as txn:
        for k, v in values.items():
            txn.put(k, v)
    env.close()


def test_caffe_lmdb(tmp_path):
    rng = np.random.RandomState(0)
    chw = [rng.randint(0, 256, (3, 4, 5)).astype("uint8") for _ in range(3)]
    path = str(tmp_path / "caffe.lmdb")
    _caffe_db(path, {b"%08d" % i: _datum(3, 4, 5, a.tobytes(), label=i - 1)
                     for i, a in enumerate(chw)})
    df = CaffeLMDB(path, shuffle=False)
    df.reset_state()
    got = list(df)
    assert [dp[1] for dp in got] == [-1, 0, 1]
    for dp, a in zip(got, chw):
        assert dp[0].shape == (4, 5, 3) and dp[0].dtype == np.uint8
        np.testing.assert_array_equal(dp[0], a.transpose(1, 2, 0))
    df.close()
    df = CaffeLMDB(path, shuffle=True, keys="{:0>8d}")
    df.reset_state()
    assert sorted(dp[1] for dp in df) == [-1, 0, 1]
    df.close()


def test_caffe_lmdb_float_data(tmp_path):
    path = str(tmp_path / "caffe.lmdb")
    vals = [float(x) for x in range(12)]
    _caffe_db(path, {b"a": _datum(2, 2, 3, float_data=vals, label=7)})
    df = CaffeLMDB(path, shuffle=False)
    df.reset_state()
    (img, label), = list(df)
    assert label == 7 and img.dtype == np.float32
    np.testing.assert_array_equal(img, np.arange(12, dtype="float32").reshape(2, 2, 3)
                                  .transpose(1, 2, 0))
    df.close()


def test_caffe_lmdb_images_are_writable_as_tensorpacks(tmp_path):
    # tensorpack copies the data (np.fromstring); an in-place op on the image raised here
    path = str(tmp_path / "caffe.lmdb")
    chw = np.arange(24, dtype="uint8").reshape(2, 3, 4)
    _caffe_db(path, {b"a": _datum(2, 3, 4, chw.tobytes(), label=3)})
    for shuffle in (False, True):
        df = CaffeLMDB(path, shuffle=shuffle)
        df.reset_state()
        (img, label), = list(df)
        assert img.flags.writeable and img.shape == (3, 4, 2) and label == 3
        img += 1
        np.testing.assert_array_equal(img, chw.transpose(1, 2, 0) + 1)
        df.close()


@pytest.mark.parametrize("value, match", [
    (b"\xff\xff\xff", "not a caffe.Datum"),
    (_datum(3, 4, 5, bytes(10)), "holds 10 values"),
    (_datum(1, 1, 1, b"\xff\xd8", encoded=True), "encoded"),
])
def test_caffe_lmdb_bad_record_names_file_and_key(tmp_path, value, match):
    path = str(tmp_path / "caffe.lmdb")
    _caffe_db(path, {b"good": _datum(1, 1, 2, b"ab"), b"zbad": value})
    df = CaffeLMDB(path, shuffle=False)
    df.reset_state()
    with pytest.raises(LMDBFormatError, match=rf"caffe.lmdb, record b'zbad'.*{match}"):
        list(df)
    df.close()


# -- pickle refusal --------------------------------------------------------------------------------
def test_allow_pickle_false_refuses_a_pickle_lmdb(tmp_path):
    path = str(tmp_path / "p.lmdb")
    LMDBSerializer.save(DataFromList([[1]], shuffle=False), path, format="pickle")
    with pytest.raises(codec.PickleRefusedError, match=r"p.lmdb.*allow_pickle=False"):
        LMDBSerializer.load(path, allow_pickle=False)
    assert load_all(path) == [[1]]                       # allowed by default, as tensorpack
    m = str(tmp_path / "m.lmdb")
    LMDBSerializer.save(DataFromList([[np.zeros(3)]], shuffle=False), m)
    assert load_all(m, allow_pickle=False)[0][0].shape == (3,)


def test_allow_pickle_false_refuses_a_pickle_record_among_msgpack(tmp_path):
    path = str(tmp_path / "m.lmdb")
    LMDBSerializer.save(DataFromList([[1], [2]], shuffle=False), path)
    env = lmdb.open(path, subdir=False)
    with env.begin(write=True) as txn:
        txn.put(b"00000001", pickle.dumps([2], protocol=5))
    env.close()
    df = LMDBSerializer.load(path, shuffle=False, allow_pickle=False)
    df.reset_state()
    with pytest.raises(codec.PickleRefusedError, match=r"m.lmdb, record b'00000001'"):
        list(df)
    df.close()


# -- bad input -------------------------------------------------------------------------------------
def test_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.lmdb"):
        LMDBSerializer.load(str(tmp_path / "nope.lmdb"))
    with pytest.raises(FileNotFoundError, match="nope.lmdb"):
        LMDBData(str(tmp_path / "nope.lmdb"))


def test_not_an_lmdb_file(tmp_path):
    path = tmp_path / "junk.lmdb"
    path.write_bytes(os.urandom(20000))
    with pytest.raises(LMDBFormatError, match="junk.lmdb"):
        LMDBSerializer.load(str(path))


def test_truncated_file(tmp_path):
    path = str(tmp_path / "t.lmdb")
    LMDBSerializer.save(DataFromList(datapoints(20, big=True), shuffle=False), path)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(LMDBFormatError, match="t.lmdb.*truncated"):
        LMDBSerializer.load(path)


def _damaged_small_record_file(tmp_path, damage):
    """An LMDB of 600 small records, with the leaf page that holds record 300 damaged by
    ``damage(page_bytes)`` (a bytearray of that page, changed in place)."""
    path = str(tmp_path / "d.lmdb")
    LMDBSerializer.save(DataFromList([[i, np.full(16, i, np.float32)] for i in range(600)],
                                     shuffle=False), path)
    data = bytearray(open(path, "rb").read())
    start = data.find(b"00000300") // 4096 * 4096
    page = data[start:start + 4096]
    damage(page)
    data[start:start + 4096] = page
    open(path, "wb").write(data)
    return path


_READ_IN_ORDER = """
import sys
from dataflow import LMDBData, LMDBSerializer
from dataflow.formats.lmdb import LMDBFormatError
ds = (LMDBSerializer.load if sys.argv[2] == "decoded" else LMDBData)(sys.argv[1], shuffle=False)
ds.reset_state()
try:
    print(sum(1 for _ in ds), "of", len(ds))
except LMDBFormatError as e:
    print("LMDBFormatError:", e)
"""


@pytest.mark.parametrize("reader", ["decoded", "raw"])
def test_a_zeroed_leaf_page_raises_instead_of_aborting(tmp_path, reader):
    # liblmdb's cursor asserts that the page a branch points to is a leaf: a failed assertion
    # aborted the interpreter. The tree is checked before the cursor walks it. (A child
    # process: on the old code the read kills its interpreter.)
    import subprocess
    import sys

    def zero(page):
        page[:] = bytes(len(page))
    path = _damaged_small_record_file(tmp_path, zero)
    out = subprocess.run([sys.executable, "-c", _READ_IN_ORDER, path, reader],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.startswith("LMDBFormatError: LMDB " + path)
    assert "not the leaf page the tree points to" in out.stdout


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_leaf_page_listing_fewer_records_raises(tmp_path, shuffle):
    # the page's header lists 4 records fewer: an ordered pass yielded 596 of 600 silently
    def fewer(page):
        lower = int.from_bytes(page[12:14], "little")
        page[12:14] = (lower - 8).to_bytes(2, "little")
    path = _damaged_small_record_file(tmp_path, fewer)
    df = LMDBSerializer.load(path, shuffle=shuffle)
    df.reset_state()
    try:
        with pytest.raises(LMDBFormatError, match="d.lmdb"):
            list(df)
    finally:
        df.close()


def test_a_damaged_root_page_raises_naming_the_file_when_opened(tmp_path):
    # py-lmdb's CursorFullError / CorruptedError from the constructor's first reads used to
    # pass through bare
    path = str(tmp_path / "r.lmdb")
    LMDBSerializer.save(DataFromList(datapoints(20), shuffle=False), path)
    data = bytearray(open(path, "rb").read())
    failed = 0
    for start in range(2 * 4096, len(data), 4096):         # every page after the two metas
        damaged = bytearray(data)
        damaged[start + 10] ^= 0xFF                          # its flags
        open(path, "wb").write(damaged)
        try:
            LMDBData(path, shuffle=True)
        except LMDBFormatError as e:
            assert "r.lmdb" in str(e)
            failed += 1
    assert failed


def test_record_that_does_not_decode_names_file_and_record(tmp_path):
    path = str(tmp_path / "c.lmdb")
    LMDBSerializer.save(DataFromList([[1], [2], [3]], shuffle=False), path)
    env = lmdb.open(path, subdir=False)
    with env.begin(write=True) as txn:
        txn.put(b"00000001", b"\x92\xc1\xc1")
    env.close()
    df = LMDBSerializer.load(path, shuffle=False)
    df.reset_state()
    with pytest.raises(codec.DecodeError, match=r"c.lmdb, record b'00000001'"):
        list(df)
    df.close()


def test_runs_of_small_records_of_one_layout_and_the_runs_around_them(tmp_path):
    # ints 0..999 take 1, 2 or 3 bytes, so some runs of 256 values mix lengths (and the last
    # holds __keys__): those are decoded one by one, the others column by column
    dps = [[i, np.full(4, i, np.float32)] for i in range(1000)]
    path = str(tmp_path / "t.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path)
    got = load_all(path)
    assert_same(got, dps)
    assert all(type(dp) is list and type(dp[0]) is int and not dp[1].flags.writeable
               for dp in got)


@pytest.mark.parametrize("odd", ["a large value", "varied small values"])
def test_sequential_pass_over_records_not_of_one_layout(tmp_path, odd):
    # runs of 256 that are not one layout: after one with a large value, or after two in a
    # row, the rest of the pass is read record by record
    dps = [[i, np.full(4, i % 7, np.float32)] for i in range(256, 1500)]
    if odd == "a large value":
        dps[5] = [5, np.zeros(20_000, np.uint8)]
    else:
        for i in range(0, 700):
            dps[i] = [i, "s" * (i % 13)]
    path = str(tmp_path / "t.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path)
    assert_same(load_all(path), dps)


def test_bad_record_among_small_records_of_one_length_names_it(tmp_path):
    path = str(tmp_path / "t.lmdb")
    LMDBSerializer.save(DataFromList([[i, np.zeros(4, np.float32)] for i in range(256, 1000)],
                                     shuffle=False), path)
    env = lmdb.open(path, subdir=False)
    with env.begin(write=True) as txn:
        v = txn.get(b"00000100")
        txn.put(b"00000100", b"\xc1" + v[1:])      # same length, not msgpack
    env.close()
    df = LMDBSerializer.load(path, shuffle=False)
    df.reset_state()
    it = iter(df)
    assert [next(it)[0] for _ in range(100)] == list(range(256, 356))   # the ones before it
    with pytest.raises(codec.DecodeError, match=r"t.lmdb, record b'00000100'"):
        next(it)
    df.close()


def test_corrupted_array_record_names_file_and_record(tmp_path):
    path = str(tmp_path / "c.lmdb")
    LMDBSerializer.save(DataFromList(datapoints(3, big=True), shuffle=False), path)
    env = lmdb.open(path, subdir=False)
    with env.begin(write=True) as txn:
        v = txn.get(b"00000002")
        txn.put(b"00000002", v[:-100])          # the array data is cut short
    env.close()
    df = LMDBSerializer.load(path, shuffle=False)
    df.reset_state()
    it = iter(df)
    next(it), next(it)
    with pytest.raises(codec.DecodeError, match=r"c.lmdb, record b'00000002'.*truncated"):
        next(it)
    df.close()


def test_bad_keys_record(tmp_path):
    path = str(tmp_path / "k.lmdb")
    LMDBSerializer.save(DataFromList([[1]], shuffle=False), path)
    env = lmdb.open(path, subdir=False)
    with env.begin(write=True) as txn:
        txn.put(b"__keys__", msgpack.packb({"not": "a list"}))
    env.close()
    with pytest.raises(LMDBFormatError, match=r"k.lmdb, record b'__keys__'.*list of keys"):
        LMDBSerializer.load(path)


def test_missing_record_under_shuffle(tmp_path):
    path = str(tmp_path / "x.lmdb")
    LMDBSerializer.save(DataFromList([[1], [2]], shuffle=False), path)
    env = lmdb.open(path, subdir=False)
    with env.begin(write=True) as txn:
        txn.delete(b"00000001")
    env.close()
    df = LMDBSerializer.load(path)
    df.reset_state()
    with pytest.raises(LMDBFormatError, match=r"x.lmdb, record b'00000001': no such record"):
        list(df)
    df.close()


# -- saving: the map grows ------------------------------------------------------------------------
def _count_replays(monkeypatch, lmdb_module):
    replays = []
    real_grow = lmdb_module._grow_and_replay

    def grow(env, txn, pending, lmdb, format):
        replays.append(len(pending))
        return real_grow(env, txn, pending, lmdb, format)
    monkeypatch.setattr(lmdb_module, "_grow_and_replay", grow)
    return replays


def test_map_grows_ahead_and_no_datapoint_is_lost(tmp_path, monkeypatch):
    import dataflow.formats.lmdb as lmdb_module
    monkeypatch.setattr(lmdb_module, "_WRITE_MAP_SIZE", 1 << 16)     # 64 KiB: full at once
    monkeypatch.setattr(lmdb_module, "_PENDING_BYTES", 100_000)      # grow several times
    replays = _count_replays(monkeypatch, lmdb_module)
    dps = datapoints(30, big=True)                                    # about 1.2 MB
    path = str(tmp_path / "g.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path, write_frequency=7)
    assert replays == []               # grown before a transaction could fill the map
    assert_same(load_all(path), dps)


def test_when_the_estimate_falls_short_the_fallback_loses_nothing(tmp_path, monkeypatch):
    # the map fills at a put or at a commit: abort, grow, put the transaction's datapoints again
    import dataflow.formats.lmdb as lmdb_module
    monkeypatch.setattr(lmdb_module, "_WRITE_MAP_SIZE", 1 << 16)
    monkeypatch.setattr(lmdb_module, "_PAGES_PER_VALUE", -1000)      # a bound far too low
    monkeypatch.setattr(lmdb_module, "_MARGIN_PAGES", 0)
    replays = _count_replays(monkeypatch, lmdb_module)
    dps = datapoints(30, big=True)
    path = str(tmp_path / "f.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path, write_frequency=7)
    assert replays and max(replays) > 1
    assert_same(load_all(path), dps)


def test_a_source_that_reuses_its_array_is_saved_as_yielded_while_the_map_grows(
        tmp_path, monkeypatch):
    # a full map aborts the transaction; putting its datapoints again re-encoded them, and a
    # source that changes one buffer in place then had every uncommitted record written as its
    # latest value. The map now grows between transactions, so nothing is encoded twice.
    import dataflow.formats.lmdb as lmdb_module
    monkeypatch.setattr(lmdb_module, "_WRITE_MAP_SIZE", 1 << 16)
    monkeypatch.setattr(lmdb_module, "_PENDING_BYTES", 100_000)
    replays = _count_replays(monkeypatch, lmdb_module)
    buf = np.zeros(20_000, np.uint8)

    def reused():
        for i in range(40):
            buf[:] = i                 # the same array, changed in place
            yield [buf, i]
    path = str(tmp_path / "r.lmdb")
    LMDBSerializer.save(dataflow.DataFromGenerator(reused), path, write_frequency=1000)
    assert replays == []
    got = load_all(path)
    assert [int(dp[1]) for dp in got] == list(range(40))
    assert all(np.all(dp[0] == i) for i, dp in enumerate(got))


def test_save_flushes_in_a_thread_that_ends_with_it_also_on_an_error(tmp_path):
    import threading

    def writeback_threads():
        return [t for t in threading.enumerate() if t.name == "dataflow-lmdb-writeback"]
    dps = datapoints(30, big=True)
    path = str(tmp_path / "t.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path, write_frequency=5)
    assert writeback_threads() == []
    assert_same(load_all(path), dps)

    def failing():
        yield from dps[:12]
        raise OSError("the source broke")
    with pytest.raises(OSError, match="the source broke"):
        LMDBSerializer.save(dataflow.DataFromGenerator(failing), str(tmp_path / "u.lmdb"),
                            write_frequency=5)
    assert writeback_threads() == []
    assert sorted(os.listdir(tmp_path)) == ["t.lmdb", "t.lmdb-lock"]   # nothing half-written


def test_saved_file_is_its_pages_not_the_write_map(tmp_path):
    # the writer's map (MDB_WRITEMAP) sizes the file while it is written; the saved file is cut
    # to the pages LMDB used, and reads back with and without the cut
    dps = datapoints(30, big=True)
    path = str(tmp_path / "w.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path)
    env = lmdb.open(path, subdir=False, readonly=True, lock=False)
    try:
        used = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    finally:
        env.close()
    assert os.path.getsize(path) == used
    assert used < 4 << 20
    assert_same(load_all(path), dps)
    assert sorted(os.listdir(tmp_path)) == ["w.lmdb", "w.lmdb-lock"]


# -- the page scan of sequential reads (dataflow/formats/_lmdbscan.py) ------------------------------
def _many_big(tmp_path, n=400):
    rng = np.random.RandomState(5)
    dps = [[rng.randint(0, 256, 17_000 + i).astype("uint8"), i] for i in range(n)]
    path = str(tmp_path / "s.lmdb")
    LMDBSerializer.save(DataFromList(dps, shuffle=False), path)
    return path, dps


def test_scan_sees_what_the_cursor_sees(tmp_path):
    from dataflow.formats.lmdb import _Env
    path, dps = _many_big(tmp_path)
    env = _Env.acquire(path)
    try:
        assert env.env.stat()["depth"] >= 2          # branch pages, not just a root leaf
        scan = env.scan()
        assert scan is not None
        with env.env.begin() as txn:
            want = [(bytes(k), bytes(v)) for k, v in txn.cursor()]
        assert [(bytes(k), bytes(v)) for k, v in scan] == want
    finally:
        env.release()
    assert_same(load_all(path), dps)


def test_scan_of_a_corrupt_page_names_the_file(tmp_path):
    from dataflow.formats import _lmdbscan
    path, _ = _many_big(tmp_path)
    with open(path, "r+b") as f:
        blob = f.read(8192)
        meta = max((_lmdbscan._read_meta(memoryview(blob), off) for off in (0, 4096)),
                   key=lambda m: m["txnid"])
        f.seek(meta["root"] * 4096)
        f.write(b"\xff" * 8)                     # the root page no longer says who it is
    df = LMDBSerializer.load(path, shuffle=False)
    df.reset_state()
    with pytest.raises(LMDBFormatError, match=rf"s.lmdb: ScanError: page {meta['root']} is not"):
        list(df)
    df.close()


def test_missing_lmdb_names_the_extra(tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "lmdb", None)          # "import lmdb" now fails
    for make in (lambda: LMDBData(str(tmp_path / "x.lmdb")),
                 lambda: LMDBSerializer.load(str(tmp_path / "x.lmdb")),
                 lambda: LMDBSerializer.save(DataFromList([[1]]), str(tmp_path / "x.lmdb")),
                 lambda: CaffeLMDB(str(tmp_path / "x.lmdb"))):
        with pytest.raises(ImportError, match=r"needs lmdb: pip install 'dataflow-rt\[formats\]'"):
            make()


# -- checkpoint and resume (issue 18) ------------------------------------------------------------
@pytest.mark.parametrize("shuffle", [False, True])
def test_lmdb_reads_resume_exactly_at_every_step(tmp_path, shuffle):
    """A state taken after any number of datapoints (within a pass, after its last datapoint,
    in the next pass) resumes so that consumed + resumed equals the uninterrupted stream."""
    import json
    import dataflow as D
    n = 12
    path = str(tmp_path / "ck.lmdb")
    D.LMDBSerializer.save(D.DataFromList([[k, np.full(3, k)] for k in range(n)],
                                         shuffle=False), path)

    def build():
        D.set_seed(7)
        df = D.LMDBSerializer.load(path, shuffle=shuffle)
        return df

    df = build()
    df.reset_state()
    ref = [int(dp[0]) for _ in range(3) for dp in df]
    df.close()
    assert sorted(ref[:n]) == list(range(n)) and (ref[:n] == list(range(n))) != shuffle
    for cut in range(0, 2 * n + 1):
        df = build()
        df.reset_state()
        got, it = [], iter(df)
        for _ in range(cut):
            dp = next(it, None)
            if dp is None:                  # the pass ended: the loop starts the next one
                it = iter(df)
                dp = next(it)
            got.append(int(dp[0]))
        state = json.loads(json.dumps(df.state_dict()))
        df.close()
        df = build()
        df.load_state_dict(state)
        df.reset_state()
        for _ in range(2):                  # the rest of the interrupted pass, then the next
            got += [int(dp[0]) for dp in df]
        df.close()
        end = max(n, ((cut - 1) // n + 1) * n)   # where the interrupted pass ends
        assert got == ref[:end + n], cut
    D.set_seed(None)


def test_lmdb_state_of_another_shuffle_setting_is_refused(tmp_path):
    import dataflow as D
    path = str(tmp_path / "ck.lmdb")
    D.LMDBSerializer.save(D.DataFromList([[k] for k in range(5)], shuffle=False), path)
    a = D.LMDBSerializer.load(path, shuffle=False)
    a.reset_state()
    state = a.state_dict()
    b = D.LMDBSerializer.load(path, shuffle=True)
    with pytest.raises(ValueError, match="shuffle"):
        b.load_state_dict(state)
    a.close()
    b.close()


@pytest.mark.parametrize("make, error, match", [
    # a string flag was taken by its truth: allow_pickle="False" unpickled (code named in a
    # file ran), shuffle="False" shuffled
    (lambda p: LMDBSerializer.load(p, allow_pickle="False"), TypeError,
     "LMDBData: allow_pickle must be True or False, got 'False'"),
    (lambda p: LMDBData(p, shuffle="False"), TypeError, "LMDBData: shuffle must be True or False"),
    # int keys became b'\x00'-style keys and every record [key, None]
    (lambda p: LMDBData(p, keys=[1, 2]), TypeError, "keys must be a list of keys"),
    (lambda p: LMDBData(p, keys="{}{}"), ValueError, "keys '{}{}' is no format string of one "
                                                     "number"),
    (lambda p: LMDBSerializer.save(DataFromList([[1]]), p + "2", write_frequency=1.5),
     ValueError, "LMDBSerializer.save: write_frequency must be a positive int, got 1.5"),
])
def test_bad_arguments_are_refused_naming_them(tmp_path, make, error, match):
    path = str(tmp_path / "a.lmdb")
    LMDBSerializer.save(DataFromList([[i] for i in range(3)], shuffle=False), path)
    with pytest.raises(error, match=match):
        make(path)
    assert len(LMDBData(path, keys=[b"00000000", "00000001"])) == 2     # bytes and str keys
