"""Caltech 101 Silhouettes (28x28, split 1)."""
import os

import numpy as np

from .._helpers import check_flag
from ._common import IndexedDataset, require
from .download import dataset_url, download, get_dataset_path

__all__ = ["Caltech101Silhouettes"]

_URL = "https://people.cs.umass.edu/~marlin/data/"
_FILE = "caltech101_silhouettes_28_split1.mat"


class Caltech101Silhouettes(IndexedDataset):
    """Caltech 101 Silhouettes: datapoints ``[image, label]``, ``image`` (28, 28) with the
    dtype stored in the file, ``label`` the stored label minus one (0..100). ``name`` is
    'train', 'test' or 'val'; ``dir/caltech101_silhouettes_28_split1.mat`` is downloaded if
    missing (``dir`` defaults to ``get_dataset_path('caltech101_data')``). Needs SciPy."""

    def __init__(self, name, shuffle=True, dir=None):
        sio = require("scipy.io", "Caltech101Silhouettes")
        if name not in ("train", "test", "val"):
            raise ValueError(f"Caltech101Silhouettes: name must be 'train', 'test' or 'val', "
                             f"got {name!r}")
        self.name = name
        check_flag("Caltech101Silhouettes: shuffle", shuffle)      # None keeps its meaning
        self.shuffle = shuffle
        dir = dir if dir is not None else get_dataset_path("caltech101_data")
        path = os.path.join(dir, _FILE)
        if not os.path.isfile(path):
            download(dataset_url("caltech101", _URL, _FILE), dir)
        self._path = path
        try:
            data = sio.loadmat(path)
            self.images = np.asarray(data[name + "_data"]).reshape(-1, 28, 28)
            self.labels = np.asarray(data[name + "_labels"]).reshape(-1) - 1
        except Exception as e:
            raise ValueError(f"{path}: no readable {name}_data / {name}_labels: "
                             f"{type(e).__name__}: {e}") from e
        if len(self.images) != len(self.labels):
            raise ValueError(f"{path}: {len(self.images)} {name} images but "
                             f"{len(self.labels)} labels")

    @property
    def data(self):
        """tensorpack's ``data``: the whole ``.mat`` file as ``scipy.io.loadmat`` gives it (every
        split), read again on each access (so that a copy of this dataflow sent to a worker
        does not carry it)."""
        return require("scipy.io", "Caltech101Silhouettes").loadmat(self._path)

    def __len__(self):
        return len(self.labels)

    def _get(self, k):
        return [self.images[k], self.labels[k]]
