"""OpenCV's thread pool in map workers: limited to the CPUs per worker while workers run,
never imported by dataflow for that."""
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest

import dataflow                                             # noqa: E402
from dataflow.parallel import cvthreads                     # noqa: E402


def cv_threads(dp):
    return [cv2.getNumThreads()]


def _run(df):
    df.reset_state()
    try:
        return {dp[0] for dp in df}
    finally:
        df.close()


def _points(n=16):
    return dataflow.DataFromList([[k] for k in range(n)], shuffle=False)


@pytest.mark.usefixtures("no_leaks")
def test_thread_workers_limit_opencv_while_they_run():
    before = cv2.getNumThreads()
    df = dataflow.MultiThreadMapData(_points(), 2, cv_threads, strict=True)
    assert _run(df) == {cvthreads.threads_for(2)}
    assert cv2.getNumThreads() == before


@pytest.mark.usefixtures("no_leaks")
def test_process_workers_limit_opencv():
    df = dataflow.MultiProcessMapData(_points(), 2, cv_threads, strict=True,
                                      start_method="forkserver")
    assert df.executor == "process"
    assert _run(df) == {cvthreads.threads_for(2)}


def resize_and_count(dp):
    img = np.zeros((600, 800, 3), np.uint8)
    cv2.resize(img, (1000, 1300), interpolation=cv2.INTER_CUBIC)
    return [cv2.getNumThreads()]


def _use_opencv_pool():
    img = np.zeros((600, 800, 3), np.uint8)
    for _ in range(3):
        cv2.resize(img, (1000, 1300), interpolation=cv2.INTER_CUBIC)


def _os_threads():
    return len(os.listdir("/proc/self/task"))


@pytest.mark.usefixtures("no_leaks")
def test_forked_workers_are_limited_after_the_consumer_used_opencv():
    # the consumer's pool is stopped around each fork: the children inherit none of its
    # threads' locks, and may set their own count
    before = cv2.getNumThreads()
    _use_opencv_pool()
    df = dataflow.MultiProcessMapData(_points(), 2, resize_and_count, strict=True,
                                      start_method="fork")
    assert _run(df) == {cvthreads.threads_for(2)}
    assert cv2.getNumThreads() == before


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_opencv_pool_threads_are_stopped_around_a_fork():
    before = cv2.getNumThreads()
    cv2.setNumThreads(4)
    try:
        _use_opencv_pool()                  # OpenCV starts 3 threads beside this one
        running = _os_threads()
        with cvthreads.stopped_for_fork() as settable:
            assert settable
            assert _os_threads() == running - 3
            assert cv2.getNumThreads() == 1
        assert cv2.getNumThreads() == 4
        _use_opencv_pool()
        assert _os_threads() == running     # started again by the next parallel call
        with cvthreads.stopped_for_fork(forking=False) as settable:
            assert settable and _os_threads() == running and cv2.getNumThreads() == 4
    finally:
        cv2.setNumThreads(before)


@pytest.mark.usefixtures("no_leaks")
def test_an_opencv_on_other_threads_is_not_forked_and_never_changed_in_a_fork(monkeypatch):
    # TBB's or OpenMP's threads cannot be stopped: the default start method avoids fork, and a
    # worker forked anyway leaves the count it inherited
    from dataflow.parallel.start import default_start_method
    assert cvthreads.fork_safe()
    monkeypatch.setattr(cvthreads, "_own_pool", False)
    assert not cvthreads.fork_safe()
    assert default_start_method() == "forkserver"
    with cvthreads.stopped_for_fork() as settable:
        assert not settable
    df = dataflow.MultiProcessMapData(_points(), 2, cv_threads, strict=True,
                                      start_method="fork")
    assert _run(df) == {cv2.getNumThreads()}
    monkeypatch.setenv("OPENCV_PARALLEL_BACKEND", "TBB")
    monkeypatch.setattr(cvthreads, "_own_pool", True)
    assert not cvthreads.fork_safe()
    monkeypatch.delenv("OPENCV_PARALLEL_BACKEND")
    assert cvthreads.fork_safe() and default_start_method() == "fork"
    monkeypatch.delitem(sys.modules, "cv2")
    monkeypatch.setattr(cvthreads, "_own_pool", False)
    assert cvthreads.fork_safe()            # not imported: nothing to inherit


def test_threads_for():
    n = cvthreads.threads_for(1)
    assert n >= 1 and cvthreads.threads_for(n + 1) == 1 and cvthreads.threads_for(10**6) == 1


def _python(code):
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_never_imports_opencv_and_applies_the_limit_on_import():
    default = int(_python("import cv2; print(cv2.getNumThreads())"))
    _python(
        "import sys, dataflow\n"
        "from dataflow.parallel import cvthreads\n"
        "df = dataflow.MultiThreadMapData(dataflow.DataFromList([[1]] * 8, shuffle=False), 2,\n"
        "                                 lambda dp: dp, strict=True)\n"
        "df.reset_state(); list(df); df.close()\n"
        "assert 'cv2' not in sys.modules\n"
        "token = cvthreads.hold(1)          # a pool starts before OpenCV is imported\n"
        "cv2 = cvthreads.import_cv2()\n"
        "assert cv2.getNumThreads() == 1, cv2.getNumThreads()\n"
        "cvthreads.release(token)\n"
        f"assert cv2.getNumThreads() == {default}, cv2.getNumThreads()\n")
