"""Photometric augmentors: :class:`Hue`, :class:`Brightness`, :class:`BrightnessScale`,
:class:`Contrast`, :class:`MeanVarianceNormalize`, :class:`GaussianBlur`, :class:`Gamma`,
:class:`Clip`, :class:`Saturation`, :class:`Lighting`, :class:`MinMaxNormalize`.

They change pixel values only (coordinates are unchanged) and never modify their input.

Output dtypes, as tensorpack: the input's dtype, except ``MeanVarianceNormalize`` and
``MinMaxNormalize``, which return float32. Float images are computed in float32 and, where the
augmentor has ``clip=True``, clipped to [0, 255]; uint8 images are always saturated to
[0, 255]. **uint8 results are rounded to the nearest integer** (OpenCV's saturating
conversion), where tensorpack truncated, so a uint8 output can differ from 0.11's by 1.

Speed: the per-channel linear maps (``Brightness``, ``BrightnessScale``, ``Contrast``,
``Lighting``, ``Saturation``) are one ``cv2.transform`` pass over the image (OpenCV runs it
without the GIL), and clipping a float image is two in-place ``cv2.threshold`` passes; no
full-size temporaries are made. Images with more than 4 channels take a numpy path.
"""
import logging

import numpy as np

from ._cv import cv2
from .transform import cv_apply, cv_input
from .base import PhotometricAugmentor, check_range

__all__ = ["Hue", "Brightness", "BrightnessScale", "Contrast", "MeanVarianceNormalize",
           "GaussianBlur", "Gamma", "Clip", "Saturation", "Lighting", "MinMaxNormalize"]

logger = logging.getLogger("dataflow")

_GREY_RGB = np.array([0.299, 0.587, 0.114])       # cv2's RGB2GRAY weights
_FLOAT32 = np.dtype(np.float32)


def _channels(img):
    return img.shape[2] if img.ndim == 3 else 1


def _keep_shape(out, img):
    return out.reshape(img.shape) if out.shape != img.shape else out


def clip_inplace(img, lo=0.0, hi=255.0):
    """Clip a float image to ``[lo, hi]`` in place (two ``cv2.threshold`` passes) and return
    it."""
    if img.flags.c_contiguous and img.dtype.char in "fd":       # float32, float64
        c = cv2()
        hi = float(hi)
        # dst given by position: parsing it as a keyword costs OpenCV's wrapper more than the
        # pass over a small image
        c.threshold(img, hi, hi, c.THRESH_TRUNC, img)
        # THRESH_TOZERO keeps values > lo and zeroes the rest; shift so the floor is 0
        if lo == 0:
            c.threshold(img, 0.0, 0.0, c.THRESH_TOZERO, img)
        else:
            np.maximum(img, lo, out=img)
        return img
    return np.clip(img, lo, hi, out=img)


def to_uint8(img):
    """``clip(img, 0, 255).astype(uint8)`` (truncating, as tensorpack); a uint8 image is
    returned as is."""
    if img.dtype == np.uint8:
        return img
    return img.clip(0, 255).astype(np.uint8)       # (the method: np.clip only adds calls)


def _per_channel(reduce, img):
    """``reduce`` (``np.minimum``/``np.maximum``) of each channel, as a float64 array of length
    C: reduced first along the rows of an ``H x (W*C)`` view, so numpy's inner loops run over
    whole rows rather than over the C values of one pixel."""
    C = _channels(img)
    rows = np.ascontiguousarray(img).reshape(img.shape[0], -1)
    return reduce.reduce(reduce.reduce(rows, axis=0).reshape(-1, C), axis=0).astype(np.float64)


def _is_diagonal(mat):
    C = mat.shape[0]
    return not np.any(mat[:, :C] - np.diag(np.diagonal(mat[:, :C])))


def channel_affine(img, mat, clip):
    """``out[..., c] = sum_k mat[c, k] * img[..., k] + mat[c, C]`` for an image of ``C``
    channels (a 2-D image has one), in the input dtype. uint8 is saturated and rounded; a float
    image is computed in float32 and clipped to [0, 255] when ``clip``.

    OpenCV's 8-bit ``transform`` is exact for a diagonal matrix (one channel scaled and
    shifted), but mixes channels in fixed point, up to 0.6 off: a uint8 image under a matrix
    that mixes channels is computed in float32 and rounded."""
    dtype = img.dtype
    if dtype is _FLOAT32 and img.ndim == 3 and img.flags.c_contiguous and \
            2 <= img.shape[2] <= 4:
        # the usual case (a float32 colour image), written out: the same calls as below
        c = cv2()
        out = c.transform(img, mat)
        if clip:
            c.threshold(out, 255.0, 255.0, c.THRESH_TRUNC, out)
            c.threshold(out, 0.0, 0.0, c.THRESH_TOZERO, out)
        return out
    C = _channels(img)
    in_float = dtype != np.uint8 or C > 4 or not _is_diagonal(mat)
    if in_float and dtype != np.float32:
        img = img.astype(np.float32)
    if C <= 4:
        src = cv_input(img)
        out = _keep_shape(cv2().transform(src, mat), img)
    else:
        out = np.tensordot(img, mat[:, :C].T.astype(np.float32), axes=1)
        out += mat[:, C].astype(np.float32)
    if dtype == np.uint8 and out.dtype != np.uint8:
        np.rint(out, out=out)
        clip = True
    if out.dtype != np.uint8 and (clip or dtype == np.uint8):
        clip_inplace(out)
    if out.dtype != dtype:
        out = out.astype(dtype)
    return out


def _diag(C, scale, offset):
    """The ``C x (C + 1)`` matrix of ``x * scale + offset`` per channel (``offset`` a scalar or
    one per channel)."""
    if C == 3 and type(scale) is float:    # the usual case, the same matrix in one call
        if type(offset) is float:
            o0 = o1 = o2 = offset
        elif type(offset) is np.ndarray and offset.shape == (3,):
            o0, o1, o2 = offset.tolist()
        else:
            o0 = None
        if o0 is not None:
            return np.array(((scale, 0.0, 0.0, o0), (0.0, scale, 0.0, o1),
                             (0.0, 0.0, scale, o2)))
    m = np.zeros((C, C + 1))
    m.flat[:C * (C + 2):C + 2] = scale        # the diagonal: every (C + 2)-th entry
    m[:, C] = offset
    return m


def channel_means(img):
    """Per-channel means (a length-C float64 array; length 1 for a 2-D image)."""
    C = _channels(img)
    if C <= 4:
        src = cv_input(img)
        return np.array(cv2().mean(src)[:C])
    return img.reshape(-1, C).mean(axis=0, dtype=np.float64)


def _grey_weights(rgb):
    return _GREY_RGB if rgb else _GREY_RGB[::-1]


def _need_3_channels(img, who):
    if img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"{who} needs a 3-channel image, got shape {img.shape}")


def _need_colour(img, who):
    """A colour image: 3 channels, or 4 taken as colour and alpha (BGRA or RGBA), whose alpha
    the colour augmentors keep as it is."""
    if img.ndim != 3 or img.shape[2] not in (3, 4):
        raise ValueError(f"{who} needs a colour image of 3 channels, or 4 with alpha last; "
                         f"got shape {img.shape}")


def with_alpha(colour, img):
    """``colour`` (H x W x 3) with the alpha channel of ``img`` appended when ``img`` has one."""
    if img.shape[2] != 4:
        return colour
    return np.concatenate([colour, img[:, :, 3:].astype(colour.dtype, copy=False)], axis=2)


class Hue(PhotometricAugmentor):
    """Shift the hue by a random amount in ``range`` (OpenCV's uint8 hue units: 180 is a full
    turn). ``rgb`` says whether the image is RGB (else BGR). uint8 and float images, 3
    channels, or 4 with alpha last, which is kept as it is (0.11 returned 3 channels)."""

    native = True

    def __init__(self, range=(0, 180), rgb=True):
        super().__init__()
        self._init(locals())

    def _get_augment_params(self, _):
        return self._rand_range(*self.range)

    def _augment(self, img, hue):
        _need_colour(img, "Hue")
        c = cv2()
        to_hsv, back = (c.COLOR_RGB2HSV, c.COLOR_HSV2RGB) if self.rgb else \
            (c.COLOR_BGR2HSV, c.COLOR_HSV2BGR)
        dtype = img.dtype
        if dtype != np.uint8 and dtype != np.float32:
            img = img.astype(np.float32)
        hsv = c.cvtColor(cv_input(img), to_hsv)
        h, s, v = c.split(hsv)
        if hsv.dtype == np.uint8:
            lut = ((np.arange(256) + hue) % 180).astype(np.uint8)
            h = c.LUT(h, lut)
        else:   # float hue is in degrees, [0, 360): add the shift, wrap once
            h += np.float32((2 * float(hue)) % 360)
            np.subtract(h, 360, out=h, where=h >= 360)
        out = with_alpha(c.cvtColor(c.merge([h, s, v]), back), img)
        return out.astype(dtype, copy=False)


class Brightness(PhotometricAugmentor):
    """Add a random value in ``[-delta, delta)``; clip to [0, 255] when ``clip`` (uint8 always
    saturates)."""

    native = True

    def __init__(self, delta, clip=True):
        super().__init__()
        if not delta > 0:
            raise ValueError("Brightness: delta must be > 0")
        self._init(locals())

    def _get_augment_params(self, _):
        return self._rand_range(-self.delta, self.delta)

    def _augment(self, img, v):
        return channel_affine(img, _diag(_channels(img), 1.0, float(v)), self.clip)


class BrightnessScale(PhotometricAugmentor):
    """Multiply by a random factor in ``range``; clip as :class:`Brightness`."""

    native = True

    def __init__(self, range, clip=True):
        super().__init__()
        check_range("BrightnessScale", "range", range)
        self._init(locals())

    def _get_augment_params(self, _):
        return self._rand_range(*self.range)

    def _augment(self, img, v):
        return channel_affine(img, _diag(_channels(img), float(v), 0.0), self.clip)


class Contrast(PhotometricAugmentor):
    """``img * r + mean * (1 - r)`` with ``r`` random in ``factor_range``. The mean is per
    channel when ``rgb`` is None, else the mean of the grey image (``rgb``: RGB or BGR input,
    3 channels, or 4 with alpha last, which is then kept as it is; 0.11 blended it too); a 2-D
    image has one mean whatever ``rgb`` says (as in 0.11). Clip as :class:`Brightness`."""

    native = True

    def __init__(self, factor_range, rgb=None, clip=True):
        super().__init__()
        check_range("Contrast", "factor_range", factor_range)
        self._init(locals())

    def _get_augment_params(self, _):
        return self._rand_range(*self.factor_range)

    def _augment(self, img, r):
        r = float(r)
        means = channel_means(img)
        if self.rgb is not None and img.ndim == 3:
            _need_colour(img, "Contrast(rgb=...)")
            grey = float(np.dot(_grey_weights(self.rgb), means[:3]))
            m = _diag(img.shape[2], r, grey * (1 - r))
            if img.shape[2] == 4:
                m[3] = (0, 0, 0, 1, 0)                   # alpha as it is
            return channel_affine(img, m, self.clip)
        return channel_affine(img, _diag(_channels(img), r, means * (1 - r)), self.clip)


def _shift_then_scale(img, shift, scale, offset):
    """``(img - shift) * scale + offset`` per channel, in float32: two passes, so that a value
    near ``shift`` keeps its precision (one pass of ``img * scale + (offset - shift * scale)``
    cancelled large terms in float32: an image spanning [44.300907, 44.30091] came out
    [-28, 72] for [0, 100])."""
    C = _channels(img)
    out = img if img.dtype == np.float32 else img.astype(np.float32)
    out = channel_affine(out, _diag(C, 1.0, -np.asarray(shift, np.float64)), clip=False)
    return channel_affine(out, _diag(C, scale, offset), clip=False)


def _global_mean_std(src):
    """Mean and (population) standard deviation of all values of the contiguous ``src``.
    OpenCV's ``meanStdDev`` is fast on uint8 and on 4-channel floats, so a float image is
    viewed as 4-channel pixels when its size allows and the channel statistics are combined."""
    c = cv2()
    if src.dtype != np.uint8 and src.size % 4 == 0:
        m, s = (v.ravel() for v in c.meanStdDev(src.reshape(-1, 1, 4)))
        mean = float(m.mean())
        return mean, float(np.sqrt(max(float(np.mean(s * s + m * m)) - mean * mean, 0.0)))
    m, s = c.meanStdDev(src.reshape(src.shape[0], -1))
    return float(m[0, 0]), float(s[0, 0])


class MeanVarianceNormalize(PhotometricAugmentor):
    """``(x - mean) / max(std, 1 / sqrt(img.size))``, over the whole image (``all_channel``)
    or per channel; returns float32."""

    native = True

    def __init__(self, all_channel=True):
        super().__init__()
        self._init(locals())

    def _augment(self, img, _):
        floor = 1.0 / np.sqrt(img.size)
        C = _channels(img)
        src = np.ascontiguousarray(img)
        if self.all_channel:
            mean, std = _global_mean_std(src)
            mean, std = np.full(C, mean), np.full(C, max(std, floor))
        elif C <= 4:
            mean, std = (v.ravel()[:C] for v in cv2().meanStdDev(src))
            std = np.maximum(std, floor)
        else:
            flat = src.reshape(-1, C)
            mean = flat.mean(axis=0, dtype=np.float64)
            std = np.maximum(flat.std(axis=0, dtype=np.float64), floor)
        return _shift_then_scale(src, mean, 1.0 / std, 0.0)


class GaussianBlur(PhotometricAugmentor):
    """Gaussian blur with a random odd kernel size ``2k + 1``, ``k`` in ``[low, high)`` of
    ``size_range`` (an int ``v`` means ``(0, v)``), and sigma in ``sigma_range`` (0: OpenCV
    derives it from the size). ``symmetric`` uses one size and sigma for both axes.
    ``max_size`` is deprecated: it means ``size_range=(0, max_size)``."""

    native = True

    def __init__(self, size_range=(0, 3), sigma_range=(0, 0), symmetric=True, max_size=None):
        super().__init__()
        if max_size is not None:
            logger.warning("GaussianBlur(max_size=) is deprecated; use size_range=(0, %s)",
                           max_size)
            size_range = (0, max_size)
        if not isinstance(size_range, (list, tuple)):
            size_range = (0, size_range)
        self._init(locals())

    def _get_augment_params(self, _):
        sx, sy = self.rng.randint(*self.size_range, size=(2,)) * 2 + 1
        sigx, sigy = self._rand_range(*self.sigma_range, size=(2,))
        if self.symmetric:
            sy, sigy = sx, sigx
        return int(sx), int(sy), float(sigx), float(sigy)

    def _augment(self, img, p):
        sx, sy, sigx, sigy = p
        c = cv2()
        out = cv_apply(c.GaussianBlur, img, (sx, sy), sigmaX=sigx, sigmaY=sigy,
                       borderType=c.BORDER_REPLICATE)
        return out.reshape(img.shape)


class Gamma(PhotometricAugmentor):
    """Gamma correction ``255 * (x / 255) ** (1 / (1 + g))`` with ``g`` random in ``range``,
    through a 256-entry table: the input is clipped and converted to uint8 first (as in
    tensorpack, a float image loses its fractional part), then converted back to its dtype."""

    native = True

    def __init__(self, range=(-0.5, 0.5)):
        super().__init__()
        self._init(locals())

    def _get_augment_params(self, _):
        return self._rand_range(*self.range)

    def _augment(self, img, gamma):
        lut = (np.arange(256, dtype=np.float64) / 255) ** (1.0 / (1.0 + float(gamma))) * 255
        lut = np.clip(np.rint(lut), 0, 255).astype(np.uint8)
        dtype = img.dtype
        img = to_uint8(img)
        out = _keep_shape(cv2().LUT(cv_input(img), lut), img)
        return out.astype(dtype, copy=False)


class Clip(PhotometricAugmentor):
    """Clip values to ``[min, max]`` (dtype kept)."""

    native = True

    def __init__(self, min=0, max=255):
        super().__init__()
        self._init(locals())

    def _augment(self, img, _):
        return np.clip(img, self.min, self.max)


class Saturation(PhotometricAugmentor):
    """``img * v + grey * (1 - v)`` with ``v = 1 + U(-alpha, alpha)`` (``alpha < 1``); ``rgb``
    says whether the image is RGB or BGR: 3 channels, or 4 with alpha last, which is kept as it
    is (0.11 blended it with the grey too). One ``cv2.transform`` pass (the grey image is a
    linear map of the channels). Clip as :class:`Brightness`."""

    native = True

    def __init__(self, alpha=0.4, rgb=True, clip=True):
        super().__init__()
        if not alpha < 1:
            raise ValueError("Saturation: alpha must be < 1")
        self._init(locals())

    def _get_augment_params(self, _):
        return 1 + self._rand_range(-self.alpha, self.alpha)

    def _augment(self, img, v):
        _need_colour(img, "Saturation")
        v = float(v)
        g0, g1, g2 = ((1 - v) * _grey_weights(self.rgb)).tolist()   # each row: the grey part
        if img.shape[2] == 3:
            m = np.array(((g0 + v, g1, g2, 0.0), (g0, g1 + v, g2, 0.0), (g0, g1, g2 + v, 0.0)))
        else:
            m = _diag(4, 1.0, 0.0)           # alpha as it is
            m[:3, :3] = ((g0 + v, g1, g2), (g0, g1 + v, g2), (g0, g1, g2 + v))
        return channel_affine(img, m, self.clip)


class Lighting(PhotometricAugmentor):
    """AlexNet's PCA lighting noise: add ``eigvec @ (v * eigval)`` to every pixel, ``v`` drawn
    from ``N(0, std**2)`` per component. ``eigval`` has shape (3,), ``eigvec`` (3, 3) with the
    eigenvectors as columns; the image must have 3 channels. Clip as :class:`Brightness`."""

    native = True

    def __init__(self, std, eigval, eigvec, clip=True):
        super().__init__()
        eigval = np.asarray(eigval, dtype=np.float32)
        eigvec = np.asarray(eigvec, dtype=np.float32)
        if eigval.shape != (3,) or eigvec.shape != (3, 3):
            raise ValueError("Lighting: eigval must have shape (3,) and eigvec (3, 3)")
        self._init(locals())

    def _get_augment_params(self, _):
        return (self.rng.randn(3) * self.std).astype(np.float32)

    def _augment(self, img, v):
        _need_3_channels(img, "Lighting")
        inc = np.dot(self.eigvec, v * self.eigval).astype(np.float64)
        return channel_affine(img, _diag(3, 1.0, inc), self.clip)


class MinMaxNormalize(PhotometricAugmentor):
    """Rescale linearly to ``[min, max]``, over the whole image (``all_channel``) or per
    channel; returns float32. A constant image (channel) becomes ``min`` (0.11 gave NaN)."""

    native = True

    def __init__(self, min=0, max=255, all_channel=True):
        super().__init__()
        self._init(locals())

    def _augment(self, img, _):
        C = _channels(img)
        if self.all_channel:
            lo, hi = np.full(C, float(img.min())), np.full(C, float(img.max()))
        else:
            lo, hi = _per_channel(np.minimum, img), _per_channel(np.maximum, img)
        span = hi - lo
        scale = np.where(span > 0, (self.max - self.min) / np.where(span > 0, span, 1), 0.0)
        return _shift_then_scale(img, lo, scale, self.min)
