"""dataflow.integrations.torch: a dataflow as a torch IterableDataset."""
import gc
import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest

import dataflow as df
from dataflow.base import ProxyDataFlow

from .conftest import descendants, import_later

# imported when the first test runs, not at collection: these tests run last (conftest)
torch = import_later("torch")
integration = import_later("dataflow.integrations.torch")
pytestmark = pytest.mark.torch


class Recorder(ProxyDataFlow):
    """Passes ``ds`` through, counting ``reset_state``/``close`` calls and keeping the
    datapoints it yielded in the last pass."""

    def __init__(self, ds):
        super().__init__(ds)
        self.resets = self.closes = 0
        self.seen = []

    def reset_state(self):
        self.resets += 1
        super().reset_state()

    def close(self):
        self.closes += 1
        super().close()

    def __iter__(self):
        self.seen = []
        for dp in self.ds:
            self.seen.append(dp)
            yield dp


def numbers(n=10):
    return df.DataFromList([[np.full((2, 3), i, dtype=np.int64), i] for i in range(n)],
                           shuffle=False)


def add_one(dp):          # a Python op: with python_multiprocessing=True it runs in processes
    return [dp[0] + 1, dp[1]]


def test_importing_dataflow_does_not_import_torch():
    code = ("import sys, dataflow, dataflow.integrations; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize("executor", ["serial", "thread", "process"])
def test_each_iter_is_one_epoch(no_leaks, executor):
    workers = None if executor == "serial" else 2
    mapped = df.MapData(numbers(), add_one, num_parallel_workers=workers,
                        python_multiprocessing=executor == "process")
    assert mapped.executor == executor
    ds = integration.as_iterable_dataset(df.BatchData(mapped, 4, remainder=True))
    assert len(ds) == 3
    for _ in range(3):
        batches = list(ds)
        assert [len(b[1]) for b in batches] == [4, 4, 2]
        images = torch.cat([b[0] for b in batches])
        assert images.dtype == torch.int64 and images.shape == (10, 2, 3)
        assert images[:, 0, 0].tolist() == list(range(1, 11))
        assert torch.cat([b[1] for b in batches]).tolist() == list(range(10))
    ds.close()
    del batches, images


def test_epochs_limit_closes_after_the_last(no_leaks):
    before = descendants()
    rec = Recorder(df.MapData(numbers(6), add_one, num_parallel_workers=2,
                              python_multiprocessing=True))
    ds = integration.as_iterable_dataset(rec, epochs=2)
    assert len(list(ds)) == 6
    assert rec.closes == 0 and descendants() - before        # workers still up
    assert len(list(ds)) == 6
    assert rec.closes == 1 and ds.closed
    assert not descendants() - before
    with pytest.raises(RuntimeError, match="closed"):
        iter(ds)


def test_abandoned_epoch_counts_and_frees_the_dataflow(no_leaks):
    ds = integration.as_iterable_dataset(df.MapData(numbers(), add_one, num_parallel_workers=2),
                                         epochs=2)
    it = iter(ds)
    next(it)
    del it                     # abandon the first pass: the next one can start
    assert len(list(ds)) == 10
    assert ds.closed and ds.epochs_started == 2


def test_epochs_must_be_positive():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="epochs"):
            integration.as_iterable_dataset(numbers(), epochs=bad)
    assert integration.as_iterable_dataset(numbers(), epochs=np.int64(2)).epochs == 2


def test_what_is_no_dataflow_is_refused_when_made():
    # a list or None failed only at the first iter(), with an AttributeError
    for bad in ([[1], [2]], None, 3):
        with pytest.raises(TypeError, match="as_iterable_dataset needs a DataFlow"):
            integration.as_iterable_dataset(bad)


def test_reset_state_once_lazily():
    rec = Recorder(numbers())
    ds = integration.as_iterable_dataset(rec)
    assert rec.resets == 0                 # not when the dataset is made
    for _ in range(3):
        assert len(list(ds)) == 10
    assert rec.resets == 1


def test_arrays_become_tensors_without_copy(no_leaks):
    rec = Recorder(df.MapData(numbers(), add_one, num_parallel_workers=2,
                              python_multiprocessing=True))
    ds = integration.as_iterable_dataset(rec)
    out = list(ds)
    assert len(out) == 10
    for dp, (tensor, label) in zip(rec.seen, out):
        assert isinstance(tensor, torch.Tensor) and label == dp[1]
        assert tensor.data_ptr() == dp[0].ctypes.data          # same memory
        assert tensor.shape == dp[0].shape
    # the tensor keeps the (shared-memory) array alive after the dataflow forgot it
    rec.seen = []
    gc.collect()
    assert [t[0, 0].item() for t, _ in out] == list(range(1, 11))
    ds.close()
    del out, dp, tensor


def test_to_torch_structures():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.ones(3, dtype=np.uint8)
    dp = {"x": a, "nested": [b, (np.int64(7), "text")], "n": 3, "s": np.array(["a", "bc"])}
    out = integration.to_torch(dp)
    assert out["x"].data_ptr() == a.ctypes.data and out["x"].dtype == torch.float32
    assert out["nested"][0].data_ptr() == b.ctypes.data
    assert isinstance(out["nested"], list) and isinstance(out["nested"][1], tuple)
    assert out["nested"][1][0].shape == () and out["nested"][1][0].item() == 7
    assert out["nested"][1][1] == "text" and out["n"] == 3
    assert out["s"] is dp["s"]                       # torch has no string tensors
    out["x"][0, 0] = 42                              # shared: the array sees it
    assert a[0, 0] == 42


def test_to_torch_copies_what_it_cannot_view():
    ro = np.arange(4)
    ro.flags.writeable = False
    rev = np.arange(4)[::-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")               # no "non-writable array" warning
        t_ro, t_rev = integration.to_torch([ro, rev])
    assert t_ro.data_ptr() != ro.ctypes.data and t_ro.tolist() == [0, 1, 2, 3]
    assert t_rev.tolist() == [3, 2, 1, 0]


def test_close_stops_workers_and_is_idempotent(no_leaks):
    before = descendants()
    mapped = df.MapData(numbers(), add_one, num_parallel_workers=2, python_multiprocessing=True)
    ds = integration.as_iterable_dataset(df.BatchData(mapped, 5))
    assert len(list(ds)) == 2
    assert descendants() - before                    # worker processes are running
    ds.close()
    assert not descendants() - before
    ds.close()
    with pytest.raises(RuntimeError, match="closed"):
        iter(ds)


def test_close_reaches_wrapped_dataflows(no_leaks):
    """close() closes the dataflows under the one given (in BatchData(MapData) the workers
    belong to the MapData)."""
    before = descendants()
    inner = Recorder(numbers())
    mapped = df.MapData(df.ConcatData([inner, numbers()]), add_one, num_parallel_workers=2,
                        python_multiprocessing=True)
    ds = integration.as_iterable_dataset(df.BatchData(df.RepeatedData(mapped, 2), 5))
    assert len(list(ds)) == 8
    assert descendants() - before
    ds.close()
    assert not descendants() - before
    assert inner.closes >= 1


def test_garbage_collection_closes(no_leaks):
    rec = Recorder(df.MapData(numbers(), add_one, num_parallel_workers=2,
                              python_multiprocessing=True))
    ds = integration.as_iterable_dataset(rec)
    list(ds)
    del ds
    gc.collect()
    assert rec.closes == 1


def test_with_closes():
    rec = Recorder(numbers())
    with integration.as_iterable_dataset(rec) as ds:
        list(ds)
    assert rec.closes == 1 and ds.closed


def test_dataloader_without_workers(no_leaks):
    mapped = df.MapData(numbers(), add_one, num_parallel_workers=2)
    ds = integration.as_iterable_dataset(df.BatchData(mapped, 5), epochs=2)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    for _ in range(2):
        batches = list(loader)
        assert [b[0].shape for b in batches] == [(5, 2, 3)] * 2
        assert torch.cat([b[1] for b in batches]).tolist() == list(range(10))
    assert ds.closed
    del batches


def test_dataloader_workers_are_refused():
    ds = integration.as_iterable_dataset(numbers())
    it = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=1))
    with pytest.raises(RuntimeError, match="num_workers=0"):
        next(it)
    # Stop torch's worker now: left to the garbage collector, its shutdown takes 5 s.
    getattr(it, "_shutdown_workers", lambda: None)()
    del it
    gc.collect()
    assert not ds.closed and ds.epochs_started == 0     # nothing ran in this process


def test_not_picklable():
    with pytest.raises(TypeError, match="num_workers=0"):
        pickle.dumps(integration.as_iterable_dataset(numbers()))


def test_length_unknown_is_a_type_error():
    bucketed = df.BucketBatchData(numbers(), [5], [2, 2])
    with pytest.raises(TypeError, match="unknown"):
        len(integration.as_iterable_dataset(bucketed))


def test_without_torch_the_import_error_names_the_extra(tmp_path):
    hidden = tmp_path / "no-torch"
    hidden.mkdir()
    (hidden / "torch.py").write_text("raise ImportError('torch is hidden by the test')\n")
    code = ("import dataflow\n"
            "try:\n"
            "    import dataflow.integrations.torch\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(hidden)})
    assert "needs PyTorch" in out.stdout and "dataflow-rt[torch]" in out.stdout, out.stderr
