"""``NumpySerializer``: a whole dataflow in one ``.npz`` file, as tensorpack writes it.

Layout (tensorpack 0.11's): a zip (deflate) holding one member, ``buffer.npy``, an object-dtype
array of the datapoints, so the datapoints inside are pickled. We write a 1-D object array with
one element per datapoint (the datapoint itself, a list), which tensorpack's reader yields
unchanged; tensorpack writes ``np.asarray(datapoints, dtype=object)``, whose shape numpy infers
(``(N, 2)`` for ``[array, int]`` datapoints), and we read that too: each row comes back as a list
of its components.

Loading unpickles: load only files you trust. The whole dataflow is held in memory on both
save and load; use LMDB for anything large.
"""
import os
import pickle
import zipfile

import numpy as np

from ..base import check_dataflow
from ..raw import DataFromList
from ._files import as_path, write_aside

__all__ = ["NumpySerializer"]


def _size_for_progress(df):
    try:
        return len(df)
    except NotImplementedError:
        return None


class NumpySerializer:
    """Save a dataflow to, and load it from, a compressed ``.npz`` file (see the module doc)."""

    @staticmethod
    def save(df, path):
        """Iterate ``df`` once (after ``reset_state()``) and write all its datapoints to
        ``path`` (``.npz`` is appended if missing, as numpy does). The file is written under a
        temporary name beside ``path`` and renamed when complete."""
        df = check_dataflow(df, "NumpySerializer.save")
        path = as_path("NumpySerializer.save", path)
        if not os.path.basename(path):       # "" or "dir/": a file named ".npz"
            raise ValueError(f"NumpySerializer.save: path must name a file, got {path!r}")
        df.reset_state()
        _size_for_progress(df)      # as tensorpack: len() errors other than "unknown" propagate
        datapoints = list(df)
        buffer = np.empty(len(datapoints), dtype=object)
        for i, dp in enumerate(datapoints):
            buffer[i] = dp
        if not path.endswith(".npz"):
            path += ".npz"
        with write_aside(path) as tmp:
            try:
                with open(tmp, "wb") as f:
                    np.savez_compressed(f, buffer=buffer)
            except Exception as e:
                raise _which_datapoint_fails(datapoints, path, e) from e

    @staticmethod
    def load(path, shuffle=True):
        """A ``DataFromList`` of the datapoints saved in ``path`` (``path + '.npz'`` if
        ``path`` does not exist). Raises ``ValueError`` naming the file if it is not a readable
        NumpySerializer file (truncated, corrupted, or without a ``buffer`` member)."""
        path = as_path("NumpySerializer.load", path)
        if not os.path.exists(path) and os.path.exists(path + ".npz"):
            path += ".npz"
        members, buffer = None, None
        try:
            with np.load(path, allow_pickle=True) as npz:
                members = npz.files
                if "buffer" in members:
                    buffer = npz["buffer"]
        except FileNotFoundError:
            raise
        except Exception as e:      # all of it is reading the file: zipfile, zlib, unpickling
            raise ValueError(f"{path}: cannot read member 'buffer.npy' of this NumpySerializer "
                             f"file (truncated or corrupted?): {type(e).__name__}: {e}") from e
        if buffer is None:
            raise ValueError(f"{path}: no 'buffer' member (members: {members}); not a file "
                             "written by NumpySerializer.save")
        if buffer.dtype != object:
            raise ValueError(f"{path}: member 'buffer.npy' has dtype {buffer.dtype}, expected an "
                             "object array of datapoints")
        if buffer.ndim == 1:
            datapoints = list(buffer)
        else:
            datapoints = [list(row) for row in buffer]
        return DataFromList(datapoints, shuffle=shuffle)


def _which_datapoint_fails(datapoints, path, error):
    for i, dp in enumerate(datapoints):
        try:
            pickle.dumps(dp, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            return TypeError(f"{path}: datapoint {i} cannot be saved (it cannot be pickled: "
                             f"{type(e).__name__}: {e})")
    return OSError(f"{path}: writing failed: {type(error).__name__}: {error}")
