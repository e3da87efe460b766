"""Wrappers of other augmentation libraries: :class:`IAAugmentor` (aleju's ``imgaug``) and
:class:`Albumentations`. The wrapped library is not imported here: the wrapper calls the
augmentor object it is given. Neither is native (their Python code holds the GIL)."""
import numpy as np

from .base import ImageAugmentor
from .transform import Transform

__all__ = ["IAAugmentor", "Albumentations"]


class IAATransform(Transform):
    """Apply a deterministic ``imgaug`` augmenter to an image of shape ``img_shape`` and to key
    points (approximate, as the ``imgaug`` library's key-point mapping is)."""

    def __init__(self, aug, img_shape):
        self._init(locals())

    def apply_image(self, img):
        return self.aug.augment_image(img)

    def apply_coords(self, coords):
        import imgaug as IA
        points = [IA.Keypoint(x=float(x), y=float(y)) for x, y in coords]
        points = IA.KeypointsOnImage(points, shape=self.img_shape)
        augmented = self.aug.augment_keypoints([points])[0].keypoints
        return np.asarray([[p.x, p.y] for p in augmented], dtype=coords.dtype)


class IAAugmentor(ImageAugmentor):
    """Wrap an augmenter of aleju's ``imgaug`` library: each transform uses
    ``augmentor.to_deterministic()``. uint8 images; coordinates only when the shape is
    unchanged (the library's limit)."""

    def __init__(self, augmentor):
        super().__init__()
        self._aug = augmentor

    def get_transform(self, img):
        return IAATransform(self._aug.to_deterministic(), img.shape)

    def __repr__(self):
        return f"imgaug.IAAugmentor({self._aug!r})"

    __str__ = __repr__


class AlbumentationsTransform(Transform):
    """``aug.apply(img, **params)``; coordinates are not supported."""

    def __init__(self, aug, param):
        self._init(locals())

    def apply_image(self, img):
        return self.aug.apply(img, **self.param)


class Albumentations(ImageAugmentor):
    """Wrap an ``albumentations`` transform: parameters from ``augmentor.get_params()``, image
    from ``augmentor.apply(img, **params)``; mapping coordinates raises NotImplementedError."""

    def __init__(self, augmentor):
        super().__init__()
        self._aug = augmentor

    def get_transform(self, img):
        return AlbumentationsTransform(self._aug, self._aug.get_params())

    def __repr__(self):
        return f"imgaug.Albumentations({self._aug!r})"

    __str__ = __repr__
