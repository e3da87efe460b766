"""Places365-Standard in its "easy directory structure", as tensorpack reads it."""
import os

from ._common import IndexedDataset, read_lines, require
from .ilsvrc import _imread

__all__ = ["Places365Standard"]


class Places365Standard(IndexedDataset):
    """Places365-Standard: datapoints ``[image, label]``, ``image`` uint8 **BGR** (OpenCV),
    ``label`` the index of the image's class name among the sorted class names of the list.

    ``dir/<name>.txt`` ('train' or 'val') lists one image per line as a path relative to
    ``dir`` (``~`` expanded) whose second component is the class name
    (``val/airfield/0001.jpg``).
    ``shuffle=None`` shuffles the train split only."""

    def __init__(self, dir, name, shuffle=None):
        self._cv2 = require("cv2", "Places365Standard")
        if name not in ("train", "val"):
            raise ValueError(f"Places365Standard: name must be 'train' or 'val', got {name!r}")
        self.name = name
        self.shuffle = (name == "train") if shuffle is None else shuffle
        dir = os.path.expanduser(dir)
        listing = os.path.join(dir, name + ".txt")
        entries = []
        for i, line in enumerate(read_lines(listing)):
            rel = line.strip()
            if not rel:
                continue
            parts = rel.split("/")
            if len(parts) < 3:
                raise ValueError(f"{listing}, line {i + 1}: expected '<split>/<class>/"
                                 f"<file>', got {rel!r}")
            entries.append((os.path.join(dir, rel), parts[1]))
        self.label_names = sorted({cls for _, cls in entries})
        index = {n: i for i, n in enumerate(self.label_names)}
        self.imglist = [(path, index[cls]) for path, cls in entries]

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_cv2", None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._cv2 = require("cv2", "Places365Standard")

    def get_label_names(self):
        """The class names, in label order."""
        return list(self.label_names)

    def __len__(self):
        return len(self.imglist)

    def _get(self, k):
        path, label = self.imglist[k]
        return [_imread(self._cv2, path), label]
