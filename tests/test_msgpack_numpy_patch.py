"""``msgpack_numpy.patch()`` (which ``import tensorpack.dataflow`` calls) must not change what
this library writes or reads: a training script may import tensorpack for its models beside us.

The patch comes after this library's import here (through ``monkeypatch``, undone after the
test; tensorpack itself is imported in subprocesses only, see ``_tensorpack.py``), and before it
in ``test_foreign_dataflows.test_a_script_that_imports_tensorpack_first``."""
import msgpack
import msgpack_numpy
import numpy as np
import pytest

import dataflow as D
from dataflow import serialize
from dataflow.formats import codec
from dataflow.parallel import transport

pytestmark = [pytest.mark.timeout(60)]

PATCHED = ("Packer", "Unpacker", "load", "loads", "dump", "dumps", "pack", "packb", "unpack",
           "unpackb")


def patch_like_msgpack_numpy(monkeypatch):
    for name in PATCHED:
        monkeypatch.setattr(msgpack, name, getattr(msgpack_numpy, name))
    assert msgpack.packb is msgpack_numpy.packb


VALUE = [np.arange(12, dtype=np.float32).reshape(3, 4), np.int64(7), {"k": np.uint8(3)},
         "text", 1.5, (1, 2)]
OBJECT_ARRAY = [np.array(["a", 1], dtype=object)]


def assert_same(a, b):
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    else:
        assert a == b


def test_our_formats_are_the_same_bytes_after_the_patch(monkeypatch):
    before = (serialize.dumps(VALUE), codec.dumps(VALUE), transport.encode_release([3, 4]))
    patch_like_msgpack_numpy(monkeypatch)
    after = (serialize.dumps(VALUE), codec.dumps(VALUE), transport.encode_release([3, 4]))
    assert after == before
    assert_same(serialize.loads(before[0]), serialize.loads(serialize.dumps(VALUE)))
    assert_same(codec.loads(before[1]), codec.loads(after[1]))


def test_readers_still_refuse_object_arrays_after_the_patch(monkeypatch):
    # msgpack-numpy's record of an object array holds a pickle; the patched unpackb unpickled it
    # before our hook could refuse it
    frame = codec.dumps(OBJECT_ARRAY)
    patch_like_msgpack_numpy(monkeypatch)
    with pytest.raises(codec.PickleRefusedError, match="object array"):
        codec.loads(frame, allow_pickle=False)
    # and a user's map that only looks like msgpack-numpy's record stays a map
    looks_like = msgpack_numpy.packb({b"nd": True, b"type": "<f4", b"kind": b"",
                                      b"shape": [1], b"data": b"\0\0\0\0", b"extra": 1})
    assert isinstance(codec.loads(looks_like), dict)


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_workers_that_never_imported_tensorpack_get_the_consumers_arrays(
        no_leaks, monkeypatch, start_method):
    # the consumer's patched Packer wrote arrays as msgpack-numpy maps, which the worker (not
    # patched) handed to the map function as dicts
    patch_like_msgpack_numpy(monkeypatch)
    src = D.DataFromList([[np.full(4, k, np.float32)] for k in range(6)], shuffle=False)
    with D.MultiProcessMapData(src, 2, _double, strict=True, start_method=start_method) as df:
        df.reset_state()
        out = sorted(float(dp[0][0]) for dp in df)
    assert out == [2.0 * k for k in range(6)]


def _double(dp):
    return [dp[0] * 2]

