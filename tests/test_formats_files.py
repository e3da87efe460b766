"""Writing aside: every format's ``save`` writes a temporary file beside the target and renames
it; a writer that was killed leaves that file, and the next save of the same path on this host
removes it (dataflow/formats/_files.py)."""
import os
import re
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

import dataflow as D

def _host():
    # as the names say it: the host name with anything but [A-Za-z0-9_] made '_'
    return re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())

WRITERS = {
    "lmdb": (lambda df, path: D.LMDBSerializer.save(df, path),
             lambda path: D.LMDBSerializer.load(path, shuffle=False)),
    "npz": (lambda df, path: D.NumpySerializer.save(df, path),
            lambda path: D.NumpySerializer.load(path, shuffle=False)),
    "hdf5": (lambda df, path: D.HDF5Serializer.save(df, path, ["label", "x"]),
             lambda path: D.HDF5Data(path, ["label", "x"], shuffle=False)),
    "tfrecord": (lambda df, path: D.TFRecordSerializer.save(df, path),
                 lambda path: D.TFRecordSerializer.load(path, size=3)),
}


def source():
    return D.DataFromList([[k, np.full(4, k, np.float32)] for k in range(3)], shuffle=False)


def labels(df):
    df.reset_state()
    out = [int(dp[0]) for dp in df]
    getattr(df, "close", lambda: None)()
    return out


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_save_removes_what_killed_writers_of_the_path_left_and_nothing_else(tmp_path, writer):
    save, load = WRITERS[writer]
    path = str(tmp_path / f"data.{writer}")
    host, dead = _host(), dead_pid()
    stale = [f".data.{writer}.{host}-{dead}-k1ll3d00.tmp",
             f".data.{writer}.{host}-{dead}-k1ll3d00.tmp-lock"]     # LMDB's lock beside it
    kept = [f".data.{writer}.{host}-{os.getppid()}-l1ve0000.tmp",  # a live process's
            f".data.{writer}.otherhost-{dead}-0ther000.tmp",        # another host's
            f".other.{writer}.{host}-{dead}-0ther000.tmp",          # another path's
            "unrelated.tmp"]
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"partial")
    save(source(), path)
    assert labels(load(path)) == [0, 1, 2]
    assert sorted(os.listdir(tmp_path)) == sorted(
        kept + [f"data.{writer}"] + (["data.lmdb-lock"] if writer == "lmdb" else []))


KILLED_WRITER = """
import sys
import dataflow as D

class Blocking(D.DataFlow):
    def __len__(self):
        return 3
    def __iter__(self):
        yield [0]
        print("writing", flush=True)
        sys.stdin.read()            # until killed
        yield [1]

if sys.argv[2] == "lmdb":
    D.LMDBSerializer.save(Blocking(), sys.argv[1], write_frequency=1)
else:
    D.TFRecordSerializer.save(Blocking(), sys.argv[1])
"""


@pytest.mark.parametrize("writer", ["lmdb", "tfrecord"])
def test_a_writer_killed_mid_save_leaves_only_a_temporary_file_that_the_next_save_removes(
        tmp_path, writer):
    save, load = WRITERS[writer]
    path = str(tmp_path / f"data.{writer}")
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, path, writer],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "writing\n"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdin.close()
        child.stdout.close()
    left = os.listdir(tmp_path)
    assert left and all(name.startswith(f".data.{writer}.{_host()}-{child.pid}-")
                        for name in left), left            # never under the final name
    save(source(), path)
    assert labels(load(path)) == [0, 1, 2]
    assert sorted(os.listdir(tmp_path)) == \
        [f"data.{writer}"] + (["data.lmdb-lock"] if writer == "lmdb" else [])


@pytest.mark.parametrize("writer", sorted(WRITERS))
@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_a_saved_file_has_the_mode_open_would_give_it(tmp_path, writer, umask):
    # the temporary file of mkstemp is 0600, and the rename kept that: a dataset written for a
    # team could not be read by it
    path = str(tmp_path / f"a.{writer}")
    old = os.umask(umask)
    try:
        WRITERS[writer][0](source(), path)
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask
    assert labels(WRITERS[writer][1](path)) == [0, 1, 2]


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_path_in_no_directory_or_naming_none_is_refused_before_writing(tmp_path, writer):
    # the errors named the temporary file ("/nodir/.x.lmdb.host-123-ab.tmp: No such file"), and
    # a path of "" wrote a file named ".tmp"-something or ".npz"
    missing = str(tmp_path / "nodir" / f"a.{writer}")
    with pytest.raises(FileNotFoundError, match=r"cannot write .*: the directory .*nodir' does "
                                                r"not exist"):
        WRITERS[writer][0](source(), missing)
    with pytest.raises(ValueError, match="must name a file, got ''"):
        WRITERS[writer][0](source(), "")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_a_path_of_bytes_is_taken_and_one_of_no_path_is_named(tmp_path, writer):
    # None and 5 failed inside os.fspath ("expected str, bytes or os.PathLike object"), naming
    # neither the function nor the argument; a bytes path failed later, in string operations
    save, load = WRITERS[writer]
    path = os.fsencode(str(tmp_path / f"a.{writer}"))
    save(source(), path)
    assert labels(load(path)) == [0, 1, 2]
    for bad in (None, 5):
        with pytest.raises(TypeError, match=r"path must be a path \(str or os.PathLike\)"):
            save(source(), bad)
        with pytest.raises(TypeError, match=r"(path|filename) must be a path \(str or "):
            load(bad)


def test_the_other_readers_name_a_path_that_is_none():
    with pytest.raises(TypeError, match="SVMLightData: filename must be a path"):
        D.SVMLightData(None)
    with pytest.raises(TypeError, match="LMDBData: lmdb_path must be a path"):
        D.CaffeLMDB(None)
