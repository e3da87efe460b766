"""``SVMLightData``: the rows of an SVMlight / libsvm text file, via scikit-learn."""
import os

import numpy as np

from ..base import RNGDataFlow
from ..raw import _require_rng
from ._files import require

__all__ = ["SVMLightData"]


class SVMLightData(RNGDataFlow):
    """Datapoints ``[x, y]`` of an SVMlight file: ``x`` a dense 1-D float64 row of the feature
    matrix, ``y`` its label (``np.float64``), as tensorpack yields them. The file is read fully
    in the constructor by ``sklearn.datasets.load_svmlight_file``. With ``shuffle`` each pass
    uses a fresh random order from ``self.rng`` (call ``reset_state()`` first).
    Needs scikit-learn (``pip install 'dataflow-rt[formats]'``), imported on construction."""

    def __init__(self, filename, shuffle=True):
        datasets = require("sklearn.datasets", "SVMLightData", "formats")
        self.filename = os.fspath(filename)
        self.shuffle = shuffle
        if not os.path.exists(self.filename):
            raise FileNotFoundError(f"{self.filename}: no such file")
        try:
            X, y = datasets.load_svmlight_file(self.filename)
        except (ValueError, UnicodeDecodeError) as e:
            raise ValueError(f"{self.filename}: not a valid SVMlight file: {e}") from e
        self.X = np.asarray(X.todense())
        self.y = y

    def __len__(self):
        return len(self.y)

    def __iter__(self):
        idxs = np.arange(len(self.y))
        if self.shuffle:
            _require_rng(self).shuffle(idxs)
        for k in idxs:
            yield [self.X[k, :], self.y[k]]
