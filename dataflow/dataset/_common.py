"""What every dataset reader shares: a shuffled or ordered pass over in-memory datapoints, the
lazy import of an optional dependency with an error naming the ``datasets`` extra, and the
reading of a text list whose undecodable line is named."""
import importlib


from .. import checkpoint as _ckpt
from ..base import RNGDataFlow

__all__ = ["IndexedDataset", "require", "read_lines"]


def require(module, user):
    """``import module`` or raise ImportError naming ``user`` and the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        package = {"cv2": "opencv-python-headless", "scipy.io": "scipy"}.get(module, module)
        raise ImportError(f"{user} needs {package}: pip install 'dataflow-rt[datasets]'") from e


def read_lines(path):
    """The lines of text file ``path`` as ``open(path)`` gives them (the locale's encoding,
    universal newlines, line ends kept). A file that does not decode raises ValueError naming
    it and its first undecodable line (counted from 1), not a bare UnicodeDecodeError."""
    with open(path) as f:
        try:
            return list(f)
        except UnicodeDecodeError as e:
            encoding, error = f.encoding, e
    with open(path, "rb") as f:                 # find the line: '\n' is never inside a character
        for i, raw in enumerate(f):
            try:
                raw.decode(encoding)
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}, line {i + 1}: not {encoding} text ({e})") from None
    raise ValueError(f"{path}: not {encoding} text ({error})") from None


class IndexedDataset(_ckpt.IndexedSource, RNGDataFlow):
    """Base of the readers: ``len(self)`` items, item ``k`` given by ``self._get(k)``; each pass
    visits every item once, in index order, or with ``self.shuffle`` in a fresh random order
    (keyed by a seed drawn from ``self.rng`` and the pass, so that ``state_dict()`` is a
    position and a resume is exact: :class:`~dataflow.checkpoint.IndexedSource`)."""

    shuffle = True

    def _get(self, k):
        raise NotImplementedError

    def reset_state(self):
        super().reset_state()
        self._reset_indexed()

    def __iter__(self):
        # the pass begins at iter(), not at the first next() (see checkpoint.PassPosition)
        indices, start = self._pass_indices()
        return self._counted_items((self._get(k) for k in indices), start)
