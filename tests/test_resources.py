"""Clear errors when the OS says no: each names the resource, the number needed, the current
limit and the fix, and leaves nothing behind (no process, no segment, no descriptor)."""
import errno
import multiprocessing as mp
import os
import resource
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dataflow as D
from dataflow.parallel import resources
from dataflow.parallel.process_executor import ProcessExecutor

pytestmark = [pytest.mark.timeout(60)]


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _make_identity(wid):
    def f(dp):
        return dp
    return f


def _started(n):
    """Descriptors this process holds for an executor of ``n`` workers that have all said
    HELLO and answered a task."""
    before = _fds()
    ex = ProcessExecutor(n, _make_identity, start_method="fork")
    try:
        ex.submit(0, [(i, i, [np.zeros(4000)]) for i in range(4 * n)])   # 32 KB: shared memory
        got = 0
        while got < 4 * n:
            results, _ = ex.get()
            got += len(results)
        del results
        return _fds() - before
    finally:
        ex.close()


@pytest.mark.usefixtures("no_leaks")
def test_the_descriptor_estimate_covers_what_workers_take():
    one, five = _started(1), _started(5)
    per_worker = (five - one) / 4
    assert per_worker <= resources.FDS_PER_WORKER, per_worker
    assert one - per_worker <= resources.FDS_PER_EXECUTOR, one


@pytest.fixture
def low_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = _fds() + 80
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    yield limit
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.usefixtures("no_leaks")
def test_too_few_file_descriptors_for_16_workers(low_nofile):
    df = D.MultiProcessMapData(D.DataFromList([[1]]), 16, lambda dp: dp, start_method="fork")
    with pytest.raises(resources.ResourceLimitError) as info:
        df.reset_state()
    df.close()
    e = info.value
    assert isinstance(e, OSError) and e.errno == errno.EMFILE
    msg = str(e)
    need = resources.FDS_PER_EXECUTOR + 16 * resources.FDS_PER_WORKER
    assert "16 worker process(es)" in msg and f"about {need} file descriptors" in msg, msg
    assert f"RLIMIT_NOFILE) is {low_nofile}" in msg and "ulimit -n" in msg, msg
    assert "fewer workers" in msg and "at most" in msg, msg
    # and the limit it names is enough for what it says fits
    fit = int(msg.split("at most ")[1].split()[0])
    assert 1 <= fit < 16
    with D.MultiProcessMapData(D.DataFromList([[1]] * 4), fit, _make_identity(0),
                               start_method="fork", strict=True) as df:
        df.reset_state()
        assert list(df) == [[1]] * 4


@pytest.mark.usefixtures("no_leaks")
def test_eagain_on_fork_names_the_process_limit(monkeypatch):
    started = []
    original = mp.context.ForkProcess.start

    def start(self):
        if len(started) == 2:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        started.append(self)
        original(self)
    monkeypatch.setattr(mp.context.ForkProcess, "start", start)
    with pytest.raises(resources.ResourceLimitError) as info:
        ProcessExecutor(4, _make_identity, start_method="fork")
    msg = str(info.value)
    assert info.value.errno == errno.EAGAIN
    assert "could not start worker process 2 of 4" in msg and "RLIMIT_NPROC" in msg, msg
    assert "ulimit -u" in msg and "fewer workers" in msg, msg
    assert len(started) == 2        # the two that started were stopped: no_leaks checks it


def _refuse_big_files():
    def f(dp):
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.RLIM_INFINITY))
        return [np.ones(200_000, np.uint8)]
    return f


@pytest.mark.usefixtures("no_leaks")
def test_threads_the_system_refuses_name_the_limit_and_leave_none(monkeypatch):
    # MultiThreadMapData(ds, 10**6, f): "can't start new thread", with the ~22,000 that had
    # started left running after close()
    import threading
    from dataflow.parallel import thread_executor
    calls = []

    class Refusing(threading.Thread):
        def start(self):
            calls.append(1)
            if len(calls) > 3:
                raise RuntimeError("can't start new thread")
            super().start()

    monkeypatch.setattr(thread_executor.threading, "Thread", Refusing)
    before = set(threading.enumerate())
    df = D.MultiThreadMapData(D.DataFromList([[1]]), 8, lambda dp: dp)
    with pytest.raises(D.ResourceLimitError, match="could not start worker thread 4 of 8") as info:
        df.reset_state()
    assert info.value.errno == errno.EAGAIN and "use fewer workers" in str(info.value)
    for t in set(threading.enumerate()) - before:
        t.join(5)
    assert set(threading.enumerate()) <= before
    df.close()


def test_shared_memory_for_a_segment_refused(no_leaks):
    with D.MultiProcessMapData(D.DataFromList([[0]]), 1, _refuse_big_files(), strict=True,
                               start_method="fork") as df:
        df.reset_state()
        with pytest.raises(D.SharedMemoryError) as info:
            list(df)
    msg = str(info.value)
    assert "could not reserve 262144 bytes of shared memory" in msg, msg
    assert "RLIMIT_FSIZE is 65536" in msg and "ulimit -f" in msg, msg
    del info


def test_out_of_file_descriptors_for_a_segment_names_the_limit():
    # it said "free memory, reduce buffer_size": each segment the consumer maps holds a
    # descriptor while results that use it are alive (list(df) of a long pipeline)
    import resource
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    from dataflow.parallel import resources as R
    for code in (errno.EMFILE, errno.ENFILE):
        msg = R.segment_error(1 << 21, OSError(code, os.strerror(code)), "map")
        assert msg.startswith("could not map 2097152 bytes of shared memory for a result ("), msg
        assert f"open-files limit RLIMIT_NOFILE is {soft}" in msg and "ulimit -n" in msg, msg
        assert "free memory" not in msg


def test_segments_without_memfd_or_fallocate_reserve_their_blocks(tmp_path, monkeypatch):
    # macOS has neither: the file stayed sparse, and a full file system was a SIGBUS in the
    # worker at its first write instead of this error
    from dataflow.parallel import shm
    monkeypatch.delattr(os, "memfd_create", raising=False)
    monkeypatch.delattr(os, "posix_fallocate", raising=False)
    monkeypatch.setattr(shm.tempfile, "tempdir", str(tmp_path))
    fd = shm._anonymous_file(1 << 20)
    try:
        st = os.fstat(fd)
        assert st.st_size == 1 << 20 and st.st_blocks * 512 >= 1 << 20
    finally:
        os.close(fd)
    assert os.listdir(tmp_path) == []                  # unlinked at once

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(shm.os, "pwrite", full)
    with pytest.raises(D.SharedMemoryError) as info:
        shm._anonymous_file(1 << 20)
    msg = str(info.value)
    assert "could not reserve 1048576 bytes of shared memory" in msg, msg
    assert f"temporary directory {tmp_path} (" in msg and "TMPDIR" in msg, msg
    monkeypatch.setattr(shm.tempfile, "tempdir", str(tmp_path / "gone"))
    with pytest.raises(D.SharedMemoryError, match="gone"):
        shm._anonymous_file(1 << 20)


@pytest.mark.parametrize("kind", ["unwritable", "too long"])
def test_unusable_temporary_directory_for_the_fork_server(tmp_path, kind):
    # too long: the server's socket path does not fit a Unix socket address ("AF_UNIX path too
    # long", an OSError from multiprocessing)
    if kind == "unwritable":
        tempdir = "/proc/dataflow-no-such-dir"
    else:
        tempdir = str(tmp_path / ("d" * (110 - len(str(tmp_path)))))
        os.mkdir(tempdir)
    script = tmp_path / "tmpdir.py"
    script.write_text(textwrap.dedent("""
        import os, tempfile
        tempfile.tempdir = TEMPDIR
        import dataflow as D
        from dataflow.parallel.resources import ResourceLimitError
        df = D.MultiProcessMapData(D.DataFromList([[1]]), 2, lambda dp: dp,
                                   start_method="forkserver")
        try:
            df.reset_state()
        except ResourceLimitError as e:
            print("ERR", e)
        df.close()
        children = []
        for p in os.listdir("/proc"):
            try:
                with open(f"/proc/{p}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == str(os.getpid()):
                        children.append(p)
            except (OSError, IndexError):
                pass
        print("children", children)
    """).replace("TEMPDIR", repr(tempdir)))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=50, cwd=root, env={**os.environ, "PYTHONPATH": root})
    assert res.returncode == 0, res.stderr
    assert "ERR" in res.stdout and tempdir in res.stdout, res.stdout
    assert "set TMPDIR" in res.stdout and "start_method='spawn'" in res.stdout, res.stdout
    if kind == "too long":
        assert "more than the 107 a Unix socket address holds" in res.stdout, res.stdout
    assert "children []" in res.stdout, res.stdout
