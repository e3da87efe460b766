"""Colour-space and dtype conversions: :class:`ColorSpace`, :class:`Grayscale`,
:class:`ToUint8`, :class:`ToFloat32`."""
import numpy as np

from ._cv import cv2
from .transform import cv_input
from .base import PhotometricAugmentor
from .imgproc import to_uint8

__all__ = ["ColorSpace", "Grayscale", "ToUint8", "ToFloat32"]


class ColorSpace(PhotometricAugmentor):
    """``cv2.cvtColor(img, mode)``; with ``keepdims`` a result that lost its channel axis
    gets it back (``(H, W, 1)``). OpenCV converts uint8 and float32 images: a float16 or
    float64 one is converted in float32 and given back in its dtype (0.11 failed on them). An
    image the mode cannot convert (a 2-D one for ``COLOR_BGR2GRAY``) raises ``ValueError``
    naming its shape and dtype (0.11: OpenCV's own error)."""

    native = True
    _expects = None     # what the image must be, for that error; None: OpenCV's reason only

    def __init__(self, mode, keepdims=True):
        super().__init__()
        self._init(locals())

    def _augment(self, img, _):
        c = cv2()
        try:
            if img.dtype.kind == "f" and img.dtype != np.float32:
                out = c.cvtColor(img.astype(np.float32), self.mode).astype(img.dtype)
            else:
                out = c.cvtColor(cv_input(img), self.mode)
        except c.error as e:
            reason = " ".join((getattr(e, "err", None) or str(e)).replace(">", " ").split())
            needs = f"it needs {self._expects}" if self._expects else \
                f"cv2.cvtColor mode {self.mode} cannot convert it"
            raise ValueError(f"{type(self).__name__}: got an image of shape {img.shape}, dtype "
                             f"{img.dtype}; {needs} (OpenCV: {reason})") from None
        if self.keepdims and out.ndim != img.ndim and out.ndim == 2:
            out = out[:, :, np.newaxis]
        return out


class Grayscale(ColorSpace):
    """Convert a BGR (or, with ``rgb``, RGB) image to grey, ``(H, W, 1)`` with ``keepdims``;
    ``keepshape`` (which needs ``keepdims``) repeats the grey channel to 3 channels."""

    native = True
    _expects = "3 or 4 channels, (H, W, 3) BGR (RGB with rgb=True) or (H, W, 4)"

    def __init__(self, keepdims=True, rgb=False, keepshape=False):
        if keepshape and not keepdims:
            raise ValueError("Grayscale: keepshape=True needs keepdims=True")
        self.keepshape = keepshape
        self.rgb = rgb
        # the cv2 constants: COLOR_BGR2GRAY == 6, COLOR_RGB2GRAY == 7
        super().__init__(7 if rgb else 6, keepdims)

    def _augment(self, img, _):
        out = super()._augment(img, _)
        if self.keepshape:
            out = np.concatenate([out] * 3, axis=2)
        return out


class ToUint8(PhotometricAugmentor):
    """``clip(img, 0, 255).astype(uint8)`` (truncating, as tensorpack): always a new array, a
    copy for a uint8 image (as 0.11, so that an in-place augmentor after it never writes into
    the input)."""

    native = True

    def __init__(self):
        super().__init__()

    def _augment(self, img, _):
        return img.copy() if img.dtype == np.uint8 else to_uint8(img)


class ToFloat32(PhotometricAugmentor):
    """``img.astype(float32)``: always a new array, a copy for a float32 image (as 0.11)."""

    native = True

    def __init__(self):
        super().__init__()

    def _augment(self, img, _):
        return img.astype(np.float32)
