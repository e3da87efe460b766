"""Affine warps: :class:`Shift`, :class:`Rotation`, :class:`RotationAndCropValid`,
:class:`Affine`. Each returns a ``WarpAffineTransform`` (``cv2.warpAffine``) whose matrix also
maps coordinates. Rotation centres use OpenCV's pixel-centre convention (the centre of an
``h x w`` image is ``((w - 1) / 2, (h - 1) / 2)``), as tensorpack does.
"""
import math

import numpy as np

from ._cv import BORDER_CONSTANT, BORDER_REPLICATE, INTER_LINEAR, cv2
from .base import ImageAugmentor
from .transform import CropTransform, TransformList, WarpAffineTransform

__all__ = ["Shift", "Rotation", "RotationAndCropValid", "Affine"]


def rotation_matrix(center, deg, scale=1.0):
    """The 2x3 float64 matrix of ``cv2.getRotationMatrix2D(center, deg, scale)``: rotate by
    ``deg`` degrees counter-clockwise (in image coordinates, y down) about ``center`` and
    scale by ``scale``. OpenCV's own, for 0.11's exact values (its cosine and sine differ from
    ``math``'s in the last bits), given plain floats (0.11's ``Affine`` failed on current OpenCV
    because it passed 0-d arrays)."""
    return cv2().getRotationMatrix2D((float(center[0]), float(center[1])), float(deg),
                                     float(scale))


def _draw_deg(aug, max_deg, step_deg):
    deg = aug._rand_range(-max_deg, max_deg)
    if step_deg:
        deg = deg // step_deg * step_deg
    return float(deg)


class Shift(ImageAugmentor):
    """Translate by a random ``dx`` in ``±horiz_frac * w`` and ``dy`` in ``±vert_frac * h``
    (rounded to whole pixels); ``border``/``border_value`` fill what comes in."""

    native = True

    def __init__(self, horiz_frac=0, vert_frac=0, border=BORDER_REPLICATE, border_value=0):
        super().__init__()
        if not (horiz_frac < 1.0 and vert_frac < 1.0):
            raise ValueError("Shift: horiz_frac and vert_frac must be < 1")
        self._init(locals())

    def get_transform(self, img):
        h, w = img.shape[:2]
        max_dx, max_dy = self.horiz_frac * w, self.vert_frac * h
        dx = float(np.round(self._rand_range(-max_dx, max_dx)))
        dy = float(np.round(self._rand_range(-max_dy, max_dy)))
        mat = np.array([[1, 0, dx], [0, 1, dy]], dtype=np.float32)
        return WarpAffineTransform(mat, (w, h), INTER_LINEAR, self.border, self.border_value)


class Rotation(ImageAugmentor):
    """Rotate by a random angle in ``±max_deg`` degrees (a multiple of ``step_deg`` if given,
    which needs ``max_deg == 180``) about a random centre ``(w, h) * U(center_range)``."""

    native = True

    def __init__(self, max_deg, center_range=(0, 1), interp=INTER_LINEAR,
                 border=BORDER_REPLICATE, step_deg=None, border_value=0):
        super().__init__()
        if step_deg is not None and not (max_deg == 180 and max_deg % step_deg == 0):
            raise ValueError("Rotation: step_deg needs max_deg == 180, divisible by step_deg")
        self._init(locals())

    def get_transform(self, img):
        h, w = img.shape[:2]
        # in float64, as 0.11 (a float32 centre moved the warp by ~1e-6 px: another rounding)
        center = np.array([w, h], dtype=np.float64) * self._rand_range(*self.center_range,
                                                                       size=(2,))
        deg = _draw_deg(self, self.max_deg, self.step_deg)
        mat = rotation_matrix(center - 0.5, deg, 1.0)
        return WarpAffineTransform(mat, (w, h), self.interp, self.border, self.border_value)


class RotationAndCropValid(ImageAugmentor):
    """Rotate by a random angle in ``±max_deg`` about the image centre, then crop the largest
    axis-aligned rectangle holding no border pixels, so the **output size varies**."""

    native = True

    def __init__(self, max_deg, interp=INTER_LINEAR, step_deg=None):
        super().__init__()
        if step_deg is not None and not (max_deg == 180 and max_deg % step_deg == 0):
            raise ValueError("RotationAndCropValid: step_deg needs max_deg == 180, divisible "
                             "by step_deg")
        self._init(locals())

    def get_transform(self, img):
        deg = _draw_deg(self, self.max_deg, self.step_deg)
        h, w = img.shape[:2]
        center = ((w - 1) * 0.5, (h - 1) * 0.5)
        warp = WarpAffineTransform(rotation_matrix(center, deg, 1.0), (w, h), self.interp,
                                   BORDER_CONSTANT, 0)
        neww, newh = RotationAndCropValid.largest_rotated_rect(w, h, deg)
        neww, newh = max(1, min(neww, w)), max(1, min(newh, h))
        # the valid rectangle is centred on the rotation centre, (w/2, h/2) in edge coordinates
        x0 = max(0, int(w * 0.5 - neww * 0.5))
        y0 = max(0, int(h * 0.5 - newh * 0.5))
        return TransformList([warp, CropTransform(y0, x0, newh, neww)])

    @staticmethod
    def largest_rotated_rect(w, h, angle):
        """``(width, height)`` (ints) of the largest axis-aligned rectangle inside a ``w x h``
        rectangle rotated by ``angle`` degrees."""
        if w <= 0 or h <= 0:
            return 0, 0
        a = math.radians(angle)
        wide = w >= h
        long_side, short_side = (w, h) if wide else (h, w)
        sin_a, cos_a = abs(math.sin(a)), abs(math.cos(a))
        if short_side <= 2.0 * sin_a * cos_a * long_side or abs(sin_a - cos_a) < 1e-10:
            # two corners touch the longer side: the rectangle is limited by the short side
            x = 0.5 * short_side
            wr, hr = (x / sin_a, x / cos_a) if wide else (x / cos_a, x / sin_a)
        else:
            cos_2a = cos_a * cos_a - sin_a * sin_a
            wr = (w * cos_a - h * sin_a) / cos_2a
            hr = (h * cos_a - w * sin_a) / cos_2a
        return int(np.round(wr)), int(np.round(hr))


class Affine(ImageAugmentor):
    """A random affine warp about the image centre ``c = (w, h) / 2 - 0.5``, with tensorpack's
    parameters, draws and matrix: ``scale`` in ``(low, high)``, a shift of up to
    ``translate_frac = (fx, fy)`` of the size (whole pixels), a shear angle ``s`` in ``±shear``
    degrees (``shear >= 0``) and a rotation in ``±rotate_max_deg`` degrees, drawn in that
    order (the rotation always, as 0.11 does). The matrix is ``cv2.getRotationMatrix2D(c, deg,
    scale)`` whose second column (the image of the y axis) is turned by ``s`` (``col1 ->
    col1 * cos(s) + col0 * sin(s)``) with the offset recomputed to keep ``c`` in place, then
    shifted. The output has the input's size. ``scale`` and ``translate_frac`` may be tuples or
    lists (0.11 took tuples only)."""

    native = True

    def __init__(self, scale=None, translate_frac=None, rotate_max_deg=0.0, shear=0.0,
                 interp=INTER_LINEAR, border=BORDER_REPLICATE, border_value=0):
        super().__init__()
        if scale is not None and len(scale) != 2:
            raise ValueError("Affine: scale must be a (low, high) pair")
        if translate_frac is not None and len(translate_frac) != 2:
            raise ValueError("Affine: translate_frac must be a (fx, fy) pair")
        if shear < 0:
            raise ValueError("Affine: shear must be >= 0")
        self._init(locals())

    def get_transform(self, img):
        h, w = img.shape[:2]
        scale = float(self._rand_range(*self.scale)) if self.scale is not None else 1.0
        if self.translate_frac is not None:
            max_dx, max_dy = self.translate_frac[0] * w, self.translate_frac[1] * h
            dx = float(np.round(self._rand_range(-max_dx, max_dx)))
            dy = float(np.round(self._rand_range(-max_dy, max_dy)))
        else:
            dx = dy = 0.0
        shear = float(self._rand_range(-self.shear, self.shear)) if self.shear > 0 else None
        deg = float(self._rand_range(-self.rotate_max_deg, self.rotate_max_deg))

        cx, cy = w * 0.5 - 0.5, h * 0.5 - 0.5
        m = rotation_matrix((cx, cy), deg, scale)
        if shear is not None:
            sin_s, cos_s = math.sin(math.radians(shear)), math.cos(math.radians(shear))
            m00, m10 = m[0, 0], m[1, 0]
            m[0, 1] = m[0, 1] * cos_s + m00 * sin_s
            m[1, 1] = m[1, 1] * cos_s + m10 * sin_s
            # the offset that keeps the centre where it was
            m[0, 2] = cx * (1.0 - m00) - cy * m[0, 1]
            m[1, 2] = -cx * m10 + cy * (1.0 - m[1, 1])
        m[0, 2] += dx
        m[1, 2] += dy
        return WarpAffineTransform(m, (w, h), self.interp, self.border, self.border_value)
