"""Shared fixtures: a leak check for tests that start threads or processes; the order of the
tests that import torch or Ray."""
import gc
import importlib
import importlib.util
import multiprocessing as mp
import os
import threading

import pytest

from dataflow import config

# A process worker that holds a datapoint this long is logged with its Python stack
# (faulthandler), which the report of a test that then runs into its time limit shows: a hang
# in CI says where the worker was. (The default, 300 s, is beyond every test's limit.)
TEST_HANG_TIMEOUT = 20.0
config.set_hang_timeout(TEST_HANG_TIMEOUT)


def pytest_collection_modifyitems(items):
    """The tests marked ``torch`` or ``ray`` run last, in their own order. Once torch (280 MB
    of mappings) or Ray is imported into this process, every process dataflow forked after it
    copies their page tables and faults in their pages: the fork-heavy files run 20 % slower
    after it. Their modules import them through :func:`import_later`, so that collecting
    them does not import them either."""
    heavy = [item for item in items if item.get_closest_marker("torch")
             or item.get_closest_marker("ray")]
    if heavy:
        ids = {id(item) for item in heavy}
        items[:] = [item for item in items if id(item) not in ids] + heavy


class import_later:
    """``torch = import_later("torch")``: a test module's handle on a module that is imported at
    its first attribute access, i.e. when a test of that module runs, not when it is
    collected (see :func:`pytest_collection_modifyitems`). Skips the whole test module, as
    ``pytest.importorskip`` does, when the module is not installed."""

    def __init__(self, name):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"could not import {name!r}", allow_module_level=True)
        self._name = name

    def __getattr__(self, attr):
        return getattr(importlib.import_module(self._name), attr)


def _helper_pids():
    """multiprocessing's long-lived helpers (fork server, resource tracker) and the tensorpack
    zygotes (tests/_tensorpack.py): started once per interpreter by design, so not counted as
    leaks."""
    from ._tensorpack import zygote_pids
    pids = zygote_pids()
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
    from ._tensorpack import zygote_fds
    gc.collect()
    return {
        "processes": descendants(),
        "threads": {t.ident for t in threading.enumerate()},
        "fds": len(set(os.listdir("/proc/self/fd")) - zygote_fds()),
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
