"""The Street View House Numbers digits (cropped 32x32 format)."""
import os
import threading

import numpy as np

from .._helpers import check_flag
from ._common import IndexedDataset, require
from .download import dataset_url, download, get_dataset_path

__all__ = ["SVHNDigit"]

_URL = "http://ufldl.stanford.edu/housenumbers/"


class SVHNDigit(IndexedDataset):
    """SVHN digits: datapoints ``[image, label]``, ``image`` uint8 (32, 32, 3) **RGB**,
    ``label`` ``np.uint8`` in 0..9 (the file's 10 is digit 0). ``name`` is 'train', 'test' or
    'extra'; ``data_dir/<name>_32x32.mat`` is downloaded if missing (``data_dir`` defaults to
    ``get_dataset_path('svhn_data')``). Files already read are cached per path in the process
    (tensorpack caches per split name, so a second ``data_dir`` got the first one's data)."""

    _Cache = {}
    _lock = threading.Lock()

    def __init__(self, name, data_dir=None, shuffle=True):
        sio = require("scipy.io", "SVHNDigit")
        if name not in ("train", "test", "extra"):
            raise ValueError(f"SVHNDigit: name must be 'train', 'test' or 'extra', "
                             f"got {name!r}")
        self.name = name
        check_flag("SVHNDigit: shuffle", shuffle)      # None keeps its meaning
        self.shuffle = shuffle
        data_dir = data_dir if data_dir is not None else get_dataset_path("svhn_data")
        path = os.path.join(data_dir, name + "_32x32.mat")
        key = os.path.abspath(path)
        with self._lock:
            cached = self._Cache.get(key)
        if cached is None:
            if not os.path.isfile(path):
                download(dataset_url("svhn", _URL, name + "_32x32.mat"), data_dir)
            cached = _load(sio, path)
            with self._lock:
                self._Cache[key] = cached
        self.X, self.Y = cached

    def __len__(self):
        return len(self.X)

    def _get(self, k):
        return [self.X[k], self.Y[k]]

    @staticmethod
    def get_per_pixel_mean(names=("train", "test", "extra")):
        """The mean image (float64 (32, 32, 3), RGB, as tensorpack's) over the given splits of
        the default ``data_dir``."""
        images = np.concatenate([SVHNDigit(n, shuffle=False).X for n in names])
        return images.mean(axis=0, dtype=np.float64)


def _load(sio, path):
    try:
        data = sio.loadmat(path)
        X = np.ascontiguousarray(np.asarray(data["X"], np.uint8).transpose(3, 0, 1, 2))
        Y = np.asarray(data["y"]).reshape(-1).astype(np.uint8)
    except FileNotFoundError:
        raise
    except Exception as e:
        raise ValueError(f"{path}: not an SVHN .mat file (truncated or corrupted?): "
                         f"{type(e).__name__}: {e}") from e
    if X.shape[1:] != (32, 32, 3) or len(X) != len(Y):
        raise ValueError(f"{path}: X {X.shape[1:]} x {len(X)} and {len(Y)} labels, expected "
                         "(32, 32, 3) images and one label each")
    Y[Y == 10] = 0
    return X, Y
