"""OpenCV's thread pool in map workers: limited to the CPUs per worker while workers run,
never imported by dataflow for that."""
import subprocess
import sys

import numpy as np
import pytest

cv2 = pytest.importorskip("cv2")

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


@pytest.mark.usefixtures("no_leaks")
def test_forked_workers_keep_the_inherited_count_and_do_not_hang():
    # the consumer has run OpenCV's pool; changing the count in a forked child would deadlock
    img = np.zeros((600, 800, 3), np.uint8)
    for _ in range(3):
        cv2.resize(img, (1000, 1300), interpolation=cv2.INTER_CUBIC)
    df = dataflow.MultiProcessMapData(_points(), 2, resize_and_count, strict=True,
                                      start_method="fork")
    assert _run(df) == {cv2.getNumThreads()}


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
