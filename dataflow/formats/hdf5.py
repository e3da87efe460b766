"""HDF5 files as tensorpack writes and reads them: ``HDF5Serializer`` and ``HDF5Data``.

Layout: one HDF5 dataset per entry of ``data_paths`` (the name verbatim, so ``'grp/label'`` is
dataset ``label`` in group ``grp``), holding component ``i`` of every datapoint stacked along
axis 0: shape ``(N, *component_shape)``, dtype as numpy infers it; Python ``str`` or ``bytes``
components as variable-length strings (read back as ``bytes``, as from tensorpack's files). No
chunking, no compression.
Needs h5py (``pip install 'dataflow-rt[formats]'``), imported on first use.
"""
import os

import numpy as np

from .. import checkpoint as _ckpt
from .._helpers import check_flag
from ..base import RNGDataFlow, check_dataflow
from ._files import as_path, require, write_aside

__all__ = ["HDF5Serializer", "HDF5Data"]


def _h5py(user):
    return require("h5py", user, "formats")


class HDF5Data(_ckpt.IndexedSource, RNGDataFlow):
    """The datapoints of an HDF5 file: datapoint ``k`` is ``[f[p][k] for p in data_paths]``
    (rows of the datasets; numpy scalars for 1-D datasets).

    Every dataset is read fully into memory in the constructor and the file is closed again
    (so the dataflow can be sent to worker processes). The datasets must have equal lengths.
    With ``shuffle`` each pass visits the datapoints in a fresh random order from ``self.rng``
    (call ``reset_state()`` first).
    """

    def __init__(self, filename, data_paths, shuffle=True):
        h5py = _h5py("HDF5Data")
        self.filename = as_path("HDF5Data", filename, "filename")
        if isinstance(data_paths, (str, bytes)):       # its letters would be the paths
            raise TypeError(f"HDF5Data({self.filename!r}): data_paths must be a list of dataset "
                            f"paths, got the string {data_paths!r}")
        paths = list(data_paths) if hasattr(data_paths, "__iter__") else None
        if paths is None or not all(isinstance(d, str) for d in paths):
            raise TypeError(f"HDF5Data({self.filename!r}): data_paths must be a list of dataset "
                            f"paths (str), got {data_paths!r:.80}")
        self.data_paths = paths
        check_flag("HDF5Data: shuffle", shuffle)
        self.shuffle = shuffle
        if not self.data_paths:
            raise ValueError(f"HDF5Data({self.filename!r}): data_paths is empty")
        try:
            f = h5py.File(self.filename, "r")
        except FileNotFoundError:
            raise
        except OSError as e:
            if not os.path.exists(self.filename):
                raise FileNotFoundError(f"{self.filename}: no such file") from e
            raise ValueError(f"{self.filename}: not a readable HDF5 file (truncated or "
                             f"corrupted?): {e}") from e
        self.dps = []
        with f:
            for p in self.data_paths:
                # h5py reports a damaged file as KeyError, RuntimeError, OSError or ValueError
                # from any of these steps: each names the file, and a KeyError means only
                # "no such dataset"
                try:
                    node = f[p] if p in f else None
                    names = sorted(f.keys()) if node is None else None
                except Exception as e:
                    raise ValueError(f"{self.filename}: cannot open {p!r} (truncated or "
                                     f"corrupted?): {type(e).__name__}: {e}") from e
                if node is None:
                    raise KeyError(f"{self.filename}: no dataset {p!r} (top-level names: "
                                   f"{names})")
                if not isinstance(node, h5py.Dataset):
                    raise ValueError(f"{self.filename}: {p!r} is a group, not a dataset")
                try:
                    self.dps.append(node[...])
                except Exception as e:
                    raise ValueError(f"{self.filename}: cannot read dataset {p!r} (truncated "
                                     f"or corrupted?): {type(e).__name__}: {e}") from e
        lengths = [len(d) if d.ndim else None for d in self.dps]
        if None in lengths or len(set(lengths)) != 1:
            shapes = {p: d.shape for p, d in zip(self.data_paths, self.dps)}
            raise ValueError(f"{self.filename}: datasets {self.data_paths} need one row per "
                             f"datapoint and equal lengths, got shapes {shapes}")
        self._size = lengths[0]

    def __len__(self):
        return self._size

    def reset_state(self):
        super().reset_state()
        self._reset_indexed()

    def __iter__(self):
        # the pass begins at iter(), not at the first next() (see checkpoint.PassPosition)
        indices, start = self._pass_indices()
        dps = self.dps
        return self._counted_items(([d[k] for d in dps] for k in indices), start)


class HDF5Serializer:
    """Save a dataflow to, and load it from, an HDF5 file (see the module doc)."""

    @staticmethod
    def save(df, path, data_paths):
        """Iterate ``df`` once (after ``reset_state()``) and write component ``i`` of every
        datapoint to dataset ``data_paths[i]``. Every datapoint (a list or tuple; an array's
        rows are its components, as in tensorpack) must have ``len(data_paths)`` components,
        and each component the same shape in every datapoint;
        otherwise ``ValueError`` names the file, the datapoint and the dataset. The file is
        written under a temporary name beside ``path`` and renamed when complete."""
        h5py = _h5py("HDF5Serializer")
        df = check_dataflow(df, "HDF5Serializer.save")
        path = as_path("HDF5Serializer.save", path)
        if isinstance(data_paths, (str, bytes)):
            raise TypeError(f"HDF5Serializer.save: data_paths must be a list of dataset names, "
                            f"one per component, got the string {data_paths!r}")
        data_paths = list(data_paths)
        for name in data_paths:
            if not isinstance(name, str) or not name.strip("/"):
                raise (ValueError if isinstance(name, str) else TypeError)(
                    f"HDF5Serializer.save: each of data_paths must name a dataset (a non-empty "
                    f"str such as 'label' or 'group/x'), got {name!r} in {data_paths!r}")
        df.reset_state()
        try:
            len(df)
        except NotImplementedError:
            pass
        columns = [[] for _ in data_paths]
        for i, dp in enumerate(df):
            # a dict's keys would be saved as its values; an array's rows are its components,
            # as tensorpack zips them
            if not (isinstance(dp, (list, tuple)) or
                    isinstance(dp, np.ndarray) and dp.ndim):
                raise TypeError(f"{path}: datapoint {i} is a {type(dp).__name__}; "
                                "HDF5Serializer.save writes list, tuple or array datapoints")
            if len(dp) != len(data_paths):
                raise ValueError(f"{path}: datapoint {i} has {len(dp)} components but "
                                 f"data_paths has {len(data_paths)} ({data_paths})")
            for col, comp in zip(columns, dp):
                col.append(comp)
        arrays = []
        for p, col in zip(data_paths, columns):
            strings = _string_column(col, path, p, h5py)
            if strings is not None:
                arrays.append(strings)
                continue
            try:
                arr = np.asarray(col)
            except ValueError as e:
                arr = None
                cause = e
            if arr is None or arr.dtype == object:
                raise ValueError(f"{path}: the components for dataset {p!r} cannot be stacked "
                                 f"into one array ({_first_mismatch(col)})") from (
                                     cause if arr is None else None)
            arrays.append(arr)
        with write_aside(path) as tmp:
            with h5py.File(tmp, "w") as f:
                for p, arr in zip(data_paths, arrays):
                    try:
                        f.create_dataset(p, data=arr)
                    except (TypeError, ValueError) as e:
                        raise ValueError(f"{path}: cannot write dataset {p!r} of dtype "
                                         f"{arr.dtype}: {e}") from e

    @staticmethod
    def load(path, data_paths, shuffle=True):
        """``HDF5Data(path, data_paths, shuffle)``."""
        return HDF5Data(path, data_paths, shuffle=shuffle)


def _string_column(col, path, p, h5py):
    """Python ``str`` (or ``bytes``) components as an object array for a variable-length UTF-8
    (or byte) string dataset, which h5py reads back as ``bytes``, as tensorpack's files hold
    them (numpy's fixed-length ``'U'`` has no HDF5 type and its ``'S'`` drops trailing NUL
    bytes); None for any other column. HDF5's strings end at a NUL, so a component holding
    one raises ``ValueError`` naming it rather than being cut short."""
    if not col:
        return None
    if all(isinstance(c, str) for c in col):
        encoding, nul = "utf-8", "\0"
    elif all(isinstance(c, bytes) for c in col):
        encoding, nul = "ascii", b"\0"
    else:
        return None
    for i, c in enumerate(col):
        if nul in c:
            raise ValueError(f"{path}: datapoint {i}: the {type(c).__name__} component for "
                             f"dataset {p!r} holds a NUL, which HDF5 strings cannot store "
                             "(store it as a uint8 array instead)")
    return np.array(col, dtype=h5py.string_dtype(encoding))


def _shape(c):
    try:
        return np.shape(c)
    except ValueError:          # a ragged nested list has no shape
        return "ragged"


def _first_mismatch(col):
    if not col:
        return "no datapoints"
    first = _shape(col[0]), type(col[0]).__name__
    for i, c in enumerate(col):
        here = _shape(c), type(c).__name__
        if here != first:
            return (f"datapoint 0 has shape {first[0]} ({first[1]}), datapoint {i} has shape "
                    f"{here[0]} ({here[1]})")
    if first[0] == "ragged":
        return f"datapoint 0 has a ragged {first[1]} (nested sequences of unequal lengths)"
    return f"components of type {first[1]} have no HDF5 dtype"
