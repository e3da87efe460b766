"""MNIST and Fashion-MNIST from their gzip IDX files, as tensorpack reads them."""
import gzip
import os
import zlib

import numpy as np

from .._helpers import check_flag
from ._common import IndexedDataset
from .download import dataset_url, download, get_dataset_path

__all__ = ["Mnist", "FashionMnist"]

_FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
          "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}
_IMAGES_MAGIC, _LABELS_MAGIC = 2051, 2049


def _read_idx(path, magic):
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as e:
        raise ValueError(f"{path}: not a readable gzip file (truncated or corrupted? delete it to "
                         f"download it again): {e}") \
            from e
    ndim = 3 if magic == _IMAGES_MAGIC else 1
    header = 4 * (1 + ndim)
    if len(data) < header:
        raise ValueError(f"{path}: too short for an IDX header")
    found = int.from_bytes(data[:4], "big")
    if found != magic:
        raise ValueError(f"{path}: invalid magic number {found}, expected {magic}")
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    count = int(np.prod(shape))
    if len(data) - header < count:      # (bytes after the data are ignored, as tensorpack does)
        raise ValueError(f"{path}: {len(data) - header} bytes of data, the header "
                         f"announces {shape} = {count}")
    return np.frombuffer(data, np.uint8, count, header).reshape(shape)


class Mnist(IndexedDataset):
    """MNIST digits: datapoints ``[image, label]``, ``image`` float32 (28, 28) in [0, 1] (the
    files' rows x columns: an IDX file of other sizes is read as it says, where tensorpack
    reshaped every image to 28 x 28), ``label`` ``np.uint8``. The split is read into memory in
    the constructor; missing files of the split are downloaded first into ``dir`` (default
    ``get_dataset_path('mnist_data')``)."""

    _NAME, _DIR = "mnist", "mnist_data"
    _BASE_URL = "https://ossci-datasets.s3.amazonaws.com/mnist/"   # tensorpack's host is gone

    def __init__(self, train_or_test, shuffle=True, dir=None):
        if train_or_test not in _FILES:
            raise ValueError(f"{type(self).__name__}: train_or_test must be 'train' or 'test', "
                             f"got {train_or_test!r}")
        self.train_or_test = train_or_test
        check_flag("Mnist: shuffle", shuffle)      # None keeps its meaning
        self.shuffle = shuffle
        self.dir = dir if dir is not None else get_dataset_path(self._DIR)
        paths = [self._maybe_download(name) for name in _FILES[train_or_test]]
        # (N, rows, cols, 1), as tensorpack's attribute (datapoints are views of it)
        self.images = (_read_idx(paths[0], _IMAGES_MAGIC).astype(np.float32) / 255.0)[..., None]
        self.labels = _read_idx(paths[1], _LABELS_MAGIC)
        if len(self.images) != len(self.labels):
            raise ValueError(f"{self.dir}: {len(self.images)} images but {len(self.labels)} "
                             f"labels in the {train_or_test} split")

    def _maybe_download(self, filename):
        path = os.path.join(self.dir, filename)
        if not os.path.isfile(path):
            download(dataset_url(self._NAME, self._BASE_URL, filename), self.dir)
        return path

    def __len__(self):
        return len(self.labels)

    def _get(self, k):
        return [self.images[k, :, :, 0], self.labels[k]]


class FashionMnist(Mnist):
    """Fashion-MNIST: the same files, layout and datapoints as :class:`Mnist`, in
    ``get_dataset_path('fashion_mnist_data')`` by default."""

    _NAME, _DIR = "fashion_mnist", "fashion_mnist_data"
    _BASE_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"

    def get_label_names(self):
        return ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
