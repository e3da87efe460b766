"""TFRecordSerializer: standard framing (checked with an independent CRC32C), round trips,
repeated passes, len(), and bad input."""
import os
import struct

import msgpack_numpy
import numpy as np
import pytest

from dataflow import DataFromList, TFRecordSerializer
from dataflow.formats import codec
from dataflow.formats.tfrecord import TFRecordError


def _crc32c_bitwise(data):
    """CRC32C (Castagnoli, reflected polynomial 0x82F63B78), one bit at a time."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _masked(data):
    crc = _crc32c_bitwise(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def frames(blob):
    """The payloads of a TFRecord file, parsed and checked independently of the library."""
    out, pos = [], 0
    while pos < len(blob):
        (n,), (lcrc,) = struct.unpack_from("<Q", blob, pos), struct.unpack_from("<I", blob, pos + 8)
        assert lcrc == _masked(blob[pos:pos + 8])
        data = blob[pos + 12:pos + 12 + n]
        assert struct.unpack_from("<I", blob, pos + 12 + n)[0] == _masked(data)
        out.append(data)
        pos += 16 + n
    return out


def write_frames(path, payloads):
    with open(path, "wb") as f:
        for p in payloads:
            head = struct.pack("<Q", len(p))
            f.write(head + struct.pack("<I", _masked(head)) + p + struct.pack("<I", _masked(p)))


def datapoints(n=8):
    rng = np.random.RandomState(1)
    return [[rng.rand(4, 3).astype("float32"), i, "x%d" % i,
             rng.randint(0, 256, 20_000 if i % 2 else 10).astype("uint8")] for i in range(n)]


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for x, y in zip(g, w):
            if isinstance(y, np.ndarray):
                assert x.dtype == y.dtype
                np.testing.assert_array_equal(x, y)
            else:
                assert x == y and type(x) is type(y)


def test_crc32c_reference_value():
    # the check value of CRC-32C ("123456789" -> 0xE3069283) for the independent implementation
    assert _crc32c_bitwise(b"123456789") == 0xE3069283


@pytest.mark.parametrize("fmt", ["msgpack", "pickle"])
def test_framing_and_payload(tmp_path, fmt):
    dps = datapoints(5)
    path = str(tmp_path / "x.tfrecord")
    TFRecordSerializer.save(DataFromList(dps, shuffle=False), path, format=fmt)
    payloads = frames(open(path, "rb").read())
    assert len(payloads) == 5
    for p, dp in zip(payloads, dps):
        if fmt == "msgpack":
            assert p == msgpack_numpy.packb(dp, use_bin_type=True)
        else:
            assert p[:2] == b"\x80\x05"
        assert_same([codec.loads(p)], [dp])


@pytest.mark.parametrize("fmt", ["msgpack", "pickle"])
def test_round_trip_many_passes(tmp_path, fmt):
    dps = datapoints(8)
    path = str(tmp_path / "x.tfrecord")
    TFRecordSerializer.save(DataFromList(dps, shuffle=False), path, format=fmt)
    df = TFRecordSerializer.load(path)
    df.reset_state()
    for _ in range(3):                       # tensorpack 0.11's reader is single-pass
        assert_same(list(iter(df)), dps)
    with pytest.raises(NotImplementedError, match="size="):
        len(df)


def test_size_gives_len_and_fixed_passes(tmp_path):
    path = str(tmp_path / "x.tfrecord")
    TFRecordSerializer.save(DataFromList([[i] for i in range(5)], shuffle=False), path)
    df = TFRecordSerializer.load(path, size=5)
    df.reset_state()
    assert len(df) == 5
    assert [list(df) for _ in range(3)] == [[[i] for i in range(5)]] * 3
    df = TFRecordSerializer.load(path, size=3)
    df.reset_state()
    assert [[dp[0] for dp in df] for _ in range(3)] == [[0, 1, 2], [3, 4, 0], [1, 2, 3]]


def test_reads_independently_framed_file(tmp_path):
    dps = datapoints(4)
    path = str(tmp_path / "ext.tfrecord")
    write_frames(path, [msgpack_numpy.packb(dp, use_bin_type=True) for dp in dps])
    df = TFRecordSerializer.load(path)
    df.reset_state()
    got = list(df)          # len() is unknown, and raises a TypeError too, as list() needs
    assert_same(got, dps)
    assert not got[1][3].flags.writeable        # msgpack arrays are read-only, as tensorpack's


def test_empty(tmp_path):
    path = str(tmp_path / "e.tfrecord")
    TFRecordSerializer.save(DataFromList([], shuffle=False), path)
    assert os.path.getsize(path) == 0
    df = TFRecordSerializer.load(path)
    df.reset_state()
    assert list(iter(df)) == []
    df = TFRecordSerializer.load(path, size=3)      # passes of 3 from a file with none
    df.reset_state()
    with pytest.raises(ValueError, match=f"TFRecordData \\(file {path}\\) produced no datapoint"):
        list(df)


def test_save_replaces_atomically_and_leaves_nothing_on_error(tmp_path):
    path = str(tmp_path / "x.tfrecord")
    TFRecordSerializer.save(DataFromList([[1]], shuffle=False), path)
    before = open(path, "rb").read()
    with pytest.raises(TypeError, match=r"datapoint 1 \(a list\).*msgpack.*object.*format=.pickle."):
        TFRecordSerializer.save(DataFromList([[1], [object()]], shuffle=False), path)
    assert open(path, "rb").read() == before          # the old file is untouched
    assert os.listdir(tmp_path) == ["x.tfrecord"]
    with pytest.raises(TypeError, match="DataFlow"):
        TFRecordSerializer.save([[1]], path)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.tfrecord"):
        TFRecordSerializer.load(str(tmp_path / "nope.tfrecord"))


def _saved(tmp_path, n=4):
    path = str(tmp_path / "x.tfrecord")
    TFRecordSerializer.save(DataFromList([[i, np.arange(i + 1)] for i in range(n)],
                                         shuffle=False), path)
    return path, bytearray(open(path, "rb").read())


def _expect(path, blob, match, good=0):
    with open(path, "wb") as f:
        f.write(blob)
    df = TFRecordSerializer.load(path)
    df.reset_state()
    it = iter(df)
    for _ in range(good):
        next(it)
    with pytest.raises(TFRecordError, match=match):
        next(it)


def test_data_crc_mismatch_names_file_and_record(tmp_path):
    path, blob = _saved(tmp_path)
    rec2 = sum(16 + len(p) for p in frames(bytes(blob))[:2])
    blob[rec2 + 14] ^= 0xFF
    _expect(path, blob, rf"x.tfrecord, record 2 \(byte offset {rec2}\).*CRC of the data", 2)


def test_length_crc_mismatch(tmp_path):
    path, blob = _saved(tmp_path)
    blob[0] ^= 0x01
    _expect(path, blob, r"x.tfrecord, record 0 \(byte offset 0\).*CRC of the length")


@pytest.mark.parametrize("where", ["crc", "data", "header"])
def test_truncated_file(tmp_path, where):
    path, blob = _saved(tmp_path)
    n_last = len(frames(bytes(blob))[-1])
    cut = {"crc": 2, "data": 4 + n_last // 2, "header": 4 + n_last + 5}[where]
    _expect(path, blob[:-cut], r"x.tfrecord, record 3 .*truncated", 3)


def test_not_a_tfrecord_file(tmp_path):
    path = str(tmp_path / "x.tfrecord")
    _expect(path, os.urandom(100), r"x.tfrecord, record 0.*(CRC|truncated)")


def test_record_that_does_not_decode(tmp_path):
    path = str(tmp_path / "x.tfrecord")
    write_frames(path, [msgpack_numpy.packb([1]), b"\x93\xc1"])
    df = TFRecordSerializer.load(path)
    df.reset_state()
    it = iter(df)
    assert next(it) == [1]
    with pytest.raises(codec.DecodeError, match=r"x.tfrecord, record 1"):
        next(it)


def test_allow_pickle_false(tmp_path):
    path = str(tmp_path / "p.tfrecord")
    TFRecordSerializer.save(DataFromList([[1]], shuffle=False), path, format="pickle")
    df = TFRecordSerializer.load(path, allow_pickle=False)
    df.reset_state()
    with pytest.raises(codec.PickleRefusedError, match=r"p.tfrecord, record 0.*allow_pickle"):
        list(iter(df))


def test_missing_crc32c_names_the_extra(tmp_path, monkeypatch):
    import sys
    path = str(tmp_path / "x.tfrecord")
    TFRecordSerializer.save(DataFromList([[1]], shuffle=False), path)
    monkeypatch.setitem(sys.modules, "crc32c", None)
    with pytest.raises(ImportError, match=r"needs crc32c: pip install 'dataflow-rt\[formats\]'"):
        TFRecordSerializer.load(path)
    with pytest.raises(ImportError, match=r"needs crc32c: pip install 'dataflow-rt\[formats\]'"):
        TFRecordSerializer.save(DataFromList([[1]]), path)


def test_import_dataflow_imports_no_optional_dependency():
    import subprocess
    import sys
    code = ("import sys, dataflow, dataflow.formats; "
            "print(sorted(m for m in ('lmdb', 'crc32c', 'h5py', 'sklearn') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("size", [None, 5, 11])
def test_tfrecord_reads_resume_exactly(tmp_path, size):
    """Checkpoint (issue 18): a state taken mid-pass resumes at the next record (seeking to its
    byte offset), with or without ``size``."""
    import json
    import dataflow as D
    path = str(tmp_path / "ck.tfrecord")
    D.TFRecordSerializer.save(D.DataFromList([[k, np.full(k, k)] for k in range(8)],
                                             shuffle=False), path)

    def build():
        df = D.TFRecordSerializer.load(path, size=size)
        df.reset_state()
        return df

    df = build()
    ref = [int(dp[0]) for _ in range(2) for dp in df]
    for cut in (1, 3):
        df = build()
        it = iter(df)
        got = [int(next(it)[0]) for _ in range(cut)]
        state = json.loads(json.dumps(df.state_dict()))
        df = build()
        df.load_state_dict(state)
        got += [int(dp[0]) for _ in range(2) for dp in df]
        assert got == ref, (cut, got, ref)


def test_a_directory_is_named_as_one(tmp_path):
    # it said the file "does not exist"
    with pytest.raises(IsADirectoryError, match="is a directory"):
        TFRecordSerializer.load(str(tmp_path))
