"""Cross-reading with tensorpack 0.11 itself, both ways: the value codec, LMDB (both encodings,
file and directory paths) and TFRecord payloads. tensorpack runs in a subprocess, since it reads
TENSORPACK_SERIALIZE once at import (tests/_tensorpack.py)."""
import struct

import numpy as np
import pytest

from dataflow import DataFromList, LMDBSerializer, TFRecordSerializer
from dataflow.formats import codec

from ._tensorpack import run_tensorpack

# The datapoints both sides build: executed here and in the tensorpack subprocess.
GEN = """
import numpy as np
def make_datapoints(n=12):
    rng = np.random.RandomState(3)
    out = []
    for i in range(n):
        out.append([rng.randint(0, 256, 30000 if i % 3 == 0 else 50).astype('uint8'), i,
                    rng.rand(2, 3).astype('float32'), np.int64(i * 7), 'label%d' % i,
                    b'bytes%d' % i, [1.5, None, True], {'k': np.arange(4, dtype='>i2')}])
    return out

def same(a, b):
    if isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(b, (list, tuple)):
        return isinstance(a, (list, tuple)) and len(a) == len(b) and \\
            all(same(x, y) for x, y in zip(a, b))
    if isinstance(b, dict):
        return isinstance(a, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in b)
    return type(a) is type(b) and a == b
"""
_ns = {}
exec(GEN, _ns)
make_datapoints, same = _ns["make_datapoints"], _ns["same"]

def hex_lines(out):
    """The values a subprocess printed as 'HEX <hex>' lines (tensorpack prints other lines)."""
    return [bytes.fromhex(line[4:]) for line in out.splitlines() if line.startswith("HEX ")]


def last_line(out):
    return out.strip().splitlines()[-1].split()


MASKED_CRC = """
def masked_crc(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    crc ^= 0xFFFFFFFF
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF
"""


# -- the codec -------------------------------------------------------------------------------------
def test_msgpack_bytes_equal_tensorpacks():
    out = run_tensorpack(GEN + """
from tensorpack.utils.serialize import dumps
for dp in make_datapoints():
    print('HEX', dumps(dp).hex())
""", serialize="msgpack")
    theirs = hex_lines(out)
    ours = [codec.dumps(dp) for dp in make_datapoints()]
    assert theirs == ours


@pytest.mark.parametrize("serialize", ["pickle", "msgpack"])
def test_tensorpack_values_load_here(serialize):
    out = run_tensorpack(GEN + """
from tensorpack.utils.serialize import dumps
for dp in make_datapoints():
    print('HEX', dumps(dp).hex())
""", serialize=serialize)
    values = hex_lines(out)
    got = [codec.loads(v) for v in values]
    assert len(got) == len(make_datapoints())
    assert codec.sniff(values[0]) == serialize
    for g, dp in zip(got, make_datapoints()):
        assert same(g, dp)


# -- LMDB ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("serialize", ["pickle", "msgpack"])
@pytest.mark.parametrize("as_dir", [False, True])
def test_tensorpack_lmdb_loads_here(tmp_path, serialize, as_dir):
    path = tmp_path / "tp_db" if as_dir else tmp_path / "tp.lmdb"
    if as_dir:
        path.mkdir()
    run_tensorpack(GEN + f"""
from tensorpack.dataflow import DataFromList, LMDBSerializer
LMDBSerializer.save(DataFromList(make_datapoints(), shuffle=False), {str(path)!r})
""", serialize=serialize)
    df = LMDBSerializer.load(str(path), shuffle=False)
    df.reset_state()
    got = list(df)
    assert len(got) == len(make_datapoints())
    for g, dp in zip(got, make_datapoints()):
        assert same(g, dp)
    df.close()
    df = LMDBSerializer.load(str(path))          # shuffled, through tensorpack's __keys__
    df.reset_state()
    assert sorted(dp[1] for dp in df) == list(range(len(got)))
    df.close()


@pytest.mark.parametrize("serialize", ["pickle", "msgpack"])
def test_none_datapoints_are_dropped_as_tensorpack_drops_them(tmp_path, serialize):
    # tensorpack's load is MapData(reader, loads), which drops a None; they were yielded here
    dps = "[None, [1, b'x'], None, [2, b'y'], None]"
    path = tmp_path / "tp.lmdb"
    out = run_tensorpack(f"""
from tensorpack.dataflow import DataFromList, LMDBSerializer
LMDBSerializer.save(DataFromList({dps}, shuffle=False), {str(path)!r})
df = LMDBSerializer.load({str(path)!r}, shuffle=False)
df.reset_state()
print("GOT", len(df), [dp for dp in df])
""", serialize=serialize)
    want = [[1, b"x"], [2, b"y"]]
    assert out.strip().splitlines()[-1] == f"GOT 5 {want}"
    for shuffle in (False, True):
        df = LMDBSerializer.load(str(path), shuffle=shuffle)
        df.reset_state()
        assert len(df) == 5 and sorted(dp for dp in df) == want
        df.close()
    tfr = str(tmp_path / "ours.tfrecord")
    TFRecordSerializer.save(DataFromList(eval(dps), shuffle=False), tfr, format=serialize)
    df = TFRecordSerializer.load(tfr)
    df.reset_state()
    assert [dp for dp in df] == want


@pytest.mark.parametrize("fmt", ["pickle", "msgpack"])
@pytest.mark.parametrize("as_dir", [False, True])
def test_our_lmdb_loads_in_tensorpack(tmp_path, fmt, as_dir):
    path = tmp_path / "ours_db" if as_dir else tmp_path / "ours.lmdb"
    if as_dir:
        path.mkdir()
    LMDBSerializer.save(DataFromList(make_datapoints(), shuffle=False), str(path), format=fmt)
    out = run_tensorpack(GEN + f"""
from tensorpack.dataflow import LMDBSerializer
want = make_datapoints()
# one load per process: tensorpack 0.11 cannot open an LMDB twice in a process
df = LMDBSerializer.load({str(path)!r}, shuffle=True)    # random reads through __keys__
df.reset_state()
got = list(df)
assert sorted(dp[1] for dp in got) == list(range(len(want)))
assert all(same(g, want[g[1]]) for g in got)
print("OK", len(got))
""", serialize=fmt)
    assert last_line(out) == ["OK", str(len(make_datapoints()))]


# -- TFRecord (tensorpack's TFRecordSerializer needs TensorFlow: its payloads and the standard
# framing are produced and parsed here by tensorpack's codec and an independent framer) ---------
@pytest.mark.parametrize("serialize", ["pickle", "msgpack"])
def test_tensorpack_tfrecord_payloads_load_here(tmp_path, serialize):
    path = tmp_path / "tp.tfrecord"
    run_tensorpack(GEN + MASKED_CRC + f"""
import struct
from tensorpack.utils.serialize import dumps
with open({str(path)!r}, 'wb') as f:
    for dp in make_datapoints():
        data = dumps(dp)
        head = struct.pack('<Q', len(data))
        f.write(head + struct.pack('<I', masked_crc(head)) + data +
                struct.pack('<I', masked_crc(data)))
""", serialize=serialize)
    df = TFRecordSerializer.load(str(path), size=len(make_datapoints()))
    df.reset_state()
    for _ in range(2):
        got = list(df)
        assert len(got) == len(make_datapoints())
        assert all(same(g, w) for g, w in zip(got, make_datapoints()))


@pytest.mark.parametrize("fmt", ["pickle", "msgpack"])
def test_our_tfrecord_loads_with_tensorpacks_codec(tmp_path, fmt):
    path = tmp_path / "ours.tfrecord"
    TFRecordSerializer.save(DataFromList(make_datapoints(), shuffle=False), str(path),
                            format=fmt)
    out = run_tensorpack(GEN + MASKED_CRC + f"""
import struct
from tensorpack.utils.serialize import loads
blob = open({str(path)!r}, 'rb').read()
got, pos = [], 0
while pos < len(blob):
    n, = struct.unpack_from('<Q', blob, pos)
    assert struct.unpack_from('<I', blob, pos + 8)[0] == masked_crc(blob[pos:pos + 8])
    data = blob[pos + 12:pos + 12 + n]
    assert struct.unpack_from('<I', blob, pos + 12 + n)[0] == masked_crc(data)
    got.append(loads(data))
    pos += 16 + n
want = make_datapoints()
assert len(got) == len(want) and all(same(g, w) for g, w in zip(got, want))
print("OK")
""", serialize=fmt)
    assert last_line(out) == ["OK"]
