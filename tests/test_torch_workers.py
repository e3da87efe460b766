"""Map functions that use torch in worker processes: they do not hang after the consumer used
torch's threads, use their share of the CPUs, and draw different random numbers."""
import sys

import pytest

import dataflow as D
from dataflow.parallel import cvthreads

from .conftest import import_later

# imported when the first test runs, not at collection: these tests run last (conftest)
torch = import_later("torch")
pytestmark = pytest.mark.torch


def _points(n=16):
    return D.DataFromList([[k] for k in range(n)], shuffle=False)


def _run(df):
    df.timeout = 20             # a worker stuck in torch fails the test, not the suite
    df.reset_state()
    try:
        return list(df)
    finally:
        df.close()


def matmul_and_threads(dp):
    import torch
    x = torch.ones(300, 300)
    return [dp[0], float((x @ x)[0, 0]), torch.get_num_threads()]


@pytest.mark.usefixtures("no_leaks")
def test_forked_workers_run_torch_after_the_consumer_used_its_threads():
    # torch's OpenMP pool, used here with 2 threads, hung a forked child's first parallel
    # operation with more than one thread: forked workers run torch on one, as DataLoader's
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a = torch.ones(600, 600)
        for _ in range(3):
            (a @ a).sum()
        got = _run(D.MultiProcessMapData(_points(), 2, matmul_and_threads, strict=True,
                                         start_method="fork"))
        assert sorted(dp[:2] for dp in got) == [[k, 300.0] for k in range(16)]
        assert {dp[2] for dp in got} == {1}
        assert torch.get_num_threads() == 2         # the consumer's own count is untouched
    finally:
        torch.set_num_threads(before)


@pytest.mark.usefixtures("no_leaks")
def test_workers_that_import_torch_get_their_share_of_the_cpus():
    # a fresh process's torch starts a thread per CPU; N workers get cpus // N each
    from . import _torch_maps               # imports torch: loading the function does too
    got = _run(D.MultiProcessMapData(_points(), 2, _torch_maps.matmul_and_threads,
                                     strict=True, start_method="forkserver"))
    assert sorted(dp[:2] for dp in got) == [[k, 300.0] for k in range(16)]
    assert {dp[2] for dp in got} == {cvthreads.threads_for(2)}


def test_a_limit_waits_for_torch_to_be_imported(monkeypatch):
    # a map function that imports torch itself: the limit applies at the next chunk's start
    from dataflow.parallel import torchthreads
    import torch as module                  # the module itself (``torch`` here is a handle)
    before = module.get_num_threads()
    monkeypatch.delitem(sys.modules, "torch")
    try:
        torchthreads.set_process_limit(1 if before != 1 else 2)
        assert module.get_num_threads() == before           # not imported: nothing yet
        monkeypatch.setitem(sys.modules, "torch", module)
        torchthreads.apply_pending()
        assert module.get_num_threads() == (1 if before != 1 else 2)
        module.set_num_threads(before)
        torchthreads.apply_pending()                        # applied once
        assert module.get_num_threads() == before
    finally:
        module.set_num_threads(before)


@pytest.mark.usefixtures("no_leaks")
@pytest.mark.parametrize("method", ["fork", "forkserver"])
def test_workers_draw_different_torch_numbers(method):
    # torch starts every process at one fixed seed, and a forked worker inherits the
    # consumer's generator: both workers drew the same numbers. Now each is seeded as numpy
    # is, from the global seed and its worker id.
    from ._torch_maps import draw           # its module imports torch (see _torch_maps)

    def firsts():
        D.set_seed(7)
        try:
            got = _run(D.MultiProcessMapData(_points(), 2, draw, strict=True,
                                             start_method=method))
        finally:
            D.set_seed(None)
        first = {}
        for wid, value in got:
            first.setdefault(wid, value)
        return first

    first = firsts()
    assert sorted(first) == [0, 1] and first[0] != first[1]
    assert firsts() == first                # reproducible from the seed
