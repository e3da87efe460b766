"""NumpySerializer, HDF5Serializer/HDF5Data and SVMLightData: round trips, tensorpack 0.11's
files both ways, and clear errors on bad input."""
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import dataflow as D
from tests._tensorpack import run_tensorpack


def datapoints(n=6):
    """tensorpack's serialize_test shape: [int label, float64 (28, 28, 3) image]."""
    rs = np.random.RandomState(0)
    return [[int(rs.randint(0, 10)), rs.randn(28, 28, 3)] for _ in range(n)]


def assert_same(expected, actual):
    actual = list(actual)
    assert len(actual) == len(expected)
    for e, a in zip(expected, actual):
        assert len(a) == len(e)
        assert a[0] == e[0]
        np.testing.assert_array_equal(a[1], e[1])


def loaded(df):
    df.reset_state()
    return list(df)


class Broken(D.DataFlow):
    """Yields two datapoints, then fails."""

    def __len__(self):
        return 5

    def __iter__(self):
        yield [1, np.zeros(3)]
        yield [2, np.zeros(3)]
        raise RuntimeError("source failed")


# ------------------------------------------------------------------------------- NumpySerializer

def test_numpy_round_trip_keeps_datapoints_and_order(tmp_path):
    dps = datapoints()
    D.NumpySerializer.save(D.DataFromList(dps, shuffle=False), str(tmp_path / "a.npz"))
    assert_same(dps, loaded(D.NumpySerializer.load(str(tmp_path / "a.npz"), shuffle=False)))


def test_numpy_save_appends_npz_and_load_finds_it(tmp_path):
    dps = datapoints(3)
    D.NumpySerializer.save(D.DataFromList(dps, shuffle=False), str(tmp_path / "a"))
    assert os.listdir(tmp_path) == ["a.npz"]
    assert_same(dps, loaded(D.NumpySerializer.load(str(tmp_path / "a"), shuffle=False)))


@pytest.mark.parametrize("dps", [
    [[np.ones((2, 3), "uint8"), np.zeros((2, 3), "uint8")]] * 3,      # numpy would make (3,2,2,3)
    [[np.ones((2, 3)), np.zeros((2, 4))]] * 3,                          # numpy raises
    [[1], [2, 3], {"a": 1}],                                            # ragged, dict
], ids=["equal-shapes", "different-shapes", "ragged"])
def test_numpy_keeps_component_types_that_numpy_inference_would_lose(tmp_path, dps):
    D.NumpySerializer.save(D.DataFromList(dps, shuffle=False), str(tmp_path / "a.npz"))
    out = loaded(D.NumpySerializer.load(str(tmp_path / "a.npz"), shuffle=False))
    assert len(out) == len(dps)
    for e, a in zip(dps, out):
        if isinstance(e, dict):
            assert a == e
            continue
        assert len(a) == len(e)
        for ce, ca in zip(e, a):
            np.testing.assert_array_equal(ca, ce)
            assert np.asarray(ca).dtype == np.asarray(ce).dtype


def test_numpy_load_shuffles_with_rng(tmp_path):
    dps = [[i] for i in range(50)]
    D.NumpySerializer.save(D.DataFromList(dps, shuffle=False), str(tmp_path / "a.npz"))
    df = D.NumpySerializer.load(str(tmp_path / "a.npz"))
    out = [dp[0] for dp in loaded(df)]
    assert sorted(out) == list(range(50)) and out != list(range(50))


def test_numpy_failing_source_leaves_no_file(tmp_path):
    with pytest.raises(RuntimeError, match="source failed"):
        D.NumpySerializer.save(Broken(), str(tmp_path / "a.npz"))
    assert os.listdir(tmp_path) == []


def test_numpy_unpicklable_datapoint_is_named(tmp_path):
    dps = [[1], [2], [lambda: 0]]
    with pytest.raises(TypeError, match=r"a\.npz: datapoint 2 cannot be saved"):
        D.NumpySerializer.save(D.DataFromList(dps, shuffle=False), str(tmp_path / "a.npz"))
    assert os.listdir(tmp_path) == []


def test_numpy_truncated_or_foreign_file_raises_naming_it(tmp_path):
    D.NumpySerializer.save(D.DataFromList(datapoints(), shuffle=False), str(tmp_path / "a.npz"))
    data = (tmp_path / "a.npz").read_bytes()
    (tmp_path / "t.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"t\.npz.*truncated or corrupted"):
        D.NumpySerializer.load(str(tmp_path / "t.npz"))
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(ValueError, match=r"other\.npz: no 'buffer' member"):
        D.NumpySerializer.load(str(tmp_path / "other.npz"))


def test_numpy_damaged_file_raises_value_error_naming_it(tmp_path):
    # whatever the damage (zlib, zipfile, numpy's header parser or the unpickler fail on it),
    # the error is a ValueError naming the file: it used to pass zlib.error, tokenize's
    # TokenError, MemoryError, OverflowError and NotImplementedError through bare
    path = tmp_path / "a.npz"
    D.NumpySerializer.save(D.DataFromList(datapoints(12), shuffle=False), str(path))
    pristine = path.read_bytes()
    damaged = []
    for start in range(0, len(pristine) - 64, 397):
        data = bytearray(pristine)
        data[start:start + 64] = bytes(64)
        damaged.append(bytes(data))
    data = bytearray(pristine)
    cd = data.rfind(b"PK\x01\x02")
    data[cd + 10:cd + 12] = (99).to_bytes(2, "little")      # an unknown compression method
    damaged.append(bytes(data))
    failed = 0
    for data in damaged:
        path.write_bytes(data)
        try:
            assert_same(datapoints(12), loaded(D.NumpySerializer.load(str(path), shuffle=False)))
        except ValueError as e:
            assert str(path) in str(e)
            failed += 1
    assert failed > len(damaged) // 2       # the zip's CRC and framing notice nearly all


def test_numpy_file_written_by_tensorpack_loads_here(tmp_path):
    run_tensorpack(f"""
        from tensorpack.dataflow import DataFromList, NumpySerializer
        rs = np.random.RandomState(0)
        dps = [[int(rs.randint(0, 10)), rs.randn(28, 28, 3)] for _ in range(6)]
        NumpySerializer.save(DataFromList(dps, shuffle=False), {str(tmp_path / 'tp.npz')!r})
    """)
    assert_same(datapoints(), loaded(D.NumpySerializer.load(str(tmp_path / "tp.npz"),
                                                            shuffle=False)))


def test_numpy_file_written_here_loads_in_tensorpack(tmp_path):
    dps = datapoints()
    D.NumpySerializer.save(D.DataFromList(dps, shuffle=False), str(tmp_path / "a.npz"))
    out = run_tensorpack(f"""
        import json
        from tensorpack.dataflow import NumpySerializer
        df = NumpySerializer.load({str(tmp_path / 'a.npz')!r}, shuffle=False)
        df.reset_state()
        print(json.dumps([[dp[0], dp[1].tolist()] for dp in df]))
    """)
    got = json.loads(out.strip().splitlines()[-1])
    assert [g[0] for g in got] == [d[0] for d in dps]
    for g, d in zip(got, dps):
        np.testing.assert_array_equal(np.array(g[1]), d[1])


# ------------------------------------------------------------------------------------- HDF5

def test_hdf5_round_trip_with_groups(tmp_path):
    import h5py
    dps = datapoints()
    path = str(tmp_path / "a.h5")
    D.HDF5Serializer.save(D.DataFromList(dps, shuffle=False), path, ["label", "grp/image"])
    with h5py.File(path, "r") as f:
        assert f["label"].shape == (6,) and f["label"].dtype == np.int64
        assert f["grp/image"].shape == (6, 28, 28, 3)
    out = loaded(D.HDF5Serializer.load(path, ["label", "grp/image"], shuffle=False))
    assert_same(dps, out)
    assert all(isinstance(dp[0], np.int64) for dp in out)     # numpy scalars, as tensorpack


def test_hdf5_data_shuffles_and_needs_reset_state(tmp_path):
    path = str(tmp_path / "a.h5")
    D.HDF5Serializer.save(D.DataFromList([[i] for i in range(40)], shuffle=False), path, ["x"])
    df = D.HDF5Data(path, ["x"])
    assert len(df) == 40
    with pytest.raises(RuntimeError, match="reset_state"):
        next(iter(df))
    out = [int(dp[0]) for dp in loaded(df)]
    assert sorted(out) == list(range(40)) and out != list(range(40))


def test_hdf5_data_paths_length_mismatch_names_datapoint(tmp_path):
    dps = [[1, np.zeros(2)], [2, np.zeros(2), 5]]
    with pytest.raises(ValueError, match=r"a\.h5: datapoint 1 has 3 components but data_paths "
                                         r"has 2"):
        D.HDF5Serializer.save(D.DataFromList(dps, shuffle=False), str(tmp_path / "a.h5"),
                              ["a", "b"])
    assert os.listdir(tmp_path) == []


def test_hdf5_save_refuses_dict_datapoints_and_a_string_of_paths(tmp_path):
    # a dict's keys were written in place of its values; a string was split into letters
    path = str(tmp_path / "d.h5")
    dicts = D.DataFromList([{"img": np.zeros(2), "label": 3}], shuffle=False)
    with pytest.raises(TypeError, match=r"datapoint 0 is a dict; HDF5Serializer.save writes "
                                        r"list, tuple or array datapoints"):
        D.HDF5Serializer.save(dicts, path, ["img", "label"])
    with pytest.raises(TypeError, match="data_paths must be a list of dataset names"):
        D.HDF5Serializer.save(D.DataFromList([[1]]), path, "img")
    # '' failed in h5py as "expected bytes, str found", a number as h5py's own TypeError
    with pytest.raises(ValueError, match="each of data_paths must name a dataset .* got ''"):
        D.HDF5Serializer.save(D.DataFromList([[1, 2]]), path, ["", "b"])
    with pytest.raises(TypeError, match="each of data_paths must name a dataset .* got 5"):
        D.HDF5Serializer.save(D.DataFromList([[1, 2]]), path, ["a", 5])
    assert not os.listdir(tmp_path)


def test_hdf5_unstackable_components_name_the_dataset(tmp_path):
    dps = [[np.zeros(2)], [np.zeros(3)]]
    with pytest.raises(ValueError, match=r"dataset 'img'.*datapoint 1 has shape \(3,\)"):
        D.HDF5Serializer.save(D.DataFromList(dps, shuffle=False), str(tmp_path / "a.h5"),
                              ["img"])
    assert os.listdir(tmp_path) == []


def test_hdf5_ragged_component_names_the_dataset(tmp_path):
    # np.shape of a ragged list raised numpy's bare "inhomogeneous shape" error
    dps = [[1, [2, (3, 4)]], [1, [2, (3, 4)]]]
    with pytest.raises(ValueError, match=r"dataset 'b'.*ragged list"):
        D.HDF5Serializer.save(D.DataFromList(dps, shuffle=False), str(tmp_path / "a.h5"),
                              ["a", "b"])
    assert os.listdir(tmp_path) == []


def test_hdf5_array_datapoint_rows_are_its_components_as_in_tensorpack(tmp_path):
    # tensorpack zips an array datapoint's rows with data_paths; it was refused here
    dps = [np.arange(6).reshape(2, 3) + i for i in range(3)]
    path = str(tmp_path / "a.h5")
    D.HDF5Serializer.save(D.DataFromList(dps, shuffle=False), path, ["x", "y"])
    got = loaded(D.HDF5Data(path, ["x", "y"], shuffle=False))
    assert len(got) == 3
    for g, d in zip(got, dps):
        assert g[0].dtype == d.dtype and g[0].shape == (3,)
        np.testing.assert_array_equal(g[0], d[0])
        np.testing.assert_array_equal(g[1], d[1])
    with pytest.raises(TypeError, match="datapoint 0 is a float32"):
        D.HDF5Serializer.save(D.DataFromList([np.float32(1)]), str(tmp_path / "b.h5"), ["x"])


def test_hdf5_failing_source_leaves_no_file(tmp_path):
    with pytest.raises(RuntimeError, match="source failed"):
        D.HDF5Serializer.save(Broken(), str(tmp_path / "a.h5"), ["a", "b"])
    assert os.listdir(tmp_path) == []


def test_hdf5_bad_files_raise_naming_file_and_dataset(tmp_path):
    import h5py
    path = str(tmp_path / "a.h5")
    D.HDF5Serializer.save(D.DataFromList(datapoints(), shuffle=False), path, ["label", "img"])
    with pytest.raises(KeyError, match=r"a\.h5: no dataset 'nope'"):
        D.HDF5Data(path, ["label", "nope"])
    data = open(path, "rb").read()
    (tmp_path / "t.h5").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"t\.h5: .*(not a readable HDF5|dataset 'img')"):
        D.HDF5Data(str(tmp_path / "t.h5"), ["label", "img"])
    with h5py.File(tmp_path / "u.h5", "w") as f:
        f["a"] = np.zeros(3)
        f["b"] = np.zeros(4)
    with pytest.raises(ValueError, match=r"u\.h5: .*equal lengths"):
        D.HDF5Data(str(tmp_path / "u.h5"), ["a", "b"])


def test_hdf5_damaged_headers_raise_naming_the_file(tmp_path):
    # h5py reports damaged object headers and heaps as KeyError or RuntimeError from opening a
    # dataset: they used to pass through bare (a KeyError read as "no such dataset")
    path = tmp_path / "a.h5"
    D.HDF5Serializer.save(D.DataFromList(datapoints(), shuffle=False), str(path), ["label", "img"])
    pristine = path.read_bytes()
    failed = 0
    for start in range(0, 2048, 31):
        data = bytearray(pristine)
        data[start] ^= 0xA5
        path.write_bytes(bytes(data))
        try:
            D.HDF5Data(str(path), ["label", "img"], shuffle=False)
        except (ValueError, KeyError) as e:
            assert str(path) in str(e)
            failed += 1
    assert failed > 0


def test_hdf5_file_written_by_tensorpack_loads_here(tmp_path):
    run_tensorpack(f"""
        from tensorpack.dataflow import DataFromList, HDF5Serializer
        rs = np.random.RandomState(0)
        dps = [[int(rs.randint(0, 10)), rs.randn(28, 28, 3)] for _ in range(6)]
        HDF5Serializer.save(DataFromList(dps, shuffle=False), {str(tmp_path / 'tp.h5')!r},
                            ['label', 'grp/image'])
    """)
    assert_same(datapoints(), loaded(D.HDF5Data(str(tmp_path / "tp.h5"),
                                                 ["label", "grp/image"], shuffle=False)))


def test_hdf5_file_written_here_loads_in_tensorpack(tmp_path):
    dps = datapoints()
    D.HDF5Serializer.save(D.DataFromList(dps, shuffle=False), str(tmp_path / "a.h5"),
                          ["label", "grp/image"])
    out = run_tensorpack(f"""
        import json
        from tensorpack.dataflow import HDF5Serializer
        df = HDF5Serializer.load({str(tmp_path / 'a.h5')!r}, ['label', 'grp/image'],
                                 shuffle=False)
        df.reset_state()
        print(json.dumps([[int(dp[0]), dp[1].tolist()] for dp in df]))
    """)
    got = json.loads(out.strip().splitlines()[-1])
    assert [g[0] for g in got] == [d[0] for d in dps]
    for g, d in zip(got, dps):
        np.testing.assert_array_equal(np.array(g[1]), d[1])


def test_hdf5_string_components_are_variable_length_strings_as_tensorpack_writes_them(tmp_path):
    # a file name and raw bytes per datapoint: read back as bytes, in full, by both libraries
    dps = [["a.jpg", b"x\xff\x01", 0], ["dir/bé.jpg", b"yz", 1]]
    path = str(tmp_path / "s.h5")
    D.HDF5Serializer.save(D.DataFromList(dps, shuffle=False), path, ["name", "raw", "label"])
    got = loaded(D.HDF5Data(path, ["name", "raw", "label"], shuffle=False))
    assert [g[0] for g in got] == [b"a.jpg", "dir/bé.jpg".encode()]
    assert [g[1] for g in got] == [b"x\xff\x01", b"yz"]
    out = run_tensorpack(f"""
        from tensorpack.dataflow import HDF5Serializer
        df = HDF5Serializer.load({path!r}, ['name', 'raw', 'label'], shuffle=False)
        df.reset_state()
        print([[dp[0], dp[1], int(dp[2])] for dp in df])
    """)
    assert out.strip().splitlines()[-1] == repr([[g[0], g[1], int(g[2])] for g in got])


def test_hdf5_refuses_a_string_with_a_nul_naming_it(tmp_path):
    # HDF5 strings end at a NUL: refused, never cut short
    dps = [[b"ok", 0], [b"a\x00b", 1]]
    with pytest.raises(ValueError, match=r"datapoint 1: .*'raw'.* NUL"):
        D.HDF5Serializer.save(D.DataFromList(dps, shuffle=False), str(tmp_path / "n.h5"),
                              ["raw", "label"])
    assert not os.listdir(tmp_path)


# --------------------------------------------------------------------------------- SVMlight

def test_svmlight_yields_dense_rows_and_labels(tmp_path):
    path = tmp_path / "a.svm"
    path.write_text("1 1:0.5 3:2\n-1 2:1.5\n2 1:1 2:2 3:3\n")
    df = D.SVMLightData(str(path), shuffle=False)
    assert len(df) == 3
    out = loaded(df)
    np.testing.assert_array_equal(np.stack([dp[0] for dp in out]),
                                  [[0.5, 0, 2], [0, 1.5, 0], [1, 2, 3]])
    assert [dp[1] for dp in out] == [1.0, -1.0, 2.0]
    assert out[0][0].dtype == np.float64 and isinstance(out[0][1], np.float64)
    shuffled = D.SVMLightData(str(path))
    assert sorted(float(dp[1]) for dp in loaded(shuffled)) == [-1.0, 1.0, 2.0]


def test_svmlight_bad_file_raises_naming_it(tmp_path):
    path = tmp_path / "bad.svm"
    path.write_text("1 1:0.5\nnot a row at all\n")
    with pytest.raises(ValueError, match=r"bad\.svm: not a valid SVMlight file"):
        D.SVMLightData(str(path))


# ----------------------------------------------------------------------------- dependencies

@pytest.mark.parametrize("make, module, extra", [
    (lambda p: D.HDF5Data(p, ["a"]), "h5py", "formats"),
    (lambda p: D.HDF5Serializer.save(D.DataFromList([[1]]), p, ["a"]), "h5py", "formats"),
    (lambda p: D.SVMLightData(p), "sklearn", "formats"),
])
def test_missing_dependency_names_the_extra(tmp_path, monkeypatch, make, module, extra):
    for name in list(sys.modules):
        if name == module or name.startswith(module + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)      # makes "import module" fail
    with pytest.raises(ImportError, match=rf"dataflow-rt\[{extra}\]"):
        make(str(tmp_path / "x"))


def test_import_dataflow_imports_no_optional_dependency():
    code = ("import sys, dataflow, dataflow.formats; "
            "print([m for m in ('h5py', 'sklearn', 'lmdb', 'scipy', 'cv2') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("shuffle", [False, True])
def test_hdf5data_resumes_exactly(tmp_path, shuffle):
    """Checkpoint (issue 18): a state taken mid-pass continues that pass, then the next."""
    import json
    import dataflow as D
    path = str(tmp_path / "ck.h5")
    D.HDF5Serializer.save(D.DataFromList([[k, np.full(2, k)] for k in range(9)], shuffle=False),
                          path, ["a", "b"])

    def build():
        D.set_seed(5)
        df = D.HDF5Data(path, ["a", "b"], shuffle=shuffle)
        df.reset_state()
        return df

    df = build()
    ref = [int(dp[0]) for _ in range(2) for dp in df]
    df = build()
    it = iter(df)
    got = [int(next(it)[0]) for _ in range(4)]
    state = json.loads(json.dumps(df.state_dict()))
    df = build()
    df.load_state_dict(state)
    got += [int(dp[0]) for _ in range(2) for dp in df]
    D.set_seed(None)
    assert got == ref
    assert (ref[:9] == list(range(9))) != shuffle


def test_svmlight_shuffled_resumes_exactly_mid_pass(tmp_path):
    # its state_dict() raised NotImplementedError, and a replay resume reused pass 0's order
    path = tmp_path / "a.svm"
    path.write_text("".join(f"{i} 1:{i}\n" for i in range(20)))

    def labels(df, n=None):
        return [float(dp[1]) for dp in (df if n is None else itertools.islice(df, n))]

    D.set_seed(3)
    df = D.SVMLightData(str(path))
    df.reset_state()
    labels(df)
    whole = labels(df)                          # the second pass, uninterrupted
    for k in (0, 1, 7, 20):
        D.set_seed(3)
        df = D.SVMLightData(str(path))
        df.reset_state()
        labels(df)
        it = iter(df)
        got = labels(it, k)
        state = json.loads(json.dumps(df.state_dict()))
        D.set_seed(3)
        again = D.SVMLightData(str(path))
        again.load_state_dict(state)
        again.reset_state()
        assert got + labels(again) == whole, k


def test_bad_paths_and_data_paths_are_refused(tmp_path):
    # D.NumpySerializer.save(df, "") wrote a hidden ".npz"; HDF5Data(p, "xy") read datasets x, y
    with pytest.raises(ValueError, match="NumpySerializer.save: path must name a file, got ''"):
        D.NumpySerializer.save(D.DataFromList([[1]]), "")
    with pytest.raises(TypeError, match="NumpySerializer.save: expected a DataFlow"):
        D.NumpySerializer.save([[1]], str(tmp_path / "a.npz"))
    path = str(tmp_path / "a.h5")
    D.HDF5Serializer.save(D.DataFromList([[np.zeros(2)]]), path, ["x"])
    with pytest.raises(TypeError, match="data_paths must be a list of dataset paths, got the "
                                        "string 'xy'"):
        D.HDF5Data(path, "xy")
    for bad in (5, ["x", 5]):           # a bare "'int' object is not iterable", or at the read
        with pytest.raises(TypeError, match="data_paths must be a list of dataset paths"):
            D.HDF5Data(path, bad)
    assert len(D.HDF5Data(path, np.array(["x"]))) == 1      # any sequence of names, as 0.11
    assert not os.path.exists(str(tmp_path / ".npz"))
