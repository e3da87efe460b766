"""``msgpack_numpy.patch()`` (which ``import tensorpack.dataflow`` calls) must not change what
this library writes or reads: a training script may import tensorpack for its models beside us.

The patch comes before this library's import (a fresh interpreter that imports tensorpack first)
or after it (here, through ``monkeypatch``, undone after the test; tensorpack itself is imported
in subprocesses only, see ``_tensorpack.py``)."""
import json
import os
import subprocess
import sys
import textwrap

import msgpack
import numpy as np
import pytest

import dataflow as D
from dataflow import serialize
from dataflow.formats import codec
from dataflow.parallel import transport

msgpack_numpy = pytest.importorskip("msgpack_numpy")

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


def test_tensorpack_imported_first_changes_nothing():
    """A fresh interpreter imports tensorpack.dataflow (which patches msgpack), then this
    library: the same bytes as here, object arrays refused, and spawned workers (which never
    imported tensorpack) get the consumer's arrays."""
    expected = {"serialize": serialize.dumps(VALUE).hex(), "codec": codec.dumps(VALUE).hex()}
    code = textwrap.dedent("""
        import json, sys
        import numpy as np
        np.object = object                  # tensorpack 0.11 still uses it
        import msgpack, msgpack_numpy
        import tensorpack.dataflow          # noqa: F401  (patches msgpack)
        assert msgpack.packb is msgpack_numpy.packb
        import dataflow as D
        from dataflow import serialize
        from dataflow.formats import codec
        from tests.test_msgpack_numpy_patch import VALUE, OBJECT_ARRAY, _double
        got = {"serialize": serialize.dumps(VALUE).hex(), "codec": codec.dumps(VALUE).hex()}
        try:
            codec.loads(codec.dumps(OBJECT_ARRAY), allow_pickle=False)
            got["refused"] = False
        except codec.PickleRefusedError:
            got["refused"] = True
        src = D.DataFromList([[np.full(4, k, np.float32)] for k in range(6)], shuffle=False)
        with D.MultiProcessMapData(src, 2, _double, strict=True, start_method="spawn") as df:
            df.reset_state()
            got["mapped"] = sorted(float(dp[0][0]) for dp in df)
        print(json.dumps(got))
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONWARNINGS="ignore", TENSORPACK_SERIALIZE="msgpack")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True,
                          text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got.pop("refused") is True
    assert got.pop("mapped") == [2.0 * k for k in range(6)]
    assert got == expected
