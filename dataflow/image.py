"""tensorpack's image dataflows: :class:`ImageFromFile` and the three that apply
:mod:`dataflow.imgaug` augmentors to datapoints, :class:`AugmentImageComponent`,
:class:`AugmentImageCoordinates` and :class:`AugmentImageComponents`.

The augmenting ones are :class:`~dataflow.MapData`\\ s whose map function is an op
(``.func``) of the same nativeness as its augmentors (see :mod:`dataflow.ops.augment`), so the
function itself may also be run by a parallel ``MapData`` under the run-in-thread table. Their
augmentors draw from the datapoint's own random stream inside the map (see
:mod:`dataflow.imgaug.base`), so with :func:`dataflow.set_seed` the output is reproducible, and
the same as a parallel map's. Differences from tensorpack 0.11, all fixes:

* coordinates may have any floating dtype (float32 included), not only float64;
* a tuple datapoint is copied into a list before its components are replaced (tensorpack
  fails on it);
* with ``catch_exceptions=True`` the first 9 failures, then every 100th, are logged with the
  traceback (what tensorpack did, not what its docstring said), and the failing datapoint is
  dropped (``len()`` is unchanged);
* ``ImageFromFile(shuffle=True)`` shuffles its own copy of ``files``, not the caller's list, and
  a missing or unreadable file raises an error naming it.
"""
import collections.abc
import contextlib
import copy as _copy
import logging
import os
import re
from collections.abc import Sequence

import numpy as np

from . import checkpoint as _ckpt
from ._helpers import check_flag, component
from .base import RNGDataFlow
from .common import MapData, MapDataComponent
from .ops.augment import as_augmentor_list, augmentors_native
from .ops.base import Op

__all__ = ["ImageFromFile", "AugmentImageComponent", "AugmentImageCoordinates",
           "AugmentImageComponents"]

logger = logging.getLogger("dataflow")


def _shape2d(a):
    """tensorpack's ``shape2d``: an int ``a`` is ``[a, a]``, a pair is ``list(a)``."""
    if isinstance(a, (int, np.integer)) and not isinstance(a, bool):
        return [int(a), int(a)]
    if isinstance(a, (list, tuple)) and len(a) == 2 and \
            all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in a):
        return [int(v) for v in a]          # ("4", "5") and (1.5, 4) failed in OpenCV
    raise ValueError(f"Illegal shape: {a!r} (expected an int or a pair (h, w) of ints)")


def _check_image(img, what):
    from .imgaug.base import check_dtype
    try:
        check_dtype(img)
    except TypeError as e:
        raise TypeError(f"{what}: {e}") from None


def _check_coords(coords, what):
    """Coordinates are an ``N x 2`` array of ``(x, y)`` of a floating dtype."""
    if not isinstance(coords, np.ndarray):
        raise TypeError(f"{what}: coordinates must be an N x 2 numpy array of (x, y), got "
                        f"{type(coords).__name__}")
    if coords.ndim != 2 or coords.shape[1] != 2:
        raise ValueError(f"{what}: coordinates must be an N x 2 array of (x, y), got shape "
                         f"{coords.shape}")
    if coords.dtype.kind != "f":
        raise TypeError(f"{what}: coordinates must have a floating dtype (float32 or float64), "
                        f"got {coords.dtype}")


# tensorpack's module helpers, for code that imports them from here (they are not in its
# ``__all__`` either): the same checks this module runs, and the counting exception handler.

def check_dtype(img):
    """``TypeError`` unless ``img`` is a numpy image of dtype uint8 or floating (see
    :func:`dataflow.imgaug.base.check_dtype`; tensorpack's let integer images through)."""
    _check_image(img, "check_dtype")


def validate_coords(coords):
    """``TypeError``/``ValueError`` unless ``coords`` is an ``N x 2`` numpy array of ``(x, y)``
    of any floating dtype (tensorpack's asserted float64, or failed on numpy >= 1.24)."""
    _check_coords(coords, "validate_coords")


def _log_caught(what, count, consequence="; the datapoint is dropped"):
    if count < 10 or count % 100 == 0:      # as tensorpack: the first 9, then every 100th
        logger.exception("%s: an exception was caught (%d so far)%s", what, count, consequence)


class ExceptionHandler:
    """tensorpack's ``ExceptionHandler(catch_exceptions=False)``: ``with handler.catch(): ...``
    counts the exceptions raised in the block; with ``catch_exceptions`` it swallows them,
    logging the first 9 and then every 100th with their traceback, else it lets them through."""

    def __init__(self, catch_exceptions=False):
        self.catch_exceptions = bool(catch_exceptions)
        self._nr_error = 0

    @contextlib.contextmanager
    def catch(self):
        try:
            yield
        except Exception:
            self._nr_error += 1
            if not self.catch_exceptions:
                raise
            _log_caught("ExceptionHandler", self._nr_error, "")


class _ExceptionHandler:
    """With ``catch=True``, count the exceptions of ``run`` and return ``None`` for them (the
    datapoint is dropped), logging the first 9 and then every 100th (as tensorpack) with their
    traceback; otherwise let them through."""

    def __init__(self, catch, what):
        self.catch = check_flag(f"{what}: catch_exceptions", catch)
        self.what = what
        self.count = 0

    def run(self, fn, *args):
        if not self.catch:
            return fn(*args)
        try:
            return fn(*args)
        except Exception:
            self.count += 1
            _log_caught(self.what, self.count)
            return None


def _augmented(img, what):
    """An augmentor's output, checked: a ``MapImage`` function that returns nothing made it
    ``None``, which as a map result drops the datapoint, silently (tensorpack's does). Any
    other result is the component's new value, as in tensorpack (a last ``MapImage`` may turn
    the image into a tensor or a list)."""
    if img is None:
        raise TypeError(f"{what}: the augmentors returned None, not an image (does a MapImage "
                        "function return its result?)")
    return img


def _as_list(dp):
    return list(dp) if isinstance(dp, tuple) else dp


def _check_key(who, name, key):
    """``TypeError`` unless ``key`` can name a component: an int (a numpy one too) for a list
    datapoint, any other key but a float or None for a dict one. (True was taken as index 1;
    1.5 and None failed only at the first datapoint.)"""
    if isinstance(key, (bool, float, np.floating)) or key is None or \
            not isinstance(key, collections.abc.Hashable):
        raise TypeError(f"{who}: {name} must be an int (or a dict key), got {key!r}")


class _AugmentComponent(Op):
    """The map function of :class:`AugmentImageComponent`: augment component ``index``."""

    def __init__(self, augs, index, copy, handler):
        _check_key("AugmentImageComponent", "index", index)
        super().__init__(index)
        self.augs, self.copy, self.handler = augs, copy, handler

    @property
    def native(self):
        return augmentors_native(self.augs)

    def _augment(self, img):
        if self.copy:
            img = _copy.deepcopy(img)
        return _augmented(self.augs.augment(img), "AugmentImageComponent")

    def apply(self, img):
        _check_image(img, "AugmentImageComponent")     # outside the handler, as tensorpack
        return self.handler.run(self._augment, img)


class _AugmentCoordinates(Op):
    """The map function of :class:`AugmentImageCoordinates`."""

    def __init__(self, augs, img_index, coords_index, copy, handler):
        super().__init__(None)
        _check_key("AugmentImageCoordinates", "img_index", img_index)
        _check_key("AugmentImageCoordinates", "coords_index", coords_index)
        self.augs, self.copy, self.handler = augs, copy, handler
        self.img_index, self.coords_index = img_index, coords_index

    @property
    def native(self):
        return augmentors_native(self.augs)

    def _augment(self, dp):
        what = "AugmentImageCoordinates"
        img, coords = component(dp, self.img_index, what), component(dp, self.coords_index, what)
        _check_image(img, what)
        _check_coords(coords, what)
        if self.copy:
            img, coords = _copy.deepcopy((img, coords))
        tfms = self.augs.get_transform(img)
        dp = _as_list(dp)
        dp[self.img_index] = _augmented(tfms.apply_image(img), what)    # first: the
        # transforms after it are lazy
        dp[self.coords_index] = tfms.apply_coords(coords)
        return dp

    def apply(self, dp):
        return self.handler.run(self._augment, dp)


class _AugmentComponents(Op):
    """The map function of :class:`AugmentImageComponents`."""

    def __init__(self, augs, index, coords_index, copy, handler):
        super().__init__(None)
        for i in index:
            _check_key("AugmentImageComponents", "index", i)
        for i in coords_index:
            _check_key("AugmentImageComponents", "coords_index", i)
        self.augs, self.copy, self.handler = augs, copy, handler
        self.indices, self.coords_index = tuple(index), tuple(coords_index)

    @property
    def native(self):
        return augmentors_native(self.augs)

    def _augment(self, dp):
        dp = _as_list(_copy.copy(dp))
        what = "AugmentImageComponents"
        major = self.indices[0]
        im = component(dp, major, what)
        if self.copy:
            im = _copy.deepcopy(im)
        _check_image(im, what)
        others = [component(dp, idx, what) for idx in self.indices[1:]]
        for idx, other in zip(self.indices[1:], others):
            _check_image(other, what)
            if other.shape[:2] != im.shape[:2]:     # one transform for all: same size only
                raise ValueError(f"{what}: component {idx!r} is {other.shape[:2]}, component "
                                 f"{major!r} {im.shape[:2]}: the images augmented together "
                                 "must have the same height and width")
        tfms = self.augs.get_transform(im)
        dp[major] = _augmented(tfms.apply_image(im), what)   # first: later transforms are lazy
        for idx, other in zip(self.indices[1:], others):
            dp[idx] = _augmented(tfms.apply_image(_copy.deepcopy(other) if self.copy else other),
                                 what)
        for idx in self.coords_index:
            coords = component(dp, idx, what)
            _check_coords(coords, what)
            dp[idx] = tfms.apply_coords(_copy.deepcopy(coords) if self.copy else coords)
        return dp

    def apply(self, dp):
        return self.handler.run(self._augment, dp)


# in a JPEG's entropy-coded data 0xFF is followed by 0x00 (stuffing) or a restart marker; any
# other byte after it (fill bytes 0xFF aside) starts the next marker
_JPEG_NEXT_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")


def _jpeg_ends_early(data):
    """Whether the JPEG ``data`` (it starts with SOI) runs out before its end-of-image marker:
    its segments are walked by their lengths, each scan's data skipped to the next marker. Bytes
    after the marker (a camera's trailer) are fine; a malformed structure is the decoder's
    business, not a truncation."""
    n, pos = len(data), 2
    while True:
        while pos < n and data[pos] == 0xFF and pos + 1 < n and data[pos + 1] == 0xFF:
            pos += 1                                     # fill bytes before a marker
        if pos + 2 > n:
            return True
        if data[pos] != 0xFF:
            return False
        marker = data[pos + 1]
        pos += 2
        if marker == 0xD9:                               # EOI
            return False
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:     # no length
            continue
        if pos + 2 > n:
            return True
        pos += int.from_bytes(data[pos:pos + 2], "big")
        if pos > n:
            return True
        if marker == 0xDA:                               # SOS: the scan's data follows
            m = _JPEG_NEXT_MARKER.search(data, pos)
            if m is None:
                return True
            pos = m.start()


def _truncated_jpeg(path):
    """Whether ``path`` is a JPEG file cut short (libjpeg decodes it with a grey or blurred
    bottom and only a "Premature end of JPEG file" on stderr). A good file costs two 2-byte
    reads: it ends with the end-of-image marker; only one that does not is walked."""
    with open(path, "rb") as fh:
        if fh.read(2) != b"\xff\xd8":
            return False
        fh.seek(-2, os.SEEK_END)
        if fh.read(2) == b"\xff\xd9":
            return False
        fh.seek(0)
        data = fh.read()
    return _jpeg_ends_early(data)


class ImageFromFile(_ckpt.IndexedSource, RNGDataFlow):
    """Produce ``[image]`` for each image file in ``files``.

    ``channel=3`` gives an ``H x W x 3`` uint8 image in **RGB** order (as tensorpack, unlike
    ``dataset.ILSVRC12`` and the other dataset readers, which give OpenCV's BGR);
    ``channel=1`` gives grayscale ``H x W x 1``. Files are read with ``cv2.imread`` (so the EXIF
    orientation is applied). ``resize`` (an int or ``(h, w)``) resizes every image with
    ``cv2.resize`` (``INTER_LINEAR``). ``shuffle=True`` visits the files in a new random order
    each pass (needs ``reset_state()``; the caller's list is left as it is). A missing file
    raises ``FileNotFoundError`` and one OpenCV cannot read, or a JPEG file cut short,
    ``ValueError``, naming the file.
    Needs OpenCV (``pip install "dataflow-rt[images]"``).
    """

    def __init__(self, files, channel=3, resize=None, shuffle=False):
        if isinstance(files, (str, bytes, os.PathLike)):    # list() would split it in letters
            raise TypeError(f"ImageFromFile: files must be a list of paths, got the single path "
                            f"{files!r} (pass [{files!r}])")
        if not hasattr(files, "__iter__"):
            raise TypeError(f"ImageFromFile: files must be a list of paths, got {files!r}")
        files = list(files)
        if not files:
            raise ValueError("No image files given to ImageFromFile!")
        bad = [f for f in files if not isinstance(f, (str, bytes, os.PathLike))]
        if bad:                     # (None failed in os.stat, 5 in OpenCV, at the first read)
            raise TypeError(f"ImageFromFile: files must be paths, got {bad[0]!r} among them")
        if isinstance(channel, bool) or channel not in (1, 3):     # 1.5 was taken as 1
            raise ValueError(f"ImageFromFile: channel must be 1 or 3, got {channel!r}")
        self.files = files
        self.channel = int(channel)
        self.resize = None if resize is None else _shape2d(resize)
        if self.resize is not None and not all(s > 0 for s in self.resize):
            raise ValueError(f"ImageFromFile: resize must be positive, got {resize!r}")
        check_flag("ImageFromFile: shuffle", shuffle)
        self.shuffle = shuffle

    def __len__(self):
        return len(self.files)

    def _read(self, f):
        from .parallel.cvthreads import import_cv2
        cv2 = import_cv2()
        rgb = getattr(cv2, "IMREAD_COLOR_RGB", None)        # OpenCV >= 4.10
        if self.channel == 1:
            flag = cv2.IMREAD_GRAYSCALE
        else:
            flag = cv2.IMREAD_COLOR if rgb is None else rgb
        im = cv2.imread(f, flag)
        if im is None:
            if os.path.isdir(f):
                raise IsADirectoryError(f"ImageFromFile: {f!r} is a directory, not an image file")
            if not os.path.isfile(f):
                raise FileNotFoundError(f"ImageFromFile: no such image file: {f!r}")
            raise ValueError(f"ImageFromFile: OpenCV cannot read {f!r} as an image")
        if _truncated_jpeg(f):
            raise ValueError(f"ImageFromFile: {f!r} is a truncated JPEG file (it ends before its "
                             f"end-of-image marker; OpenCV would give a partly blank image)")
        if self.channel == 3 and rgb is None:
            im = im[:, :, ::-1]
        if self.resize is not None:
            h, w = self.resize
            im = cv2.resize(im, (w, h))
        if self.channel == 1:
            im = im[:, :, np.newaxis]
        return im

    def reset_state(self):
        super().reset_state()
        self._reset_indexed()

    def __iter__(self):
        # the pass begins at iter(), not at the first next() (see checkpoint.PassPosition)
        indices, start = self._pass_indices()
        files = self.files
        return self._counted_items(([self._read(files[k])] for k in indices), start)


class AugmentImageComponent(MapDataComponent):
    """Apply image augmentors to component ``index`` (an int or a dict key) of each datapoint.

    ``augmentors`` is an :class:`~dataflow.imgaug.AugmentorList` or a list of augmentors.
    ``copy=True`` augments a deep copy of the image (some augmentors write in place, and some
    sources yield the same arrays every pass); ``copy=False`` saves it. A component that is not
    a uint8 or floating numpy array raises ``TypeError`` even with ``catch_exceptions=True``;
    with it, any other exception drops the datapoint (logged, see the module doc). The result is
    a shallow copy of the datapoint with the new component; the others are untouched.
    ``reset_state()`` also reseeds the augmentors.
    """

    def __init__(self, ds, augmentors, index=0, copy=True, catch_exceptions=False):
        self.augs = as_augmentor_list(augmentors, "AugmentImageComponent")
        self._handler = _ExceptionHandler(catch_exceptions, "AugmentImageComponent")
        copy = check_flag("AugmentImageComponent: copy", copy)
        self._index = index
        # Not MapDataComponent.__init__: the map function is an op that places the component
        # itself (and states its nativeness), so MapData gets it directly.
        MapData.__init__(self, ds, _AugmentComponent(self.augs, index, copy, self._handler))

    def reset_state(self):
        super().reset_state()
        self.augs.reset_state()


class AugmentImageCoordinates(MapData):
    """Apply image augmentors to the image ``dp[img_index]`` and, with the same transform, to
    the coordinates ``dp[coords_index]`` (an ``N x 2`` array of ``(x, y)`` of any floating
    dtype). ``copy``, ``catch_exceptions``: as :class:`AugmentImageComponent`, except that here
    a bad image or bad coordinates are caught too (as in tensorpack).
    """

    def __init__(self, ds, augmentors, img_index=0, coords_index=1, copy=True,
                 catch_exceptions=False):
        self.augs = as_augmentor_list(augmentors, "AugmentImageCoordinates")
        self._handler = _ExceptionHandler(catch_exceptions, "AugmentImageCoordinates")
        copy = check_flag("AugmentImageCoordinates: copy", copy)
        super().__init__(ds, _AugmentCoordinates(self.augs, img_index, coords_index, copy,
                                                 self._handler))

    def reset_state(self):
        super().reset_state()
        self.augs.reset_state()


class AugmentImageComponents(MapData):
    """Apply one random transform to several images and coordinate arrays of a datapoint.

    The transform is drawn from the first image, ``dp[index[0]]``, and applied to it, then to
    the other images ``dp[i]`` for ``i in index[1:]`` (the same geometry and the same
    photometric changes: masks, A/B pairs) and to the coordinates ``dp[j]`` for ``j in
    coords_index`` (``N x 2`` arrays of ``(x, y)``, any floating dtype). ``index`` must be a
    sequence (a list, tuple, ``range`` or 1-D numpy array, as in tensorpack). ``copy``,
    ``catch_exceptions``: as :class:`AugmentImageCoordinates`.
    """

    def __init__(self, ds, augmentors, index=(0, 1), coords_index=(), copy=True,
                 catch_exceptions=False):
        if isinstance(index, np.ndarray) and index.ndim == 1:
            index = index.tolist()
        if isinstance(index, (str, bytes)) or not isinstance(index, Sequence) or not index:
            raise TypeError(f"AugmentImageComponents: index must be a non-empty sequence (a "
                            f"list, tuple, range or 1-D array) of components, got {index!r}")
        if isinstance(coords_index, np.ndarray) and coords_index.ndim == 1:
            coords_index = coords_index.tolist()
        if isinstance(coords_index, (str, bytes)) or not isinstance(coords_index, Sequence):
            raise TypeError(f"AugmentImageComponents: coords_index must be a sequence (a list, "
                            f"tuple, range or 1-D array) of components, got {coords_index!r}")
        self.augs = as_augmentor_list(augmentors, "AugmentImageComponents")
        self._handler = _ExceptionHandler(catch_exceptions, "AugmentImageComponents")
        copy = check_flag("AugmentImageComponents: copy", copy)
        super().__init__(ds, _AugmentComponents(self.augs, index, coords_index, copy,
                                                self._handler))

    def reset_state(self):
        super().reset_state()
        self.augs.reset_state()
