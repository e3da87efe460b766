"""Built-in map ops and the native marker.

Each op is a small callable object. With ``index=None`` it transforms the value it is given
(``Resize(224)(img)``); with ``index=k`` it transforms component ``k`` of a list/tuple/dict
datapoint and returns a shallow copy of the datapoint (``Resize(224, index=0)(dp)``), so ops can
be listed in a map directly. :class:`Compose` chains ops; ``None`` from any op drops the
datapoint.

Every op states ``native``: true when its work runs in C with the GIL released (numpy, Pillow)
and there is no per-element Python work, so threads run it in parallel. User functions are
marked with :func:`native`. :func:`fuse` merges runs of consecutive native ops into one
:class:`Compose`. Random ops draw only from :func:`dataflow.rng.datapoint_rng`.
"""
from .base import Compose, Lambda, Op, fuse, is_native, native, op_name
from .image import (CenterCrop, Decode, HWC2CHW, Normalize, RandomCrop, RandomHorizontalFlip,
                    Resize, jpeg_decoder)
from .array import OneHot, TypeCast
from .augment import Augment

__all__ = ["native", "is_native", "op_name", "fuse", "Op", "Compose", "Lambda", "Decode",
           "Resize", "RandomCrop", "CenterCrop", "RandomHorizontalFlip", "Normalize", "HWC2CHW",
           "TypeCast", "OneHot", "Augment", "jpeg_decoder"]
