"""Crops: :class:`RandomCrop`, :class:`CenterCrop`, :class:`RandomCropRandomShape`,
:class:`GoogleNetRandomCropAndResize`, and :class:`RandomCutout` (which blanks a rectangle
rather than cropping, and leaves coordinates unchanged)."""
import numpy as np

from ._cv import INTER_LINEAR
from .base import (ImageAugmentor, ImagePlaceholder, PhotometricAugmentor, _AugmentorTransform,
                   check_order, check_positive_size, randint, shape2d, uniform32)
from .misc import _shortest_edge_size
from .transform import CropTransform, ResizeTransform, TransformList

__all__ = ["RandomCrop", "CenterCrop", "RandomCropRandomShape", "GoogleNetRandomCropAndResize",
           "RandomCutout"]


def _check_fits(img, h, w, who):
    if img.shape[0] < h or img.shape[1] < w:
        raise ValueError(f"{who}: cannot crop {(h, w)} out of an image of shape {img.shape}")


class RandomCrop(ImageAugmentor):
    """Crop a random ``crop_shape`` (``(h, w)`` or an int) window; the image must be at least
    that large."""

    native = True

    def __init__(self, crop_shape):
        super().__init__()
        h, w = shape2d(crop_shape)
        check_positive_size("RandomCrop", "crop_shape", (h, w), crop_shape)
        crop_shape = (int(h), int(w))
        self._init(locals())

    def get_transform(self, img):
        h, w = self.crop_shape
        _check_fits(img, h, w, "RandomCrop")
        rng = self.rng
        y0 = randint(rng, img.shape[0] - h + 1)
        x0 = randint(rng, img.shape[1] - w + 1)
        return CropTransform(y0, x0, h, w)


class CenterCrop(ImageAugmentor):
    """Crop the central ``crop_shape`` window (the top-left corner is rounded down)."""

    native = True

    def __init__(self, crop_shape):
        super().__init__()
        check_positive_size("CenterCrop", "crop_shape", shape2d(crop_shape), crop_shape)
        crop_shape = shape2d(crop_shape)
        self._init(locals())

    def get_transform(self, img):
        h, w = self.crop_shape
        _check_fits(img, h, w, "CenterCrop")
        y0 = int((img.shape[0] - h) * 0.5)
        x0 = int((img.shape[1] - w) * 0.5)
        return CropTransform(y0, x0, h, w)


class RandomCropRandomShape(ImageAugmentor):
    """Crop a window of random size, ``h`` in ``[hmin, hmax]`` and ``w`` in ``[wmin, wmax]``
    (a max of ``None`` is the image size; note ``w`` comes before ``h``), at a random position
    (every position that fits, the last one included). ``max_aspect_ratio`` is deprecated and
    ignored, as in tensorpack."""

    native = True

    def __init__(self, wmin, hmin, wmax=None, hmax=None, max_aspect_ratio=None):
        super().__init__()
        # both ends are included, so wmin == wmax is a fixed width; a max of None (or 0, as
        # tensorpack's ``wmax or W``) is the image's size, known only at the image
        if wmax:
            check_order("RandomCropRandomShape", "wmin", wmin, "wmax", wmax, strict=False)
        if hmax:
            check_order("RandomCropRandomShape", "hmin", hmin, "hmax", hmax, strict=False)
        self._init(locals())

    def get_transform(self, img):
        H, W = img.shape[:2]
        hmax = self.hmax or H
        wmax = self.wmax or W
        rng = self.rng
        h = randint(rng, self.hmin, hmax + 1)
        w = randint(rng, self.wmin, wmax + 1)
        if H < h or W < w:
            _check_fits(img, h, w, "RandomCropRandomShape")
        return CropTransform(randint(rng, H - h + 1), randint(rng, W - w + 1), h, w)


class GoogleNetRandomCropAndResize(ImageAugmentor):
    """The Inception-style random-size crop: up to 10 draws of an area fraction in
    ``crop_area_fraction`` and an aspect ratio in ``aspect_ratio_range`` (width and height
    swapped with probability 0.5); the first window that fits is cropped at a random position
    and resized to ``target_shape`` (an int or ``(h, w)``). When none fits, the short edge is
    resized to the target and the centre is cropped."""

    native = True

    def __init__(self, crop_area_fraction=(0.08, 1.), aspect_ratio_range=(0.75, 1.333),
                 target_shape=224, interp=INTER_LINEAR):
        super().__init__()
        check_positive_size("GoogleNetRandomCropAndResize", "target_shape",
                            shape2d(target_shape), target_shape)
        self._init(locals())

    def get_transform(self, img):
        th, tw = shape2d(self.target_shape)
        h, w = img.shape[:2]
        area = h * w
        rng = self.rng
        area_lo, area_hi = self.crop_area_fraction
        aspect_lo, aspect_hi = self.aspect_ratio_range
        sqrt = np.sqrt
        for _ in range(10):
            target_area = uniform32(rng, area_lo, area_hi) * area
            aspect = uniform32(rng, aspect_lo, aspect_hi)
            ww = int(sqrt(target_area * aspect) + 0.5)
            hh = int(sqrt(target_area / aspect) + 0.5)
            if uniform32(rng, 0, 1.0) < 0.5:
                ww, hh = hh, ww
            if 0 < hh <= h and 0 < ww <= w:
                x1 = randint(rng, 0, w - ww + 1)
                y1 = randint(rng, 0, h - hh + 1)
                return TransformList([CropTransform(y1, x1, hh, ww),
                                      ResizeTransform(hh, ww, th, tw, self.interp)])
        newh, neww = _shortest_edge_size(h, w, max(th, tw))
        resize = ResizeTransform(h, w, newh, neww, self.interp)
        crop = CenterCrop((th, tw)).get_transform(ImagePlaceholder(shape=(newh, neww)))
        return TransformList([resize, crop])


class RandomCutout(PhotometricAugmentor):
    """Fill a random rectangle with ``fill``, **in place** (coordinates unchanged).

    ``h_range`` and ``w_range`` are the rectangle's height and width: an int is a fixed size,
    a pair ``(low, high)`` draws a size in ``[low, high)`` (tensorpack 0.11 crashed on pairs).
    A size larger than the image is clipped to it."""

    native = True

    def __init__(self, h_range, w_range, fill=0.):
        super().__init__()
        for _name, _r in (("h_range", h_range), ("w_range", w_range)):   # _: not attributes
            if isinstance(_r, (tuple, list, np.ndarray)) and np.shape(_r) == (2,):
                check_order("RandomCutout", f"{_name}[0]", _r[0], f"{_name}[1]", _r[1],
                            strict=True,
                            hint=" (a size is drawn from [low, high); an int is a fixed size)")
        self._init(locals())

    def get_transform(self, img):
        return _CutoutTransform(self, self._get_augment_params(img))

    def _get_augment_params(self, img):
        H, W = img.shape[:2]
        rng = self.rng
        h, w = self.h_range, self.w_range
        if not isinstance(h, (int, np.integer)):
            h = randint(rng, h[0], h[1])
        if not isinstance(w, (int, np.integer)):
            w = randint(rng, w[0], w[1])
        h, w = int(min(h, H)), int(min(w, W))
        x0 = randint(rng, 0, W + 1 - w)
        return randint(rng, 0, H + 1 - h), x0, h, w

    def _augment(self, img, param):
        y0, x0, h, w = param
        img[y0:y0 + h, x0:x0 + w] = self.fill
        return img


class _CutoutTransform(_AugmentorTransform):
    name = "cutout"          # 0.11's repr: imgaug.PhotometricTransform(cutout)
