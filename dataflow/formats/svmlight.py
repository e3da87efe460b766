"""``SVMLightData``: the rows of an SVMlight / libsvm text file, via scikit-learn."""
import os

import numpy as np

from .. import checkpoint as _ckpt
from .._helpers import check_flag
from ..base import RNGDataFlow
from ._files import as_path, require

__all__ = ["SVMLightData"]


class SVMLightData(_ckpt.IndexedSource, RNGDataFlow):
    """Datapoints ``[x, y]`` of an SVMlight file: ``x`` a dense 1-D float64 row of the feature
    matrix, ``y`` its label (``np.float64``), as tensorpack yields them. The file is read fully
    in the constructor by ``sklearn.datasets.load_svmlight_file``. With ``shuffle`` each pass
    uses a fresh random order (call ``reset_state()`` first), keyed by a seed drawn from
    ``self.rng`` and the pass, so that ``state_dict()`` is a position and a resume is exact.
    Needs scikit-learn (``pip install 'dataflow-rt[formats]'``), imported on construction."""

    def __init__(self, filename, shuffle=True):
        datasets = require("sklearn.datasets", "SVMLightData", "formats")
        self.filename = as_path("SVMLightData", filename, "filename")
        check_flag("SVMLightData: shuffle", shuffle)
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

    def reset_state(self):
        super().reset_state()
        self._reset_indexed()

    def __iter__(self):
        # the pass begins at iter(), not at the first next() (see checkpoint.PassPosition)
        indices, start = self._pass_indices()
        X, y = self.X, self.y
        return self._counted_items(([X[k, :], y[k]] for k in indices), start)
