"""``GaussianDeform``: a smooth random elastic deformation (deprecated in tensorpack and not
exported by :mod:`dataflow.imgaug`; importable from here, as there)."""
import numpy as np

from ._cv import cv2
from .transform import cv_apply
from .base import ImageAugmentor
from .transform import Transform
from .transform import TransformFactory  # noqa: F401 (tensorpack's module has it)

__all__ = []


class GaussianMap:
    """Gaussian weights ``exp(-d**2 / sigma)`` of every pixel of an ``image_shape`` image to an
    anchor ``(y, x)`` given in units of the image size (``d`` in the same units: pixel
    ``(i, j)`` is at ``(i / h, j / w)``)."""

    def __init__(self, image_shape, sigma=0.5):
        self.shape = tuple(image_shape[:2])
        self.sigma = sigma

    def get_gaussian_weight(self, anchor):
        h, w = self.shape
        ys = np.arange(h, dtype=np.float32) / h - np.float32(anchor[0])
        xs = np.arange(w, dtype=np.float32) / w - np.float32(anchor[1])
        d2 = ys[:, None] ** 2 + xs[None, :] ** 2
        return np.exp(-d2 / self.sigma)


class _RemapTransform(Transform):
    def __init__(self, map_x, map_y):
        self.map_x, self.map_y = map_x, map_y

    def apply_image(self, img):
        c = cv2()
        out = cv_apply(c.remap, img, self.map_x, self.map_y, c.INTER_LINEAR,
                       borderMode=c.BORDER_REPLICATE)
        return out.reshape(img.shape)


class GaussianDeform(ImageAugmentor):
    """Move each anchor (``(y, x)`` in [0, 1] of the image size) by a random offset in
    ``±randrange`` pixels (default ``shape[0] / 8``) and warp the image smoothly, each pixel
    following the anchors with Gaussian weights of width ``sigma``. Images must have
    ``shape`` (``(h, w)``). Coordinates are not supported."""

    native = True

    def __init__(self, anchors, shape, sigma=0.5, randrange=None):
        super().__init__()
        self.anchors = np.asarray(anchors, dtype=np.float32)
        self.shape = tuple(shape[:2])
        self.sigma = sigma
        self.randrange = shape[0] / 8 if randrange is None else randrange
        gm = GaussianMap(self.shape, sigma=sigma)
        weights = np.stack([gm.get_gaussian_weight(a) for a in self.anchors], axis=-1)
        self._weights = weights / weights.sum(axis=-1, keepdims=True)
        h, w = self.shape
        self._grid_y, self._grid_x = np.mgrid[0:h, 0:w].astype(np.float32)

    def get_transform(self, img):
        if img.shape[:2] != self.shape:
            raise ValueError(f"GaussianDeform was built for images of size {self.shape}, got "
                             f"shape {img.shape}")
        offsets = self._rand_range(-self.randrange, self.randrange, size=(len(self.anchors), 2))
        flow = self._weights @ offsets
        map_y = (self._grid_y + flow[..., 0]).astype(np.float32)
        map_x = (self._grid_x + flow[..., 1]).astype(np.float32)
        return _RemapTransform(map_x, map_y)
