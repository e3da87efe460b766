"""Pasting an image onto a larger background: :class:`CenterPaste`, :class:`RandomPaste`,
and the background fillers :class:`BackgroundFiller`, :class:`ConstantBackgroundFiller`.

Coordinates are shifted by the paste position (tensorpack 0.11 raised NotImplementedError)."""
import numpy as np

from .base import ImageAugmentor, shape2d
from .transform import Transform, as_float_coords
from .transform import TransformFactory  # noqa: F401 (tensorpack's module has it)

__all__ = ["CenterPaste", "RandomPaste", "BackgroundFiller", "ConstantBackgroundFiller"]


class BackgroundFiller:
    """Makes the background to paste on: ``fill(background_shape, img)`` returns an array of
    size ``background_shape`` (``(h, w)``) with ``img``'s channels and dtype. Subclasses
    implement ``_fill(background_shape, img)``."""

    def fill(self, background_shape, img):
        background_shape = tuple(shape2d(background_shape))
        return self._fill(background_shape, img)

    def _fill(self, background_shape, img):
        raise NotImplementedError()


class ConstantBackgroundFiller(BackgroundFiller):
    """A background of the constant ``value`` (one value, or one per channel), in the image's
    dtype and channel count; a ``value`` that does not fit raises ``ValueError``."""

    def __init__(self, value):
        self.value = value

    def _fill(self, background_shape, img):
        shape = background_shape + img.shape[2:]
        try:
            return np.full(shape, self.value, dtype=img.dtype)
        except ValueError as e:
            raise ValueError(f"ConstantBackgroundFiller: value {self.value!r} does not fit a "
                             f"background of shape {shape} for an image of shape {img.shape} "
                             f"(give one value, or one per channel): {e}") from None


class PasteTransform(Transform):
    """Paste the image at ``(y0, x0)`` of a ``background_shape`` background made by
    ``filler``; coordinates shift by ``(x0, y0)``."""

    def __init__(self, background_shape, y0, x0, filler):
        self.background_shape, self.y0, self.x0, self.filler = background_shape, y0, x0, filler

    def apply_image(self, img):
        bg = self.filler.fill(self.background_shape, img)
        h, w = img.shape[:2]
        bg[self.y0:self.y0 + h, self.x0:self.x0 + w] = img
        return bg

    def apply_coords(self, coords):
        coords = as_float_coords(coords)
        coords[:, 0] += self.x0
        coords[:, 1] += self.y0
        return coords


def _check_fits(img, bg, who):
    if img.shape[0] > bg[0] or img.shape[1] > bg[1]:
        raise ValueError(f"{who}: an image of shape {img.shape} does not fit the background "
                         f"{tuple(bg)}")


class CenterPaste(ImageAugmentor):
    """Paste the image at the centre of a ``background_shape`` background (``(h, w)`` or an
    int) from ``background_filler`` (default: zeros)."""

    native = True

    def __init__(self, background_shape, background_filler=None):
        super().__init__()
        background_shape = tuple(shape2d(background_shape))
        if background_filler is None:
            background_filler = ConstantBackgroundFiller(0)
        self._init(locals())

    def get_transform(self, img):
        _check_fits(img, self.background_shape, "CenterPaste")
        y0 = int((self.background_shape[0] - img.shape[0]) * 0.5)
        x0 = int((self.background_shape[1] - img.shape[1]) * 0.5)
        return PasteTransform(self.background_shape, y0, x0, self.background_filler)


class RandomPaste(CenterPaste):
    """Paste the image at a random position of a ``background_shape`` background. Works
    stand-alone (0.11 needed an ``AugmentorList`` around it to get an rng)."""

    native = True

    def get_transform(self, img):
        _check_fits(img, self.background_shape, "RandomPaste")
        y0 = int(self._rand_range(self.background_shape[0] - img.shape[0]))
        x0 = int(self._rand_range(self.background_shape[1] - img.shape[1]))
        return PasteTransform(self.background_shape, y0, x0, self.background_filler)
