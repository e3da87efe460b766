"""Shared fixtures: a leak check for tests that start threads or processes."""
import gc
import multiprocessing as mp
import os
import threading

import pytest


def _helper_pids():
    """multiprocessing's long-lived helpers (fork server, resource tracker): started once per
    interpreter by design, so not counted as leaks."""
    pids = set()
    from multiprocessing import forkserver, resource_tracker
    for obj, attr in ((getattr(forkserver, "_forkserver", None), "_forkserver_pid"),
                      (getattr(resource_tracker, "_resource_tracker", None), "_pid")):
        pid = getattr(obj, attr, None)
        if pid:
            pids.add(pid)
    return pids


def descendants():
    """Live (non-zombie) processes below this one, excluding multiprocessing's helpers but
    including the processes those helpers started for us."""
    parent = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if rest[0] not in ("Z", "X"):
            parent[int(d)] = int(rest[1])
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - found
        found |= frontier
    return found - _helper_pids()


def memfd_mappings():
    with open("/proc/self/maps") as f:
        return sum("memfd:dataflow" in line for line in f)


def snapshot():
    gc.collect()
    return {
        "processes": descendants(),
        "threads": {t.ident for t in threading.enumerate()},
        "fds": len(os.listdir("/proc/self/fd")),
        "dev_shm": set(os.listdir("/dev/shm")),
        "memfd_mappings": memfd_mappings(),
    }


def assert_no_leaks(before):
    # close() does not wait for a worker thread that is inside a map call (it cannot be
    # interrupted); such a thread leaves when the call returns. Wait for that, boundedly.
    for t in threading.enumerate():
        if t.ident not in before["threads"] and t.name.startswith("dataflow"):
            t.join(10)
    after = snapshot()
    assert after["processes"] <= before["processes"], f"processes left: {after['processes']}"
    extra = after["threads"] - before["threads"]
    assert not extra, f"threads left: {[t.name for t in threading.enumerate() if t.ident in extra]}"
    assert after["fds"] <= before["fds"], f"fds grew from {before['fds']} to {after['fds']}"
    assert after["dev_shm"] <= before["dev_shm"], f"/dev/shm gained {after['dev_shm']}"
    assert after["memfd_mappings"] <= before["memfd_mappings"], "shared memory still mapped"


@pytest.fixture(scope="session", autouse=True)
def _warm_start_methods():
    """Start the fork server once, up front, so that its own pipes and process do not count
    as leaks of the first test that uses it."""
    if "forkserver" in mp.get_all_start_methods():
        import dataflow
        with dataflow.MultiProcessMapData(dataflow.DataFromList([[0]], shuffle=False), 1,
                                          _identity, strict=True,
                                          start_method="forkserver") as df:
            df.reset_state()
            list(df)
    # tensorpack's progress bars (its serializers, its TestDataSpeed) would start tqdm's monitor
    # thread, which lives until exit: every later test's process dataflows would then start
    # their workers through the fork server instead of forking (see default_start_method)
    try:
        import tqdm
        tqdm.tqdm.monitor_interval = 0
    except ImportError:
        pass
    # Everything imported so far (numpy, OpenCV, torch, Ray, the test modules) lives as long as
    # the session: move it out of the collector's way, so that the leak check's gc.collect()
    # scans only what tests create (0.1 s a call otherwise, with torch and Ray imported).
    gc.freeze()
    yield


def _identity(dp):
    return dp


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves processes, threads, fds, /dev/shm files or shared-memory
    mappings behind. Tests close their dataflows and drop their arrays before returning."""
    before = snapshot()
    yield
    assert_no_leaks(before)
    # What outlived the test's collection lives on (modules it imported, such as scipy's
    # hundreds, caches): freeze it as _warm_start_methods froze the imports, so that each later
    # leak check's collection scans only what its own test made (40 ms a call otherwise)
    gc.freeze()
