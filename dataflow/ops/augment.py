"""The image-augmentor op: :class:`Augment` applies :mod:`dataflow.imgaug` augmentors in a map.

``MapData(ds, [Decode(index=0), Augment([imgaug.Flip(horiz=True), ...], index=0)],
num_parallel_workers=N, python_multiprocessing=True)`` runs in threads when every augmentor is
native (all built-in augmentors are: their work runs in OpenCV and numpy with the GIL released)
and in processes when one is Python code (a user's ``ImageAugmentor`` subclass, unless its class
is marked with :func:`dataflow.native`); see :func:`dataflow.imgaug.base.is_native_augmentor`.

Random draws come from the datapoint's own stream (see :mod:`dataflow.imgaug.base`), so with
:func:`dataflow.set_seed` an ordered parallel map gives exactly the serial output.
"""
import numpy as np

from .base import Op

__all__ = ["Augment", "as_augmentor_list"]


def as_augmentor_list(augmentors, what):
    """``augmentors`` as one :class:`~dataflow.imgaug.AugmentorList`: an ``AugmentorList`` is
    used as is, a list or tuple is wrapped, a single augmentor becomes a list of one."""
    from ..imgaug import AugmentorList, ImageAugmentor
    if isinstance(augmentors, AugmentorList):
        return augmentors
    if isinstance(augmentors, ImageAugmentor):
        augmentors = [augmentors]
    if not isinstance(augmentors, (list, tuple)):
        raise TypeError(f"{what}: augmentors must be an AugmentorList, a list or tuple of "
                        f"augmentors, or one augmentor; got {type(augmentors).__name__}")
    for i, a in enumerate(augmentors):
        if not isinstance(a, ImageAugmentor):
            raise TypeError(f"{what}: augmentor #{i} is not an imgaug.ImageAugmentor: {a!r}")
    return AugmentorList(list(augmentors))


def augmentors_native(augs):
    """Whether the augmentor (list) ``augs`` is native, by the rule in the module doc."""
    from ..imgaug.base import is_native_augmentor
    return is_native_augmentor(augs)


class Augment(Op):
    """Apply image augmentors to an image: ``AugmentorList(augmentors).augment(img)``.

    ``augmentors`` is an :class:`~dataflow.imgaug.AugmentorList`, a list or tuple of
    augmentors, or one augmentor. With ``index=k`` (default 0) the op augments component ``k`` of
    a list/tuple/dict datapoint and returns a shallow copy of the datapoint; with
    ``index=None`` it augments the value it is given.

    The image is an HW or HWC numpy array of dtype uint8 or floating (others raise
    ``TypeError``). ``copy=True`` (default) hands the augmentors a copy of the image, so the
    caller's array is never modified, even by augmentors that write in place (``RandomCutout``,
    ``SaltPepperNoise``); ``copy=False`` saves that copy when the image is not used elsewhere
    (freshly decoded, say).

    ``native`` is true when every augmentor is native (see the module doc), so the run-in-thread
    table places a map of built-in augmentors in threads. Random draws come from the datapoint's
    stream: with :func:`dataflow.set_seed` the output is the same for any executor and worker
    count.
    """

    _fields = ("augmentors",)

    def __init__(self, augmentors, index=0, *, copy=True):
        super().__init__(index)
        self.augs = as_augmentor_list(augmentors, "Augment")
        self.copy = bool(copy)

    @property
    def augmentors(self):
        return self.augs.augmentors

    @property
    def native(self):
        return augmentors_native(self.augs)

    def apply(self, img):
        if self.copy and isinstance(img, np.ndarray):
            img = img.copy()
        return self.augs.augment(img)

    def reset_state(self):
        """Reseed the augmentors' own streams (used outside a map)."""
        self.augs.reset_state()
