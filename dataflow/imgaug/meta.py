"""Augmentors made of augmentors or functions: :class:`Identity`, :class:`RandomApplyAug`,
:class:`RandomChooseAug`, :class:`RandomOrderAug`, :class:`MapImage`. A container resets its
members in ``reset_state()`` and is native when all its members are."""
import numpy as np

from .base import ImageAugmentor, check_probability, is_native_augmentor
from .transform import NoOpTransform, Transform, TransformList
from .transform import TransformFactory  # noqa: F401 (tensorpack's module has it)

__all__ = ["Identity", "RandomApplyAug", "RandomChooseAug", "RandomOrderAug", "MapImage"]


class Identity(ImageAugmentor):
    """Leaves images and coordinates unchanged."""

    native = True

    def get_transform(self, img):
        return NoOpTransform()


class _Container(ImageAugmentor):
    def _members(self):
        raise NotImplementedError

    def reset_state(self):
        super().reset_state()
        for a in self._members():
            a.reset_state()

    def _is_native(self):
        return ImageAugmentor._is_native(self) and \
            all(is_native_augmentor(a) for a in self._members())


class RandomApplyAug(_Container):
    """Apply ``aug`` with probability ``prob``, else nothing."""

    native = True

    def __init__(self, aug, prob):
        check_probability("RandomApplyAug", prob)
        self._init(locals())
        super().__init__()

    def _members(self):
        return [self.aug]

    def get_transform(self, img):
        if self.rng.rand() < self.prob:
            return self.aug.get_transform(img)
        return NoOpTransform()


class RandomChooseAug(_Container):
    """Apply one augmentor chosen at random from ``aug_lists``: a list of augmentors (chosen
    uniformly) or of ``(augmentor, probability)`` pairs, whose probabilities must sum to 1. As
    in 0.11, ``aug_lists`` then holds the augmentors and ``prob`` the probabilities."""

    native = True

    def __init__(self, aug_lists):
        if len(aug_lists) == 0:
            raise ValueError("RandomChooseAug needs at least one augmentor")
        if isinstance(aug_lists[0], (tuple, list)):
            prob = [p for _, p in aug_lists]
            aug_lists = [a for a, _ in aug_lists]
            total = float(np.sum(prob))
            # numpy's choice would refuse them at the first draw (0.11 failed there)
            if abs(total - 1.0) > 1e-8 or min(prob) < 0:
                raise ValueError(f"RandomChooseAug: the probabilities {prob} must be >= 0 and "
                                 f"sum to 1 (they sum to {total})")
        else:
            aug_lists = list(aug_lists)
            prob = [1.0 / len(aug_lists)] * len(aug_lists)
        self._init(locals())
        super().__init__()

    def _members(self):
        return self.aug_lists

    def get_transform(self, img):
        idx = self.rng.choice(len(self.aug_lists), p=self.prob)
        return self.aug_lists[idx].get_transform(img)


class RandomOrderAug(_Container):
    """Apply all of ``aug_lists`` in a random order. Every member's transform is made from
    the *original* image, so the members must not change the image's shape."""

    native = True

    def __init__(self, aug_lists):
        self._init(locals())
        super().__init__()

    def _members(self):
        return self.aug_lists

    def get_transform(self, img):
        idxs = self.rng.permutation(len(self.aug_lists)).tolist()
        tfms = [a.get_transform(img) for a in self.aug_lists]
        return TransformList([tfms[k] for k in idxs])


class _FunctionTransform(Transform):
    def __init__(self, func, coord_func, aug):
        self.func, self.coord_func, self.aug = func, coord_func, aug

    def apply_image(self, img):
        return self.func(img)

    def apply_coords(self, coords):
        if self.coord_func is None:
            raise NotImplementedError(f"{self.aug!r} was given no coord_func: it cannot map "
                                      "coordinates")
        return self.coord_func(coords)

    def __repr__(self):
        return "imgaug.TransformFactory(MapImage)"         # as 0.11's

    __str__ = __repr__


class MapImage(ImageAugmentor):
    """Apply ``func`` to the image and ``coord_func`` (if given; otherwise mapping coordinates
    raises ``NotImplementedError``) to coordinates. Native when the functions are marked with
    :func:`dataflow.native`."""

    native = True

    def __init__(self, func, coord_func=None):
        super().__init__()
        self._init(locals())

    def get_transform(self, img):
        return _FunctionTransform(self.func, self.coord_func, self)

    def _is_native(self):
        from ..ops.base import is_native
        return ImageAugmentor._is_native(self) and is_native(self.func) and \
            (self.coord_func is None or is_native(self.coord_func))
