"""Deterministic transforms: what an augmentor's ``get_transform(img)`` returns.

A transform holds no randomness. ``apply_image(img)`` maps an image and ``apply_coords(coords)``
maps an ``(N, 2)`` array of ``(x, y)`` points through the same geometry, so one transform can be
applied to an image, to a mask of the same size and to its key points.

Guarantees (tensorpack 0.11's contract, kept):

* ``apply_image`` may modify its input in place or return a view of it (``CropTransform``
  returns a view); copy first if the caller's array must survive. ``FlipTransform`` and
  ``TransposeTransform`` return new C-contiguous arrays, where 0.11 returned views: the view
  only deferred the copy to its reader (``BatchData``, the next OpenCV call), and numpy
  copies a horizontally flipped 224 x 224 x 3 uint8 view in about 460 us where ``cv2.flip``
  makes it in 6 us, without the GIL.
* ``apply_coords`` accepts coordinates of any floating dtype (float16/32/64) and modifies them
  in place where it can, returning the result in the input's dtype. Integer coordinates are
  converted to a new float64 array. (0.11 rejected float32 by accident of numpy; it is accepted.)
* Coordinates use the continuous pixel-edge convention: pixel ``j`` spans ``[j, j + 1)``, so a
  horizontal flip maps ``x`` to ``w - x`` and a resize scales ``x`` by ``new_w / w``. Rotations
  and affine warps apply their OpenCV matrix to the points unchanged.
* A transform that cannot map coordinates raises ``NotImplementedError`` naming the class.

Exported by :mod:`dataflow.imgaug`: :class:`Transform`, :class:`ResizeTransform`,
:class:`CropTransform`, :class:`FlipTransform`, :class:`TransformList` and
:class:`TransformFactory`. The others are importable from this module, as in tensorpack.
"""
import inspect
import pprint

import numpy as np

from ._cv import INTER_LINEAR, BORDER_CONSTANT, cv2

__all__ = ["Transform", "ResizeTransform", "CropTransform", "FlipTransform", "TransformList",
           "TransformFactory"]


# ImageAugmentor and TransformAugmentorBase, which tensorpack 0.11 has here too, are set by .base
# (which imports this module) where ImageAugmentor is defined.


def default_repr(obj, prefix="imgaug."):
    """``imgaug.Name(arg=value, ...)``: the constructor's arguments, read back from the
    attributes of the same names, leaving out those whose value is the default object itself
    (and those not stored as attributes); each value as ``pprint.pformat`` gives it, as in
    tensorpack (a long list wraps over lines)."""
    params = inspect.signature(type(obj).__init__).parameters
    parts = []
    for name, p in params.items():
        if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name not in obj.__dict__:
            continue
        value = obj.__dict__[name]
        if value is p.default:
            continue
        parts.append(f"{name}={pprint.pformat(value)}")   # as tensorpack: long values wrap
    return f"{prefix}{type(obj).__name__}({', '.join(parts)})"


def as_float_coords(coords):
    """``coords`` itself when it is a floating array (so it can be updated in place), else a
    new float64 array with the same values."""
    if isinstance(coords, np.ndarray) and coords.dtype.kind == "f":
        return coords
    return np.array(coords, dtype=np.float64)


class BaseTransform:
    """Type tag of every transform (tensorpack's ``BaseTransform``), with the ``_init(locals())``
    constructor helper: every local not named ``self`` and not starting with ``_`` becomes an
    attribute."""

    def _init(self, params=None):
        if params:
            for k, v in params.items():
                if k != "self" and not k.startswith("_"):
                    setattr(self, k, v)


class Transform(BaseTransform):
    """Base class of deterministic transforms. Subclasses define ``apply_image(img)`` and,
    when they can, ``apply_coords(coords)``; any missing ``apply_*`` method raises
    ``NotImplementedError("<Class> does not implement method apply_<x>")`` when called."""

    def __getattr__(self, name):
        if name.startswith("apply_"):
            cls = type(self).__name__

            def missing(*args, **kwargs):
                raise NotImplementedError(f"{cls} does not implement method {name}")
            return missing
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self):
        try:
            return default_repr(self)
        except Exception:      # a subclass with an odd __init__ must still print
            return object.__repr__(self)

    __str__ = __repr__


def _keep_channel_axis(out, img):
    # OpenCV drops a trailing axis of length 1
    if img.ndim == 3 and out.ndim == 2:
        return out[:, :, np.newaxis]
    return out


def cv_input(img):
    """``img`` itself when OpenCV can read it without a copy: C-contiguous, or a crop of a
    C-contiguous array (rows apart, each row contiguous, as an OpenCV ROI); otherwise (a
    flipped or transposed view) a contiguous copy."""
    if img.flags.c_contiguous:
        return img
    s, item = img.strides, img.itemsize
    if img.ndim == 2:
        inner_ok = s[1] == item
    else:
        inner_ok = s[2] == item and s[1] == item * img.shape[2]
    if inner_ok and s[0] >= s[1] * img.shape[1]:
        return img
    return np.ascontiguousarray(img)


def cv_apply(fn, img, *args, **kwargs):
    """``fn(cv_input(img), *args, **kwargs)`` for an OpenCV image function; a float16 image,
    which ``cv2.resize``, ``warpAffine``, ``remap`` and ``GaussianBlur`` refuse, goes through
    float32 and comes back as float16."""
    if img.dtype == np.float16:
        return fn(img.astype(np.float32), *args, **kwargs).astype(np.float16)
    return fn(cv_input(img), *args, **kwargs)


class ResizeTransform(Transform):
    """Resize an ``h x w`` image to ``new_h x new_w`` with ``cv2.resize`` and interpolation
    ``interp``; coordinates are scaled by ``new_w / w`` and ``new_h / h``."""

    def __init__(self, h, w, new_h, new_w, interp):
        self.h, self.w, self.new_h, self.new_w, self.interp = h, w, new_h, new_w, interp

    def apply_image(self, img):
        if img.shape[:2] != (self.h, self.w):
            raise ValueError(f"ResizeTransform expects an image of size {(self.h, self.w)}, "
                             f"got shape {img.shape}")
        out = cv_apply(cv2().resize, img, (self.new_w, self.new_h), interpolation=self.interp)
        return _keep_channel_axis(out, img)

    def apply_coords(self, coords):
        coords = as_float_coords(coords)
        coords[:, 0] *= self.new_w * 1.0 / self.w
        coords[:, 1] *= self.new_h * 1.0 / self.h
        return coords


class CropTransform(Transform):
    """Crop ``img[y0:y0 + h, x0:x0 + w]`` (a view); coordinates are shifted by ``(-x0, -y0)``."""

    def __init__(self, y0, x0, h, w):
        self.y0, self.x0, self.h, self.w = y0, x0, h, w

    def apply_image(self, img):
        return img[self.y0:self.y0 + self.h, self.x0:self.x0 + self.w]

    def apply_coords(self, coords):
        coords = as_float_coords(coords)
        coords[:, 0] -= self.x0
        coords[:, 1] -= self.y0
        return coords


class WarpAffineTransform(Transform):
    """``cv2.warpAffine`` with the 2x3 matrix ``mat`` to size ``dsize = (w, h)``; coordinates
    are mapped by the same matrix (``[x, y, 1] @ mat.T``)."""

    def __init__(self, mat, dsize, interp=INTER_LINEAR, borderMode=BORDER_CONSTANT,
                 borderValue=0):
        self.mat, self.dsize, self.interp = mat, dsize, interp
        self.borderMode, self.borderValue = borderMode, borderValue

    def apply_image(self, img):
        out = cv_apply(cv2().warpAffine, img, self.mat, self.dsize, flags=self.interp,
                       borderMode=self.borderMode, borderValue=self.borderValue)
        return _keep_channel_axis(out, img)

    def apply_coords(self, coords):
        coords = as_float_coords(coords)
        mat = np.asarray(self.mat, dtype=np.float64)
        out = coords @ mat[:, :2].T
        out += mat[:, 2]
        return out.astype(coords.dtype, copy=False)


# dtypes cv2.flip and cv2.transpose take (and give back unchanged)
_CV_COPY_DTYPES = frozenset(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16,
                                                  np.int32, np.float32, np.float64))


def _opencv_takes(img):
    """Whether ``cv2.flip``/``cv2.transpose`` take ``img``: a non-empty HW or HWC image of up
    to 4 channels of one of their dtypes."""
    shape = img.shape      # (read once: each ndarray attribute costs about a dict lookup)
    return img.dtype in _CV_COPY_DTYPES and 0 not in shape and \
        (len(shape) == 2 or (len(shape) == 3 and shape[2] <= 4))


class FlipTransform(Transform):
    """Flip an ``h x w`` image horizontally (``horiz=True``) or vertically, into a new
    C-contiguous array (``cv2.flip``, which runs without the GIL, for up to 4 channels of the
    dtypes OpenCV takes; a numpy copy otherwise); coordinates map ``x -> w - x`` or
    ``y -> h - y``."""

    def __init__(self, h, w, horiz=True):
        self.h, self.w, self.horiz = h, w, horiz

    def apply_image(self, img):
        if _opencv_takes(img):
            out = cv2().flip(cv_input(img), 1 if self.horiz else 0)
            return out[:, :, None] if out.ndim != img.ndim else out    # (h, w, 1) came back 2-D
        return np.ascontiguousarray(img[:, ::-1] if self.horiz else img[::-1])

    def apply_coords(self, coords):
        coords = as_float_coords(coords)
        if self.horiz:
            np.subtract(self.w, coords[:, 0], out=coords[:, 0])
        else:
            np.subtract(self.h, coords[:, 1], out=coords[:, 1])
        return coords


class TransposeTransform(Transform):
    """Swap the two image axes, into a new C-contiguous array (``cv2.transpose`` for up to 4
    channels of the dtypes OpenCV takes, numpy otherwise; 0.11 returned a view, whose reader
    had to make numpy's slow strided copy); coordinates swap ``x`` and ``y``."""

    def __init__(self):
        pass

    def apply_image(self, img):
        if _opencv_takes(img):
            out = cv2().transpose(cv_input(img))
            return out[:, :, None] if out.ndim != img.ndim else out    # (h, w, 1) came back 2-D
        return np.ascontiguousarray(img.swapaxes(0, 1))

    def apply_coords(self, coords):
        coords = as_float_coords(coords)
        return coords[:, ::-1]


class NoOpTransform(Transform):
    """The identity, for images, coordinates and any other ``apply_*``."""

    def __init__(self):
        pass

    def __getattr__(self, name):
        if name.startswith("apply_"):
            return lambda x: x
        raise AttributeError(f"'NoOpTransform' object has no attribute {name!r}")


class PhotometricTransform(Transform):
    """``apply_image`` is ``func(img)``; coordinates are unchanged."""

    def __init__(self, func, name=None):
        self.func, self.name = func, name

    def apply_image(self, img):
        return self.func(img)

    def apply_coords(self, coords):
        return coords

    def __repr__(self):
        return f"imgaug.PhotometricTransform({self.name})" if self.name else \
            "imgaug.PhotometricTransform()"

    __str__ = __repr__


class TransformFactory(Transform):
    """A transform built from functions: ``TransformFactory(name=None, apply_image=f,
    apply_coords=g)``. Every keyword must start with ``apply_`` (``KeyError`` otherwise); an
    ``apply_*`` not given raises ``NotImplementedError`` when called."""

    def __init__(self, name=None, **kwargs):
        for k, v in kwargs.items():
            if not k.startswith("apply_"):
                raise KeyError(f"Unknown argument '{k}' in TransformFactory!")
            setattr(self, k, v)
        self._name = name

    def __repr__(self):
        return f"imgaug.TransformFactory({self._name})" if self._name else \
            "imgaug.TransformFactory()"

    __str__ = __repr__


class LazyTransform(BaseTransform):
    """A transform made on its first ``apply_image`` by ``get_transform(img)``, from the image
    it is applied to (how :class:`AugmentorList` lets a later augmentor see the output of the
    earlier ones). Later calls reuse the same transform. Any other ``apply_*`` before the first
    ``apply_image`` raises ``AssertionError``, as in tensorpack."""

    def __init__(self, get_transform):
        self.get_transform = get_transform
        self._transform = None

    def apply_image(self, img):
        if self._transform is None:
            self._transform = self.get_transform(img)
        return self._transform.apply_image(img)

    def _applied(self, name):
        assert self._transform is not None, (
            f"LazyTransform.{name} can only be called after the transform has been applied on "
            "an image (AugmentorList makes its later transforms lazily: call apply_image first)")
        return self._transform

    def apply_coords(self, coords):
        return self._applied("apply_coords").apply_coords(coords)

    def __getattr__(self, name):
        if name.startswith("apply_"):
            return lambda x: getattr(self._applied(name), name)(x)
        raise AttributeError(f"'LazyTransform' object has no attribute {name!r}")

    def __repr__(self):
        if self._transform is not None:
            return repr(self._transform)
        return f"LazyTransform(get_transform={self.get_transform!r})"

    __str__ = __repr__


class TransformList(BaseTransform):
    """Apply the transforms ``tfms`` in order, for images, coordinates and any other
    ``apply_*``. ``+`` and ``+=`` concatenate with a transform or another list."""

    def __init__(self, tfms):
        for t in tfms:
            if not isinstance(t, BaseTransform):
                raise TypeError(f"TransformList takes transforms, got {type(t).__name__}: {t!r}")
        self.tfms = list(tfms)

    def apply_image(self, img):
        for t in self.tfms:
            img = t.apply_image(img)
        return img

    def apply_coords(self, coords):
        for t in self.tfms:
            coords = t.apply_coords(coords)
        return coords

    def __getattr__(self, name):
        if name.startswith("apply_"):
            tfms = self.__dict__["tfms"]

            def apply(x):
                for t in tfms:
                    x = getattr(t, name)(x)
                return x
            return apply
        raise AttributeError(f"'TransformList' object has no attribute {name!r}")

    def __add__(self, other):
        others = other.tfms if isinstance(other, TransformList) else [other]
        return TransformList(self.tfms + others)

    def __iadd__(self, other):
        others = other.tfms if isinstance(other, TransformList) else [other]
        for t in others:
            if not isinstance(t, BaseTransform):
                raise TypeError(f"TransformList takes transforms, got {type(t).__name__}")
        self.tfms.extend(others)
        return self

    def __radd__(self, other):
        others = other.tfms if isinstance(other, TransformList) else [other]
        return TransformList(others + self.tfms)

    def __repr__(self):
        inner = ",\n".join("  " + repr(t) for t in self.tfms)
        return f"imgaug.TransformList([\n{inner}])"

    __str__ = __repr__
