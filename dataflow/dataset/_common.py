"""What every dataset reader shares: a shuffled or ordered pass over in-memory datapoints, and
the lazy import of an optional dependency with an error naming the ``datasets`` extra."""
import importlib

import numpy as np

from ..base import RNGDataFlow
from ..raw import _require_rng

__all__ = ["IndexedDataset", "require"]


def require(module, user):
    """``import module`` or raise ImportError naming ``user`` and the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        package = {"cv2": "opencv-python-headless", "scipy.io": "scipy"}.get(module, module)
        raise ImportError(f"{user} needs {package}: pip install 'dataflow-rt[datasets]'") from e


class IndexedDataset(RNGDataFlow):
    """Base of the readers: ``len(self)`` items, item ``k`` given by ``self._get(k)``; each pass
    visits every item once, in a fresh random order from ``self.rng`` when ``self.shuffle``."""

    shuffle = True

    def _get(self, k):
        raise NotImplementedError

    def __iter__(self):
        idxs = np.arange(len(self))
        if self.shuffle:
            _require_rng(self).shuffle(idxs)
        for k in idxs:
            yield self._get(k)
