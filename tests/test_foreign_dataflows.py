"""Dataflows of another library (tensorpack's, or any object with ``__iter__`` and
``reset_state``) as inputs of ours: a script migrated by changing its import may still get
tensorpack dataflows from a module or a package it did not change. Every one of our dataflows
that takes another used to call our checkpoint hooks on it (AttributeError: ``_abandon``)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import dataflow as D
from dataflow.base import ForeignDataFlow

pytestmark = [pytest.mark.timeout(60)]


class Foreign:
    """What tensorpack's DataFlow offers: ``__iter__``, ``__len__`` (``NotImplementedError``
    when unknown), ``reset_state``; and a ``close`` that counts its calls."""

    def __init__(self, n=10, known_length=True):
        self.n, self.known_length = n, known_length
        self.resets = self.closes = 0

    def reset_state(self):
        self.resets += 1

    def __iter__(self):
        for i in range(self.n):
            yield [i]

    def __len__(self):
        if not self.known_length:
            raise NotImplementedError("unknown")
        return self.n

    def close(self):
        self.closes += 1


def ours(n=10):
    return D.DataFromList([[i] for i in range(n)], shuffle=False)


def double(dp):
    return [dp[0] * 2]


PIPELINES = {
    "MapData": lambda s: D.MapData(s, double),
    "BatchData": lambda s: D.BatchData(s, 3, use_list=True),
    "RepeatedData": lambda s: D.RepeatedData(s, 2),
    "FixedSizeData": lambda s: D.FixedSizeData(s, 4),
    "MultiThreadMapData": lambda s: D.MultiThreadMapData(s, 2, double, strict=True),
    "MultiProcessMapData": lambda s: D.MultiProcessMapData(s, 2, double, strict=True),
    "MultiProcessRunnerZMQ": lambda s: D.MultiProcessRunnerZMQ(s, 1),
    "ConcatData": lambda s: D.ConcatData([s, s]),
}


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_a_foreign_source_flows_as_one_of_ours(no_leaks, name):
    make = PIPELINES[name]
    with make(ours()) as expected_df:
        expected_df.reset_state()
        expected = sorted(map(repr, expected_df))
    with make(Foreign()) as df:
        df.reset_state()
        got = sorted(map(repr, df))
        assert len(df) == len(expected_df)
    assert got == expected


def test_join_mix_and_choose_take_foreign_inputs_and_reset_a_shared_one_once():
    shared = Foreign(6)
    join = D.JoinData([shared, shared])
    join.reset_state()
    assert shared.resets == 1
    assert list(join) == [[i, i] for i in range(6)]
    mix = D.RandomMixData([Foreign(3), ours(2)])
    mix.reset_state()
    assert sorted(dp[0] for dp in mix) == [0, 0, 1, 1, 2]
    choose = D.RandomChooseData([(Foreign(3), 0.5), (ours(3), 0.5)])
    choose.reset_state()
    assert {dp[0] for dp in choose} <= {0, 1, 2}


def test_thread_runner_copies_from_a_factory_of_foreign_dataflows(no_leaks):
    with D.MultiThreadRunner(lambda: Foreign(5), 2, 2) as df:
        df.reset_state()
        assert len(df) == 5 and len(list(df)) == 5


def test_unknown_length_lists_and_close_reaches_the_foreign_object():
    src = Foreign(5, known_length=False)
    df = D.MapData(src, double)
    assert isinstance(df.ds, ForeignDataFlow) and df.ds.foreign is src
    assert D.ForeignDataFlow is ForeignDataFlow
    with pytest.raises(D.UnknownLengthError):
        len(df)
    df.reset_state()
    assert list(df) == [[2 * i] for i in range(5)]          # list() asks len() first
    df.close()
    assert src.closes == 1


def test_a_pipeline_over_a_foreign_source_checkpoints_by_replay():
    def pipeline():
        return D.BatchData(D.MapData(Foreign(10), double), 2)

    df = pipeline()
    df.reset_state()
    it = iter(df)
    next(it), next(it)
    with pytest.raises(NotImplementedError, match="replay=True"):
        df.state_dict()
    state = json.loads(json.dumps(df.state_dict(replay=True)))
    rest = [dp[0].tolist() for dp in it]
    resumed = pipeline()
    resumed.load_state_dict(state)
    resumed.reset_state()
    assert [dp[0].tolist() for dp in resumed] == rest == [[8, 10], [12, 14], [16, 18]]


@pytest.mark.parametrize("serializer", ["LMDBSerializer", "TFRecordSerializer",
                                        "NumpySerializer", "HDF5Serializer"])
def test_serializers_save_a_foreign_dataflow(tmp_path, serializer):
    # LMDB and TFRecord refused it ("df must be a DataFlow")
    from dataflow import serialize
    S = getattr(serialize, serializer)
    path = str(tmp_path / "data")
    args = (["a"],) if serializer == "HDF5Serializer" else ()
    S.save(Foreign(6), path, *args)
    df = S.load(path, *args) if serializer == "TFRecordSerializer" else \
        S.load(path, *args, shuffle=False)
    df.reset_state()
    assert [int(dp[0]) for dp in df] == list(range(6))


def test_statistics_name_the_foreign_class():
    df = D.MapData(Foreign(4), double)
    df.reset_state()
    list(df)
    assert "ForeignDataFlow(Foreign)" in D.format_stats(D.stats(df))


def test_a_script_that_imports_tensorpack_first():
    """In a fresh interpreter that imports tensorpack first (which patches msgpack, see
    test_msgpack_numpy_patch): our formats are the same bytes as here and object arrays are
    still refused; a user class derived from tensorpack's RNGDataFlow flows through our map
    with workers started by spawn (which ship it, and its arrays, to workers that never
    imported tensorpack), and tensorpack's own MapData through our thread map."""
    from dataflow import serialize
    from dataflow.formats import codec
    from .test_msgpack_numpy_patch import VALUE
    expected = {"serialize": serialize.dumps(VALUE).hex(), "codec": codec.dumps(VALUE).hex()}
    code = textwrap.dedent("""
        import json
        import numpy as np
        np.object = object                  # tensorpack 0.11 still uses it
        import msgpack, msgpack_numpy
        import tensorpack.dataflow as tp
        assert msgpack.packb is msgpack_numpy.packb     # patched
        import dataflow as D
        from dataflow import serialize
        from dataflow.formats import codec
        from tests.test_msgpack_numpy_patch import VALUE, OBJECT_ARRAY

        out = {"serialize": serialize.dumps(VALUE).hex(), "codec": codec.dumps(VALUE).hex()}
        try:
            codec.loads(codec.dumps(OBJECT_ARRAY), allow_pickle=False)
            out["refused"] = False
        except codec.PickleRefusedError:
            out["refused"] = True

        class Numbers(tp.RNGDataFlow):
            def __len__(self):
                return 12
            def __iter__(self):
                for i in range(12):
                    yield [i, np.full(3, i, np.float32)]

        def double(dp):
            return [dp[0] * 2, dp[1] * 2]

        with D.BatchData(D.MultiProcessMapData(Numbers(), 2, double, strict=True,
                                               start_method="spawn"), 4) as df:
            df.reset_state()
            batches = list(df)
        out["firsts"] = sorted(int(x) for b in batches for x in b[0])
        out["arrays"] = all(float(b[1][k][0]) == float(b[0][k]) for b in batches
                            for k in range(4))
        inner = tp.MapData(Numbers(), lambda dp: [dp[0] + 100])
        df = D.MultiThreadMapData(inner, 2, lambda dp: dp, strict=True)
        df.reset_state()
        out["tp_map"] = sorted(dp[0] for dp in df)
        df.close()
        print(json.dumps(out))
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONWARNINGS="ignore", TENSORPACK_SERIALIZE="msgpack")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          timeout=50, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out.pop("refused") is True
    assert out.pop("firsts") == [2 * i for i in range(12)]
    assert out.pop("arrays") is True
    assert out.pop("tp_map") == [100 + i for i in range(12)]
    assert out == expected
