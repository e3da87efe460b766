"""CIFAR-10 and CIFAR-100 from the "python version" archives, as tensorpack reads them.

The batch files are Python pickles (that is how the dataset is distributed): read only files
from the official archive or a mirror you trust.
"""
import os
import pickle

import numpy as np

from ._common import IndexedDataset
from .download import dataset_url, download, extract_tar, get_dataset_path

__all__ = ["CifarBase", "Cifar10", "Cifar100"]

_LAYOUT = {   # classnum: (folder, archive, archive size, train files, test files, label key, meta)
    10: ("cifar-10-batches-py", "cifar-10-python.tar.gz", 170498071,
         [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "labels",
         ("batches.meta", "label_names")),
    100: ("cifar-100-python", "cifar-100-python.tar.gz", 169001437, ["train"], ["test"],
          "fine_labels", ("meta", "fine_label_names")),
}
_BASE_URL = "https://www.cs.toronto.edu/~kriz/"


def _get(d, key):
    """``d[key]`` for a dict pickled by Python 2 (bytes keys) or 3 (str keys)."""
    if key in d:
        return d[key]
    return d[key.encode()]


def _read_batch(path, label_key):
    try:
        with open(path, "rb") as f:
            d = pickle.load(f, encoding="bytes")
        data = np.asarray(_get(d, "data"), dtype=np.uint8)
        labels = [int(x) for x in _get(d, label_key)]
    except FileNotFoundError:
        raise
    except Exception as e:
        raise ValueError(f"{path}: not a CIFAR batch (truncated or corrupted?): "
                         f"{type(e).__name__}: {e}") from e
    if data.ndim != 2 or data.shape[1] != 3072 or len(data) != len(labels):
        raise ValueError(f"{path}: expected an (N, 3072) data array and N labels, got "
                         f"{data.shape} and {len(labels)}")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels


class CifarBase(IndexedDataset):
    """CIFAR images: datapoints ``[image, label]``, ``image`` uint8 (32, 32, 3) **RGB** (a
    C-contiguous array), ``label`` an ``int``.

    ``dir`` defaults to ``get_dataset_path('cifar10_data')`` (or ``cifar100_data``); when the
    extracted folder is missing there, the archive is downloaded and extracted. ``shuffle=None``
    shuffles the train split only. Unlike tensorpack, the number of rows is read from the files
    (it does not assume 10000 per batch, nor look for "train" in the path).
    """

    def __init__(self, train_or_test, shuffle=None, dir=None, cifar_classnum=10):
        if train_or_test not in ("train", "test"):
            raise ValueError(f"Cifar: train_or_test must be 'train' or 'test', "
                             f"got {train_or_test!r}")
        if cifar_classnum not in _LAYOUT:
            raise ValueError(f"Cifar: cifar_classnum must be 10 or 100, got {cifar_classnum!r}")
        self.cifar_classnum = cifar_classnum
        self.train_or_test = train_or_test
        self.shuffle = (train_or_test == "train") if shuffle is None else shuffle
        self.dir = dir if dir is not None else get_dataset_path(f"cifar{cifar_classnum}_data")
        folder, archive, size, *_ = _LAYOUT[cifar_classnum]
        if not os.path.isdir(os.path.join(self.dir, folder)):
            path = download(dataset_url(f"cifar{cifar_classnum}", _BASE_URL, archive), self.dir,
                            expect_size=size)
            extract_tar(path, self.dir)
        self.fs = self._files([train_or_test])      # tensorpack's attribute: the batch files
        self.images, self.labels = self._load(self.fs)

    def _files(self, names):
        folder, _, _, train, test, *_ = _LAYOUT[self.cifar_classnum]
        if isinstance(names, str) or not names or any(n not in ("train", "test") for n in names):
            raise ValueError(f"Cifar: names must be a non-empty sequence of 'train' and 'test', "
                             f"got {names!r}")
        files = []
        for name in names:
            for f in {"train": train, "test": test}[name]:
                path = os.path.join(self.dir, folder, f)
                if not os.path.isfile(path):
                    raise ValueError(f"Failed to find file: {path}")
                files.append(path)
        return files

    def _load(self, files):
        label_key = _LAYOUT[self.cifar_classnum][5]
        parts = [_read_batch(p, label_key) for p in files]
        images = np.ascontiguousarray(np.concatenate([p[0] for p in parts]))
        labels = [label for p in parts for label in p[1]]
        return images, labels

    def __len__(self):
        return len(self.labels)

    def _get(self, k):
        return [self.images[k], self.labels[k]]

    @property
    def data(self):
        """tensorpack's ``Cifar.data``: the datapoints ``[image, label]`` of the split, in file
        order, as a list (code written for tensorpack slices it, e.g.
        ``DataFromList(ds.data[:n], shuffle=False)``). A new list on each access; its images are
        views of ``self.images``."""
        return [[img, label] for img, label in zip(self.images, self.labels)]

    def get_per_pixel_mean(self, names=("train", "test")):
        """The mean image (float32 (32, 32, 3), RGB) over the given splits."""
        images, _ = self._load(self._files(names))
        return images.mean(axis=0, dtype=np.float64).astype(np.float32)

    def get_per_channel_mean(self, names=("train", "test")):
        """The mean of each channel (float32 (3,), RGB) over the given splits."""
        return self.get_per_pixel_mean(names).mean(axis=(0, 1))

    def get_label_names(self):
        """The class names, in label order."""
        folder = _LAYOUT[self.cifar_classnum][0]
        meta_file, key = _LAYOUT[self.cifar_classnum][6]
        path = os.path.join(self.dir, folder, meta_file)
        try:
            with open(path, "rb") as f:
                meta = pickle.load(f)
            names = _get(meta, key)
        except FileNotFoundError:
            raise
        except Exception as e:
            raise ValueError(f"{path}: not a CIFAR meta file (truncated or corrupted?): "
                             f"{type(e).__name__}: {e}") from e
        return [n.decode() if isinstance(n, bytes) else n for n in names]


class Cifar10(CifarBase):
    """CIFAR-10 (see :class:`CifarBase`)."""

    def __init__(self, train_or_test, shuffle=None, dir=None):
        super().__init__(train_or_test, shuffle, dir, 10)


class Cifar100(CifarBase):
    """CIFAR-100 with the fine labels (see :class:`CifarBase`)."""

    def __init__(self, train_or_test, shuffle=None, dir=None):
        super().__init__(train_or_test, shuffle, dir, 100)
