"""Flips, resizes and transposition: :class:`Flip`, :class:`Resize`,
:class:`ResizeShortestEdge`, :class:`RandomResize`, :class:`Transpose`.

All return geometric transforms, so coordinates follow the image (see
:mod:`dataflow.imgaug.transform` for the convention).
"""
import logging

import numpy as np

from ._cv import INTER_LINEAR
from .base import ImageAugmentor, check_positive_size, check_probability, shape2d
from .transform import FlipTransform, NoOpTransform, ResizeTransform, TransposeTransform

__all__ = ["Flip", "Resize", "ResizeShortestEdge", "RandomResize", "Transpose"]

logger = logging.getLogger("dataflow")


class Flip(ImageAugmentor):
    """Flip horizontally (``horiz=True``) or vertically (``vert=True``; exactly one of the two)
    with probability ``prob``."""

    native = True

    def __init__(self, horiz=False, vert=False, prob=0.5):
        super().__init__()
        if horiz and vert:
            raise ValueError("Cannot do both horiz and vert. Please use two Flip instead.")
        if not horiz and not vert:
            raise ValueError("At least one of horiz or vert has to be True!")
        check_probability("Flip", prob)
        self._init(locals())

    def get_transform(self, img):
        h, w = img.shape[:2]
        if self._rand_range() < self.prob:
            return FlipTransform(h, w, self.horiz)
        return NoOpTransform()


class Resize(ImageAugmentor):
    """Resize to ``shape`` (``(h, w)`` or an int) with ``cv2.resize``."""

    native = True

    def __init__(self, shape, interp=INTER_LINEAR):
        super().__init__()
        check_positive_size("Resize", "shape", shape2d(shape), shape)
        shape = tuple(shape2d(shape))
        self._init(locals())

    def get_transform(self, img):
        h, w = img.shape[:2]
        return ResizeTransform(h, w, self.shape[0], self.shape[1], self.interp)


def _shortest_edge_size(h, w, size):
    scale = size * 1.0 / min(h, w)
    if h < w:
        return size, int(scale * w + 0.5)
    return int(scale * h + 0.5), size


class ResizeShortestEdge(ImageAugmentor):
    """Resize so that the shorter edge is ``size``, keeping the aspect ratio (the longer edge
    is rounded to the nearest pixel)."""

    native = True

    def __init__(self, size, interp=INTER_LINEAR):
        super().__init__()
        check_positive_size("ResizeShortestEdge", "size", (size,), size)
        size = int(size)
        self._init(locals())

    def get_transform(self, img):
        h, w = img.shape[:2]
        newh, neww = _shortest_edge_size(h, w, self.size)
        return ResizeTransform(h, w, newh, neww, self.interp)


def _is_float_range(r):
    return any(isinstance(v, (float, np.floating)) for v in r)


class RandomResize(ImageAugmentor):
    """Resize to a random size.

    ``xrange`` (and ``yrange``, which defaults to ``xrange``) are ``(low, high)``: floats are
    scale factors of the width (height), ints are sizes in pixels; x and y must be of the same
    kind. With ``aspect_ratio_thres == 0`` the height follows the width so the aspect ratio is
    kept (``yrange`` is then unused); otherwise draws whose relative aspect-ratio change
    reaches ``aspect_ratio_thres`` are redrawn, and after 51 failures (as 0.11) the image is left
    at its size (with a warning). The new size is at least ``minimum = (min_w, min_h)``, rounded to
    the nearest pixel.
    """

    native = True

    def __init__(self, xrange, yrange=None, minimum=(0, 0), aspect_ratio_thres=0.15,
                 interp=INTER_LINEAR):
        super().__init__()
        if aspect_ratio_thres < 0:
            raise ValueError("aspect_ratio_thres must be >= 0")
        self.is_float = _is_float_range(xrange)
        if yrange is not None and _is_float_range(yrange) != self.is_float:
            raise ValueError("xrange and yrange must both be floats (scales) or both be ints "
                             "(sizes)")
        self._init(locals())

    def get_transform(self, img):
        h, w = img.shape[:2]
        yrange = self.yrange if self.yrange is not None else self.xrange
        for _ in range(51):          # 0.11 gives up when its count of failures passes 50
            if self.is_float:
                fx = self._rand_range(*self.xrange)
                destx = fx * w
                desty = fx * h if self.aspect_ratio_thres == 0 else \
                    self._rand_range(*yrange) * h
            else:
                destx = self._rand_range(*self.xrange)
                desty = destx * h / w if self.aspect_ratio_thres == 0 else \
                    self._rand_range(*yrange)
            destx = int(max(destx, self.minimum[0]) + 0.5)
            desty = int(max(desty, self.minimum[1]) + 0.5)
            if destx < 1 or desty < 1:
                continue
            if self.aspect_ratio_thres == 0:
                return ResizeTransform(h, w, desty, destx, self.interp)
            old_r, new_r = w * 1.0 / h, destx * 1.0 / desty
            if abs(new_r - old_r) / old_r < self.aspect_ratio_thres + 1e-5:
                return ResizeTransform(h, w, desty, destx, self.interp)
        logger.warning("RandomResize: no acceptable size in 51 draws for an image of size %s; "
                       "keeping its size", (h, w))
        return ResizeTransform(h, w, h, w, self.interp)


class Transpose(ImageAugmentor):
    """Swap the image axes with probability ``prob`` (coordinates swap x and y)."""

    native = True

    def __init__(self, prob=0.5):
        super().__init__()
        check_probability("Transpose", prob)
        self._init(locals())

    def get_transform(self, img):
        if self.rng.rand() < self.prob:
            return TransposeTransform()
        return NoOpTransform()
