"""Base classes of image augmentors: :class:`ImageAugmentor` (alias :data:`Augmentor`),
:class:`AugmentorList` and :class:`PhotometricAugmentor`.

An augmentor draws its random parameters in ``get_transform(img)`` and returns a deterministic
:class:`~dataflow.imgaug.transform.Transform`; ``augment(img)`` is
``get_transform(img).apply_image(img)``.

**Images.** An image is a numpy array, ``H x W`` or ``H x W x C``, of dtype uint8 (values in
[0, 255]) or floating (values in [0, 1] or [0, 255]). Any other dtype (int16/32/64, uint16,
bool, ...) is rejected by :func:`check_dtype` with a ``TypeError`` naming the dtype (tensorpack
0.11 meant to reject them too, but its check never fired): convert label maps and other integer
images with ``.astype(np.uint8)`` or ``.astype(np.float32)`` first.

**Randomness.** Augmentors draw from ``self.rng``, a ``numpy.random.RandomState`` (the legacy
API: ``uniform``, ``randint``, ``rand``, ``randn``, ``choice``, ``permutation``, ...):

* inside a map (serial ``MapData`` or any parallel map), ``self.rng`` is the datapoint's own
  stream, :func:`dataflow.rng.datapoint_random_state`, shared by all augmentors applied to that
  datapoint in call order. With :func:`dataflow.set_seed` the output therefore depends only on
  the seed and the datapoint (its pass and index), not on the worker count or the executor;
* outside a map, ``self.rng`` is the augmentor's own stream, as in tensorpack:
  ``reset_state()`` reseeds it from :func:`dataflow.rng.get_rng`, a copy in another process
  (forked, or unpickled in a spawned worker) reseeds itself on its first draw, and assigning
  ``self.rng = ...`` replaces it (for use outside maps only). An augmentor whose ``__init__``
  never calls ``super().__init__()`` gets one on first use.

**Native.** A map of native ops runs in threads (see :mod:`dataflow.parallel.policy`). An
augmentor is native, :func:`is_native_augmentor`, when its class states ``native = True`` *in
its own class body* (``"native" in type(aug).__dict__``; every built-in augmentor of
``dataflow.imgaug`` does, since their work runs in OpenCV or numpy with the GIL released) or its
class was marked with :func:`dataflow.native`. A user subclass does *not* inherit the built-in's
flag: its Python code is Python work until its author marks it. Containers
(:class:`AugmentorList`, ``RandomApplyAug``, ``RandomChooseAug``, ``RandomOrderAug``) are native
when all their members are, ``MapImage`` when its functions are marked native.

**Legacy API** (tensorpack < 0.10, still subclassed by user code): an augmentor may define
``_get_augment_params(img)`` and ``_augment(img, params)`` (and ``_augment_coords(coords,
params)``) instead of ``get_transform``; the base ``get_transform`` bridges them. The calls
``augment_return_params``, ``augment_with_params`` and ``augment_coords`` work as before.
"""
import inspect
import logging
import os
from collections import namedtuple

import numpy as np

from .. import rng as _rng
from ..rng import get_rng  # noqa: F401 (tensorpack's module has it)
from ..base import restore_attributes
from . import transform as _transform_module
from .transform import BaseTransform, LazyTransform, PhotometricTransform, Transform, \
    TransformList, default_repr

__all__ = ["Augmentor", "ImageAugmentor", "AugmentorList", "PhotometricAugmentor"]

logger = logging.getLogger("dataflow")

ImagePlaceholder = namedtuple("ImagePlaceholder", ["shape"])

_datapoint_random_state = _rng.datapoint_random_state     # None outside a map
_pid = os.getpid()           # this process; an augmentor's own rng is reseeded when it differs


def _after_fork():
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


_IMAGE_DTYPE_CHARS = frozenset("Befdg")      # uint8, float16/32/64, long double


def check_dtype(img):
    """Raise ``TypeError`` unless ``img`` is a numpy array of dtype uint8 or floating (see the
    module doc for why other integer dtypes are rejected)."""
    if not isinstance(img, np.ndarray):
        raise TypeError(f"[Augmentor] Needs an numpy array, but got a {type(img).__name__}!")
    if img.dtype.char not in _IMAGE_DTYPE_CHARS:
        raise TypeError(
            f"[Augmentor] Needs an image of dtype uint8 or floating point, got {img.dtype} "
            f"(shape {img.shape}); convert it first, e.g. img.astype(np.float32)")


_RandomState = np.random.RandomState
_MT19937 = np.random.MT19937


def randint(rng, low, high=None):
    """``int(rng.randint(low, high))`` (``[0, low)`` when ``high`` is None): the same value
    from the same draws of ``rng``'s stream, so the stream continues identically.

    For numpy's default ``RandomState`` (an MT19937 generator, what an augmentor's own stream
    outside a map is) and a range of at most 2**32 values, the draw is made here: ``randint``
    takes a 32-bit word, masks it to the bit length of the range and draws again while the
    result falls outside (numpy's frozen legacy algorithm), and ``MT19937.random_raw()``
    returns exactly that word, in a tenth of the time ``randint``'s argument handling takes.
    Any other generator, or other arguments, go to ``rng.randint`` itself (the errors are
    its own)."""
    if high is None:
        low, high = 0, low
    if type(rng) is _RandomState and type(low) is int and type(high) is int:
        span = high - 1 - low                   # the largest offset from low
        if 0 < span <= 0xFFFFFFFF:
            bg = rng._bit_generator
            if type(bg) is _MT19937:
                mask = (1 << span.bit_length()) - 1
                raw = bg.random_raw
                v = raw() & mask
                while v > span:
                    v = raw() & mask
                return low + v
    return int(rng.randint(low, high))


def _uniform_by_formula(rng, low, high):
    lo = float(low)
    span = float(high) - lo
    if span - span != 0.0:                  # inf or nan: let uniform() raise its own error
        return rng.uniform(low, high)
    return lo + span * rng.random_sample()


def _formula_matches_uniform():
    """Whether ``low + (high - low) * random_sample()`` computed in Python equals numpy's
    ``RandomState.uniform(low, high)`` bit for bit here (numpy computes the same expression in
    C; a build that fuses its multiply-add would differ in the last bit)."""
    a, b = np.random.RandomState(1234), np.random.RandomState(1234)
    ranges = [(0.0, 1.0), (0.6, 1.4), (-0.4, 0.4), (0.08, 1.0), (0.75, 1.333), (-63, 63)]
    return all(_uniform_by_formula(a, lo, hi) == b.uniform(lo, hi)
               for _ in range(64) for lo, hi in ranges)


_SCALARS = (int, float, np.number)
_PLAIN_NUMBERS = frozenset((int, float))
_float32 = np.float32
_UNIFORM_EXACT = None      # the answer of _formula_matches_uniform(), once asked


def uniform(rng, low, high):
    """``rng.uniform(low, high)``: for scalar bounds, the same float from the same draw of the
    stream. For a ``RandomState`` it is computed as ``uniform`` does in C, ``low + (high -
    low) * rng.random_sample()``, which skips ``uniform``'s conversion of its arguments to
    arrays (a tenth of the time), provided a first call found the two equal on this build;
    otherwise, and for any other generator, it calls ``rng.uniform``."""
    global _UNIFORM_EXACT
    if type(rng) is _RandomState and isinstance(low, _SCALARS) and isinstance(high, _SCALARS):
        if _UNIFORM_EXACT is None:
            _UNIFORM_EXACT = _formula_matches_uniform()
        if _UNIFORM_EXACT:
            return _uniform_by_formula(rng, low, high)
    return rng.uniform(low, high)


def uniform32(rng, low, high):
    """``float32(uniform(rng, low, high))`` for scalar bounds: what an augmentor's
    ``_rand_range(low, high)`` draws, for code that holds ``rng`` in a local (each
    ``self.rng`` is a property lookup)."""
    if _UNIFORM_EXACT and type(rng) is _RandomState and type(low) in _PLAIN_NUMBERS \
            and type(high) in _PLAIN_NUMBERS:
        # uniform()'s fast path written out: this runs for most random draws
        lo = float(low)
        span = float(high) - lo
        if span - span == 0.0:                      # finite
            return _float32(lo + span * rng.random_sample())
    return _float32(uniform(rng, low, high))


def is_native_augmentor(aug):
    """Whether ``aug`` (an :class:`ImageAugmentor`) runs its work in C with the GIL released:
    its class sets ``native = True`` in its own body or was marked with :func:`dataflow.native`;
    a container is native when all its members are. See the module doc."""
    return bool(aug._is_native())


_deprecation_counts = {}


def _log_deprecated(what, limit=3):
    n = _deprecation_counts.get(what, 0)
    if n < limit:
        _deprecation_counts[what] = n + 1
        logger.warning("imgaug: %s is deprecated since 2020-06-06; use get_transform(img) and "
                       "the Transform's apply_image/apply_coords instead.", what)


class ImageAugmentor:
    """Base class of image augmentors (see the module doc for images, randomness, the native
    flag and the legacy API). Subclasses implement ``get_transform(img)``, or the legacy pair
    ``_get_augment_params(img)`` / ``_augment(img, params)``."""

    native = False

    def __init__(self):
        self.reset_state()

    # -- randomness ------------------------------------------------------------------------
    # This augmentor's own RandomState, made at first use, and the process that made it (a
    # forked child reseeds). Plain attributes with class defaults, never self.__dict__: reading
    # __dict__ turns an instance's inline attribute values into a real dict, and every
    # self.x in get_transform then takes the slow lookup (CPython 3.11-3.13).
    _own_rng = None
    _own_rng_pid = None

    def __setstate__(self, state):
        # a worker's copy (spawn, forkserver, Ray): attributes one by one, for the same reason
        # (see DataFlow.__setstate__)
        restore_attributes(self, state)

    @property
    def rng(self):
        """The datapoint's ``RandomState`` inside a map, else this augmentor's own."""
        rs = _datapoint_random_state()
        if rs is not None:
            return rs
        own = self._own_rng
        if own is None or self._own_rng_pid != _pid:
            own = self._reseed()
        return own

    @rng.setter
    def rng(self, value):
        self._own_rng = value
        self._own_rng_pid = _pid

    def _reseed(self):
        self.rng = own = _rng.get_rng(self)
        return own

    def reset_state(self):
        """Reseed this augmentor's own rng (call it in the process that uses the augmentor;
        the ``AugmentImage*`` dataflows do)."""
        self._reseed()

    def _rand_range(self, low=1.0, high=None, size=None):
        """Uniform float32 in ``[low, high)`` (``[0, low)`` when ``high`` is None): a numpy
        float32 scalar, or an array of shape ``size``."""
        if high is None:
            low, high = 0, low
        if size is None:
            return uniform32(self.rng, low, high)
        return self.rng.uniform(low, high, size).astype(np.float32)

    def _init(self, params=None):
        """Set every entry of ``params`` (``locals()`` of ``__init__``) not named ``self`` and not
        starting with ``_`` as an attribute (tensorpack's constructor convention). The
        augmentors of this package have their arguments' kinds checked first
        (:func:`check_argument_kinds`)."""
        if params:
            if type(self).__module__.startswith(_PACKAGE):
                check_argument_kinds(self, params)
            for k, v in params.items():
                if k != "self" and not k.startswith("_"):
                    setattr(self, k, v)

    def _is_native(self):
        cls = type(self)
        return cls.__dict__.get("native", False) is True or \
            bool(getattr(cls, "__dataflow_native__", False))

    # -- the Transform API -----------------------------------------------------------------
    def get_transform(self, img):
        """A deterministic transform for ``img``; all randomness is drawn here. The base
        implementation bridges legacy augmentors (``_get_augment_params`` / ``_augment``)."""
        _log_deprecated(f"{type(self).__name__}: the _get_augment_params/_augment interface",
                        limit=1)
        if hasattr(self, "_get_augment_params"):
            params = self._get_augment_params(img)
        elif hasattr(self, "get_augment_params"):
            params = self.get_augment_params(img)
        else:
            params = None
        if isinstance(params, BaseTransform):
            return params
        return _LegacyTransform(self, params)

    def augment(self, img):
        """``get_transform(img).apply_image(img)``, after :func:`check_dtype`."""
        check_dtype(img)
        return self.get_transform(img).apply_image(img)

    # -- the legacy API --------------------------------------------------------------------
    def augment_return_params(self, d):
        """Legacy: ``(augmented image, transform)``."""
        _log_deprecated("augment_return_params")
        t = self.get_transform(d)
        return t.apply_image(d), t

    def augment_with_params(self, d, param):
        """Legacy: apply the transform ``param`` returned by :meth:`augment_return_params`."""
        _log_deprecated("augment_with_params")
        return param.apply_image(d)

    def augment_coords(self, coords, param):
        """Legacy: map ``coords`` through the transform ``param``."""
        _log_deprecated("augment_coords")
        return param.apply_coords(coords)

    def __repr__(self):
        try:
            return default_repr(self)
        except Exception:
            return object.__repr__(self)

    __str__ = __repr__


Augmentor = ImageAugmentor
TransformAugmentorBase = ImageAugmentor       # tensorpack's legacy alias
# tensorpack 0.11's transform module has both too (an older FasterRCNN subclasses
# transform.TransformAugmentorBase); set here, since that module cannot import this one
_transform_module.ImageAugmentor = _transform_module.TransformAugmentorBase = ImageAugmentor


class _LegacyTransform(Transform):
    """What the base ``get_transform`` returns for a legacy augmentor: ``_augment(img, params)``
    for images; ``_augment_coords(coords, params)`` (or an overridden ``augment_coords``) for
    coordinates, which are unchanged when the augmentor defines neither (the old default)."""

    def __init__(self, aug, params):
        self.aug, self.params = aug, params

    def apply_image(self, img):
        aug = self.aug
        if not hasattr(aug, "_augment"):
            raise NotImplementedError(f"{type(aug).__name__} implements neither get_transform "
                                      "nor the legacy _augment")
        return aug._augment(img, self.params)

    def apply_coords(self, coords):
        aug = self.aug
        if hasattr(aug, "_augment_coords"):
            return aug._augment_coords(coords, self.params)
        if type(aug).augment_coords is not ImageAugmentor.augment_coords:
            return aug.augment_coords(coords, self.params)
        return coords

    def __getattr__(self, name):
        if name.startswith("apply_"):
            cls = type(self.__dict__["aug"]).__name__

            def missing(*args, **kwargs):
                raise NotImplementedError(f"{cls} does not implement method {name}")
            return missing
        raise AttributeError(name)

    def __repr__(self):
        return f"imgaug.TransformFactory(LegacyConversion -- {self.aug!r})"

    __str__ = __repr__


class AugmentorList(ImageAugmentor):
    """Apply ``augmentors`` (a list or tuple) in order.

    ``get_transform(img)`` asks the first augmentor for its transform at once and wraps every
    later one in a :class:`~dataflow.imgaug.transform.LazyTransform`, made on its first
    ``apply_image`` from the *intermediate* image, so each augmentor sees the output of the
    previous ones. Hence ``apply_image`` must run before ``apply_coords`` (which otherwise
    raises ``AssertionError``), and applying the same transform to a second image reuses the
    parameters drawn for the first. ``reset_state()`` reseeds every member.
    """

    native = True

    def __init__(self, augmentors):
        if not isinstance(augmentors, (list, tuple)):
            raise TypeError(f"AugmentorList needs a list or tuple of augmentors, got "
                            f"{type(augmentors).__name__}")
        self.augmentors = augmentors
        super().__init__()

    def get_transform(self, img):
        check_dtype(img)
        if img.ndim not in (2, 3):
            raise ValueError(f"AugmentorList needs an HW or HWC image, got shape {img.shape}")
        if not self.augmentors:
            return TransformList([])
        first = self.augmentors[0].get_transform(img)
        tfms = list(first.tfms) if isinstance(first, TransformList) else [first]
        for a in self.augmentors[1:]:
            tfms.append(LazyTransform(a.get_transform))
        return TransformList(tfms)

    def augment(self, img):
        """``get_transform(img).apply_image(img)``, without building the lazy list: each
        member's transform is made from the previous member's output and applied at once, which
        is what the lazy list does (the same draws in the same order, the same image). A
        subclass that overrides ``get_transform`` has it called, as before."""
        if type(self).get_transform is not AugmentorList.get_transform:
            return super().augment(img)
        check_dtype(img)
        if img.ndim not in (2, 3):
            raise ValueError(f"AugmentorList needs an HW or HWC image, got shape {img.shape}")
        for a in self.augmentors:
            img = a.get_transform(img).apply_image(img)
        return img

    def reset_state(self):
        super().reset_state()
        for a in self.augmentors:
            a.reset_state()

    def _is_native(self):
        return ImageAugmentor._is_native(self) and \
            all(is_native_augmentor(a) for a in self.augmentors)

    def __repr__(self):
        inner = ",\n".join("  " + repr(a) for a in self.augmentors)
        return f"imgaug.AugmentorList([\n{inner}])"

    __str__ = __repr__


class PhotometricAugmentor(ImageAugmentor):
    """An augmentor that changes pixel values only: coordinates are unchanged. Subclasses
    implement ``_get_augment_params(img)`` (drawn eagerly in ``get_transform``; ``None`` by
    default) and ``_augment(img, params)``."""

    def get_transform(self, img):
        return _AugmentorTransform(self, self._get_augment_params(img))

    def _get_augment_params(self, _):
        return None


class _AugmentorTransform(PhotometricTransform):
    """The transform of a :class:`PhotometricAugmentor`: ``aug._augment(img, params)``; its
    name (``"from <augmentor repr>"``) is built only when printed."""

    def __init__(self, aug, params):
        self.aug, self.params = aug, params

    def apply_image(self, img):
        return self.aug._augment(img, self.params)

    def func(self, img):
        return self.aug._augment(img, self.params)

    @property
    def name(self):
        return "from " + str(self.aug)


_PACKAGE = __name__.rsplit(".", 1)[0] + "."        # "dataflow.imgaug."

# The argument names of the built-in augmentors by kind, for check_argument_kinds.
_FLAG_ARGS = frozenset({"all_channel", "clip", "horiz", "vert", "keepdims", "keepshape",
                        "symmetric", "rgb"})
_NUMBER_ARGS = frozenset({
    "alpha", "aspect_ratio_range", "aspect_ratio_thres", "background_shape", "black_prob",
    "border", "border_value", "center_range", "crop_area_fraction", "crop_shape", "delta",
    "eigval", "eigvec", "factor_range", "fill", "h_range", "hmax", "hmin", "horiz_frac",
    "interp", "max", "max_deg", "max_size", "min", "minimum", "prob", "quality_range", "range",
    "rotate_max_deg", "scale", "shape", "shear", "sigma", "sigma_range", "size", "size_range",
    "std", "step_deg", "target_shape", "translate_frac", "vert_frac", "w_range", "white_prob",
    "wmax", "wmin", "xrange", "yrange"})
_CALLABLE_ARGS = frozenset({"func", "coord_func"})
_AUGMENTOR_ARGS = frozenset({"aug", "aug_lists"})     # an augmentor; a list of them


def _holds_text(value):
    if isinstance(value, (str, bytes)):
        return True
    return isinstance(value, (list, tuple)) and any(_holds_text(v) for v in value)


def check_argument_kinds(aug, params):
    """``TypeError`` naming the augmentor and the argument when an argument of a built-in
    augmentor is of the wrong kind, instead of being taken as Python would take it: a yes/no
    flag given as a string (``"False"`` is true), a number given as a string (``"3"`` was
    turned into 3 by numpy, or failed at the first image) or as ``None`` for a required one
    (one with a default may be given ``None``: OpenCV takes ``interp=None`` as its default,
    ``Clip(max=None)`` clips one side), a function that is not callable. Values are not
    range-checked here."""
    who = type(aug).__name__
    defaults = None
    for name, value in params.items():
        if name in _FLAG_ARGS:
            if isinstance(value, (str, bytes)):
                raise TypeError(f"{who}: {name} must be True or False, got {value!r}")
        elif name in _NUMBER_ARGS:
            if value is None:
                if defaults is None:
                    defaults = {k: p.default for k, p in
                                inspect.signature(type(aug).__init__).parameters.items()}
                if defaults.get(name, inspect.Parameter.empty) is inspect.Parameter.empty:
                    raise TypeError(f"{who}: {name} must be a number, got None")
            elif _holds_text(value) or isinstance(value, bool):
                raise TypeError(f"{who}: {name} must be a number (or a tuple of numbers), got "
                                f"{value!r}")
        elif name in _CALLABLE_ARGS:
            if value is not None and not callable(value):
                raise TypeError(f"{who}: {name} must be callable, got {value!r}")
        elif name in _AUGMENTOR_ARGS:
            members = value if isinstance(value, (list, tuple)) and name != "aug" else [value]
            for m in members:
                if not callable(getattr(m, "get_transform", None)):
                    raise TypeError(f"{who}: {name} must be " + (
                        "an augmentor" if name == "aug" else "a list of augmentors") +
                        f", got {m!r}")


def check_probability(who, prob, name="prob"):
    """``ValueError`` unless ``prob`` is a number in [0, 1] (``Flip(prob=2)`` always flipped)."""
    if isinstance(prob, bool) or not isinstance(prob, (int, float, np.integer, np.floating)) \
            or not 0 <= prob <= 1:
        raise ValueError(f"{who}: {name} must be a number in [0, 1], got {prob!r}")


def check_range(who, name, value):
    """``ValueError`` unless ``value`` is a pair ``(low, high)`` (a number failed at the first
    image with "argument after * must be an iterable")."""
    if not (isinstance(value, (tuple, list, np.ndarray)) and len(value) == 2):
        raise ValueError(f"{who}: {name} must be a pair (low, high), got {value!r}")


def check_order(who, low_name, low, high_name, high, strict, hint=""):
    """``ValueError`` unless ``low < high`` (``strict``) or ``low <= high``: a range that holds
    no value failed at the first image inside numpy's ``randint`` ("low >= high")."""
    if low < high if strict else low <= high:
        return
    raise ValueError(f"{who}: {low_name} must be {'<' if strict else '<='} {high_name}, got "
                     f"{low_name}={low!r}, {high_name}={high!r}{hint}")


def check_positive_size(who, name, sizes, given):
    """``ValueError`` unless every one of ``sizes`` is > 0 (a size of 0 or less made an empty
    image, or failed later inside OpenCV)."""
    if not all(s > 0 for s in sizes):
        raise ValueError(f"{who}: {name} must be positive, got {given!r}")


def shape2d(a):
    """``[a, a]`` for an int (a numpy integer included), ``list(a)`` for a pair (a list, a
    tuple or a numpy array of shape ``(2,)``, which tensorpack's ``CenterPaste`` and
    ``RandomPaste`` take); otherwise ``RuntimeError("Illegal shape")`` (tensorpack's
    helper)."""
    if isinstance(a, (int, np.integer)) and not isinstance(a, bool):
        return [int(a), int(a)]
    if isinstance(a, (list, tuple)) and len(a) == 2:
        return list(a)
    if isinstance(a, np.ndarray) and a.shape == (2,):
        return a.tolist()
    raise RuntimeError(f"Illegal shape: {a!r}")
