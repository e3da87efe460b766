"""Feed a dataflow to PyTorch: :func:`as_iterable_dataset`.

::

    from dataflow.integrations.torch import as_iterable_dataset

    df = BatchData(MapData(files, ops, num_parallel_workers=4, python_multiprocessing=True), 32)
    ds = as_iterable_dataset(df)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    for epoch in range(10):
        for images, labels in loader:        # one pass of df; arrays arrive as tensors
            ...
    ds.close()                               # stops df's workers

The dataflow already runs its map in its own threads or processes and already batches, so the
``DataLoader`` must neither batch (``batch_size=None``) nor start workers of its own
(``num_workers=0``): iterating the dataset inside a ``DataLoader`` worker raises ``RuntimeError``.
A ``DataLoader`` is optional; iterating the dataset directly is the same.

This module imports PyTorch; ``import dataflow`` does not import this module.
"""
import os
import weakref
from collections.abc import Mapping

import numpy as np

from .._helpers import is_int

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError as e:   # pragma: no cover - depends on the environment
    raise ImportError("dataflow.integrations.torch needs PyTorch, which is not installed: "
                      "pip install 'dataflow-rt[torch]'  (or: pip install torch)") from e

__all__ = ["as_iterable_dataset", "DataFlowIterableDataset", "to_torch"]

# numpy dtypes that torch.from_numpy accepts
_TORCH_DTYPES = frozenset(np.dtype(t) for t in (
    "float64", "float32", "float16", "complex64", "complex128", "int64", "int32", "int16",
    "int8", "uint64", "uint32", "uint16", "uint8", "bool"))


def to_torch(obj):
    """``obj`` with its numpy arrays turned into tensors, recursively through lists, tuples and
    dicts (a dict, list or tuple comes back as a new ``dict``, ``list`` or ``tuple``).

    A writable array with non-negative strides becomes ``torch.from_numpy(arr)``: the tensor
    shares the array's memory, no copy (it keeps the array, and the shared memory a process
    worker put it in, alive). A read-only array, or one with negative strides, is copied first,
    since a tensor cannot safely view it. A numpy scalar becomes a 0-d tensor. Arrays of a dtype
    torch lacks (strings, objects) and everything else are returned unchanged.
    """
    if isinstance(obj, np.ndarray):
        if obj.dtype not in _TORCH_DTYPES:
            return obj
        if not obj.flags.writeable or any(s < 0 for s in obj.strides):
            obj = np.array(obj)                 # a writable, C-contiguous copy
        return torch.from_numpy(obj)
    if isinstance(obj, np.generic):
        return torch.as_tensor(obj) if obj.dtype in _TORCH_DTYPES else obj
    if isinstance(obj, list):
        return [to_torch(x) for x in obj]
    if isinstance(obj, tuple):
        return tuple(to_torch(x) for x in obj)
    if isinstance(obj, Mapping):
        return {k: to_torch(v) for k, v in obj.items()}
    return obj


def _close(df):
    """``df.close()``, which stops the workers of ``df`` and of the dataflows it reads from; a
    dataflow-like object without ``close`` is left alone."""
    close = getattr(df, "close", None)
    if callable(close):
        close()


class DataFlowIterableDataset(IterableDataset):
    """A ``torch.utils.data.IterableDataset`` over a dataflow; make it with
    :func:`as_iterable_dataset`, which documents it."""

    def __init__(self, df, epochs=None):
        if not (callable(getattr(df, "reset_state", None))
                and callable(getattr(df, "__iter__", None))):
            raise TypeError(f"as_iterable_dataset needs a DataFlow (an object with __iter__ and "
                            f"reset_state), got {type(df).__name__}: {df!r:.60}")
        if epochs is not None and (not is_int(epochs) or epochs < 1):
            raise ValueError(f"epochs must be None or a positive int, got {epochs!r}")
        self.df = df
        self.epochs = None if epochs is None else int(epochs)
        self.epochs_started = 0
        self.closed = False
        self._reset_in_pid = None      # the process where df.reset_state() was called
        self._finalizer = weakref.finalize(self, _close, df)

    def __len__(self):
        """The number of datapoints of one pass of the dataflow; ``TypeError`` if unknown."""
        try:
            return len(self.df)
        except NotImplementedError as e:
            raise TypeError(f"the length of {type(self.df).__name__} is unknown: {e}") from None

    def __iter__(self):
        """Start one pass (epoch) of the dataflow; its datapoints come with tensors for arrays."""
        if get_worker_info() is not None:
            raise RuntimeError(
                "a dataflow's IterableDataset is being iterated in a DataLoader worker process. "
                "The dataflow runs its own workers (num_parallel_workers, MultiProcessMapData), "
                "so create the DataLoader with num_workers=0 (and batch_size=None when the "
                "dataflow batches).")
        if self.closed:
            raise RuntimeError("this dataset was closed (close(), or all its epochs are done); "
                               "make a new one with as_iterable_dataset()")
        if self.epochs is not None and self.epochs_started >= self.epochs:
            raise RuntimeError(f"all {self.epochs} epochs of this dataset are done")
        if self._reset_in_pid != os.getpid():
            self.df.reset_state()      # once per process, lazily: starts the dataflow's workers
            self._reset_in_pid = os.getpid()
        self.epochs_started += 1
        self._in_epoch = True
        return self._one_pass(iter(self.df))

    _in_epoch = False

    def _one_pass(self, it):
        try:
            for dp in it:
                yield to_torch(dp)
            self._in_epoch = False
        finally:
            if self.epochs is not None and self.epochs_started >= self.epochs:
                self.close()           # the last epoch has ended (or was abandoned)

    def state_dict(self, *, replay=False):
        """The dataflow's ``state_dict(replay=replay)`` and the epochs done (so that torchdata's
        ``StatefulDataLoader(ds, batch_size=None, num_workers=0)`` checkpoints the pipeline);
        JSON types only."""
        return {"dataflow": self.df.state_dict(replay=replay),
                "epochs_done": self.epochs_started - int(self._in_epoch)}

    def load_state_dict(self, state):
        """Continue from ``state``: the next ``iter()`` continues the interrupted epoch."""
        self.df.load_state_dict(state["dataflow"])
        self.epochs_started = int(state["epochs_done"])
        self._in_epoch = False

    def close(self):
        """Stop the dataflow's workers now (``df.close()``, which also closes the dataflows it
        reads from); idempotent. Also done when the dataset is garbage collected and at
        interpreter exit."""
        self.closed = True
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __getstate__(self):
        raise TypeError("a dataflow's IterableDataset cannot be pickled, so it cannot go to "
                        "DataLoader worker processes: use DataLoader(..., num_workers=0); the "
                        "dataflow runs its own workers")

    def __repr__(self):
        return (f"{type(self).__name__}({type(self.df).__name__}, epochs={self.epochs}, "
                f"epochs_started={self.epochs_started}, closed={self.closed})")


def as_iterable_dataset(df, *, epochs=None):
    """A ``torch.utils.data.IterableDataset`` that yields the datapoints of the dataflow ``df``
    with their numpy arrays as tensors.

    * ``df.reset_state()`` is called once, lazily, at the first ``iter()`` in the process that
      iterates (so the dataflow's workers start there, not when the dataset is made). Do not
      call it yourself.
    * Each ``iter()`` is one pass (epoch) of ``df``. With ``epochs=N``, at most ``N`` passes:
      the dataflow's workers are closed when the ``N``-th pass ends (or is abandoned), and a
      further ``iter()`` raises ``RuntimeError``. With ``epochs=None``, any number of passes.
    * Arrays become tensors by :func:`to_torch`: ``torch.from_numpy``, without a copy.
    * ``close()`` (or ``with``, or garbage collection of the dataset) calls ``df.close()``,
      which stops the workers of ``df`` and of the dataflows it reads from.
    * Use it with ``DataLoader(ds, batch_size=None, num_workers=0)``: the dataflow has its own
      workers and batches itself. Iterating in a ``DataLoader`` worker process raises
      ``RuntimeError``; pickling raises ``TypeError``.
    * ``state_dict()`` / ``load_state_dict()`` are the dataflow's (plus the epochs done), so
      torchdata's ``StatefulDataLoader(ds, batch_size=None, num_workers=0)`` checkpoints and
      resumes the pipeline exactly (see "Checkpoint and resume" in the README).
    """
    return DataFlowIterableDataset(df, epochs)
