"""Image ops on numpy arrays: decode, resize, crop, flip, normalize, layout.

Images are numpy arrays in HWC layout (height, width, channels) or HW for a single channel.
Every op returns a new array (or, where noted, its input unchanged) and never writes into its
input. Random ops draw only from :func:`dataflow.rng.datapoint_rng`, so with
:func:`dataflow.set_seed` a datapoint gets the same result whatever the number of workers or
the executor.
"""
import io

import numpy as np

from .. import rng as _rng
from .base import Op

__all__ = ["Decode", "jpeg_decoder", "Resize", "RandomCrop", "CenterCrop", "RandomHorizontalFlip",
           "Normalize", "HWC2CHW"]


def _pil_image():
    try:
        from PIL import Image
    except ImportError as e:
        raise ImportError('Decode needs Pillow for images other than JPEG (and without '
                          'simplejpeg or OpenCV, for JPEG too), which is not installed: '
                          'pip install "dataflow-rt[images]"  (or: pip install Pillow)') from e
    return Image


# -- JPEG decoders ---------------------------------------------------------------------------------
# Each returns the image as uint8 HWC in the mode asked for ("RGB", "L" or "RGBA", the same
# layout and colour order as Pillow's), or raises. benchmarks/decoders.py measured them on
# 300-500 px JPEGs (2-core VM, 2026-12-01): simplejpeg 1.61x Pillow with one thread and 2.34x
# with two, cv2.imdecode 1.72x and 2.25x (Pillow holds the GIL for part of its work), with
# identical pixels (all three use libjpeg-turbo with the same defaults). "auto" takes the first
# of simplejpeg, cv2, Pillow that imports.

_SJ_SPACE = {"RGB": "RGB", "L": "GRAY", "RGBA": "RGBA"}


def _decode_simplejpeg(data, mode):
    import simplejpeg
    return simplejpeg.decode_jpeg(data, colorspace=_SJ_SPACE[mode])


def _decode_cv2(data, mode):
    from ..parallel import cvthreads
    cv2 = cvthreads.import_cv2()
    rgb = getattr(cv2, "IMREAD_COLOR_RGB", None)            # OpenCV >= 4.10
    colour = cv2.IMREAD_COLOR if rgb is None else rgb
    flags = cv2.IMREAD_IGNORE_ORIENTATION | (cv2.IMREAD_GRAYSCALE if mode == "L" else colour)
    arr = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
    if arr is None:
        raise ValueError("cv2.imdecode could not decode the data")
    if mode == "L":
        return arr[:, :, None]
    if rgb is None:
        arr = cv2.cvtColor(arr, cv2.COLOR_BGR2RGB)
    if mode == "RGBA":
        return cv2.cvtColor(arr, cv2.COLOR_RGB2RGBA)
    return arr


def _decode_pillow(data, mode):
    Image = _pil_image()
    with Image.open(io.BytesIO(data)) as img:
        if img.mode.startswith(("I", "F")):
            # Pillow's conversion would clip every value to 8 bits (a 16-bit PNG turns white)
            raise ValueError(f"it is a {img.mode} image (more than 8 bits per value) and Decode "
                             "gives uint8; decode it with cv2.imdecode(buf, "
                             "cv2.IMREAD_UNCHANGED) or Pillow to keep its values")
        if img.mode != mode:
            if mode == "L" and img.format == "JPEG":
                # libjpeg's own luma, as simplejpeg and cv2 give it: converting the decoded RGB
                # to grey differs from it by up to ~30 levels
                img.draft("L", img.size)
            if img.mode != mode:
                img = img.convert(mode)
        arr = np.array(img)          # a writeable copy
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return arr


_DECODERS = {"simplejpeg": _decode_simplejpeg, "cv2": _decode_cv2, "pillow": _decode_pillow}
_MODULE = {"simplejpeg": "simplejpeg", "cv2": "cv2", "pillow": "PIL.Image"}
_auto_jpeg = None


def jpeg_decoder():
    """The name of the JPEG decoder ``Decode(decoder="auto")`` uses here: the first of
    ``"simplejpeg"``, ``"cv2"``, ``"pillow"`` that can be imported (decided once, at the first
    call); ``None`` if none can."""
    global _auto_jpeg
    if _auto_jpeg is None:
        import importlib
        for name in ("simplejpeg", "cv2", "pillow"):
            try:
                importlib.import_module(_MODULE[name])
            except ImportError:
                continue
            _auto_jpeg = name
            break
    return _auto_jpeg


def _size_pair(op, size):
    """``size`` as ``(h, w)`` of positive ints: an int ``s`` is ``(s, s)``."""
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        size = (int(size), int(size))
    try:
        h, w = size
        if isinstance(h, bool) or isinstance(w, bool) or int(h) != h or int(w) != w:
            raise ValueError
        h, w = int(h), int(w)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: size must be an int or a pair (h, w) of ints, "
                        f"got {size!r}") from None
    if h <= 0 or w <= 0:
        raise ValueError(f"{op}: size must be positive, got {(h, w)}")
    return h, w


def _check_image(op, x, kinds="biuf"):
    """Raise unless ``x`` is an HW or HWC numpy array with a non-empty image and a dtype of one
    of ``kinds``."""
    if not isinstance(x, np.ndarray):
        raise op._err(TypeError, f"expected a numpy array (an HW or HWC image), "
                                 f"got {type(x).__name__}")
    if x.ndim not in (2, 3):
        raise op._err(ValueError, f"expected an HW or HWC image (2 or 3 dimensions), "
                                  f"got shape {x.shape}")
    if x.dtype.kind not in kinds:
        raise op._err(TypeError, f"unsupported dtype {x.dtype} (shape {x.shape})")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise op._err(ValueError, f"empty image of shape {x.shape}")


class Decode(Op):
    """Decode encoded image bytes (JPEG, PNG, or any format Pillow reads) to a ``uint8`` HWC
    array.

    ``Decode(index=None, *, mode="RGB", decoder="auto")``: ``index`` as every op's (the first
    argument, as the other ops' after their own), ``mode`` and ``decoder`` by keyword.
    ``mode="RGB"`` (default) gives ``H x W x 3`` in **RGB** order (not OpenCV's BGR): grayscale,
    palette and CMYK images are converted to RGB, and an alpha channel is dropped. ``mode="L"``
    gives grayscale ``H x W x 1``; ``mode="RGBA"`` gives ``H x W x 4`` (alpha 255 for a JPEG).
    The result always has 3 dimensions, so one mode gives one layout for every file and every
    decoder. The EXIF orientation is not applied.

    ``decoder`` chooses the JPEG decoder: ``"auto"`` (default) the fastest one installed
    (simplejpeg, else OpenCV's ``cv2.imdecode``, else Pillow: see :func:`jpeg_decoder` and
    ``benchmarks/decoders.py``), or one of ``"simplejpeg"``, ``"cv2"``, ``"pillow"``. All give
    the same layout, dtype and colour order (and, with libjpeg-turbo's default settings, the
    same pixels; ``mode="L"`` is libjpeg's own luma with each of them). Other formats, and a
    JPEG the chosen decoder refuses, go to Pillow (``pip install "dataflow-rt[images]"``),
    imported at the first call that needs it. (CMYK JPEGs: simplejpeg 1.9 and OpenCV decode
    them themselves, within 2 levels of Pillow.)

    The input is ``bytes``, ``bytearray``, ``memoryview`` or a 1-D ``uint8`` array (what
    ``np.fromfile`` gives). Bytes that are not a readable image raise ``ValueError``.
    The result is a new writeable array.

    Native: the decoders run in C with the GIL released.
    """

    native = True
    _fields = ("mode",)
    _MODES = ("RGB", "L", "RGBA")

    def __init__(self, index=None, *, mode="RGB", decoder="auto"):
        super().__init__(index)
        if mode not in self._MODES:
            raise ValueError(f"Decode: mode must be one of {self._MODES}, got {mode!r}")
        if decoder != "auto" and decoder not in _DECODERS:
            raise ValueError(f"Decode: decoder must be 'auto' or one of {tuple(_DECODERS)}, "
                             f"got {decoder!r}")
        self.mode = mode
        self.decoder = decoder

    def _jpeg_decoder(self):
        name = jpeg_decoder() if self.decoder == "auto" else self.decoder
        return _DECODERS.get(name, _decode_pillow)

    def apply(self, data):
        if isinstance(data, np.ndarray):
            if data.dtype != np.uint8 or data.ndim != 1:
                raise self._err(TypeError, f"expected encoded bytes or a 1-D uint8 array, got "
                                           f"an array of dtype {data.dtype} and shape "
                                           f"{data.shape}")
            data = data.tobytes()
        elif isinstance(data, (bytearray, memoryview)):
            data = bytes(data)
        elif not isinstance(data, bytes):
            raise self._err(TypeError, f"expected encoded image bytes, got "
                                       f"{type(data).__name__}")
        if not data:
            raise self._err(ValueError, "got 0 bytes, not an image")
        if data[:3] == b"\xff\xd8\xff":                   # a JPEG
            fast = self._jpeg_decoder()
            try:
                return fast(data, self.mode)
            except MemoryError:
                raise
            except Exception as e:
                if fast is _decode_pillow:
                    raise self._err(ValueError, f"cannot decode {len(data)} bytes (starting "
                                                f"{data[:8]!r}) as an image: {e}") from e
                # Pillow decodes what the fast decoder refuses, or raises the error below
        try:
            return _decode_pillow(data, self.mode)
        except (MemoryError, ImportError):
            raise
        except Exception as e:
            raise self._err(ValueError, f"cannot decode {len(data)} bytes (starting "
                                        f"{data[:8]!r}) as an image: {e}") from e


def _bilinear_axis(n_in, n_out):
    """Source indices ``i0``, ``i1`` and weights of ``i1`` for resampling an axis of ``n_in``
    samples to ``n_out``, with pixel centres aligned (``align_corners=False``)."""
    src = (np.arange(n_out, dtype=np.float64) + 0.5) * (n_in / n_out) - 0.5
    src = np.clip(src, 0, n_in - 1)
    i0 = np.floor(src).astype(np.intp)
    i1 = np.minimum(i0 + 1, n_in - 1)
    return i0, i1, src - i0


class Resize(Op):
    """Resize an HW or HWC image with bilinear interpolation.

    ``size`` is ``(h, w)``, or an int: the shorter side becomes ``size`` and the longer side
    ``int(size * long / short)`` (as torchvision), keeping the aspect ratio.

    Interpolation is plain bilinear with pixel centres aligned, the same as OpenCV's
    ``INTER_LINEAR`` and ``torch.nn.functional.interpolate(mode="bilinear",
    align_corners=False)``: no antialiasing, so shrinking by more than 2x aliases. It is computed
    in float32 (float64 for 32/64-bit ints and float64); the result has the input's dtype,
    rounded to nearest and clipped to the dtype's range for integer dtypes. An image already of
    the target size is returned unchanged. Any number of channels works.

    Native: vectorised numpy, no per-pixel Python.
    """

    native = True
    _fields = ("size",)

    def __init__(self, size, index=None):
        super().__init__(index)
        if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
            if size <= 0:
                raise ValueError(f"Resize: size must be positive, got {size}")
            self.size = int(size)
        else:
            self.size = _size_pair("Resize", size)

    def target(self, h, w):
        """The output ``(h, w)`` for an ``h x w`` input."""
        if not isinstance(self.size, int):
            return self.size
        s = self.size
        if h <= w:
            return s, max(1, int(s * w / h))
        return max(1, int(s * h / w)), s

    def apply(self, x):
        _check_image(self, x, kinds="iuf")
        h, w = x.shape[:2]
        oh, ow = self.target(h, w)
        if (oh, ow) == (h, w):
            return x
        big = (x.dtype.kind in "iu" and x.dtype.itemsize >= 4) or x.dtype == np.float64
        ftype = np.float64 if big else np.float32
        y0, y1, wy = _bilinear_axis(h, oh)
        x0, x1, wx = _bilinear_axis(w, ow)
        extra = (1,) * (x.ndim - 2)
        wy = wy.astype(ftype).reshape((oh, 1) + extra)
        wx = wx.astype(ftype).reshape((1, ow) + extra)
        # lerp(a, b, t) = a + (b - a) * t, in place: rows first (oh, w, ...), then columns
        top = x.take(y0, axis=0).astype(ftype)
        rows = x.take(y1, axis=0).astype(ftype)
        rows -= top
        rows *= wy
        rows += top
        left = rows.take(x0, axis=1)
        out = rows.take(x1, axis=1)
        out -= left
        out *= wx
        out += left
        if x.dtype.kind in "iu":
            info = np.iinfo(x.dtype)
            hi = float(info.max)
            if hi > info.max:        # 8-byte ints: the float rounds up past the range
                hi = np.nextafter(hi, 0.0)
            np.rint(out, out=out)
            np.clip(out, info.min, hi, out=out)
        return out.astype(x.dtype, copy=False)


class _Crop(Op):
    _fields = ("size",)

    def __init__(self, size, index=None):
        super().__init__(index)
        self.size = _size_pair(type(self).__name__, size)

    def _offsets(self, h, w, ch, cw):
        raise NotImplementedError

    def apply(self, x):
        _check_image(self, x)
        h, w = x.shape[:2]
        ch, cw = self.size
        if ch > h or cw > w:
            raise self._err(ValueError, f"crop size {(ch, cw)} is larger than the image "
                                        f"(shape {x.shape})")
        top, left = self._offsets(h, w, ch, cw)
        return x[top:top + ch, left:left + cw].copy()


class RandomCrop(_Crop):
    """Crop an ``(h, w)`` window (``size`` int: square) at a uniformly random position of an HW
    or HWC image; every position is equally likely. Returns a new contiguous array. A crop larger
    than the image raises ``ValueError``.

    Draws two integers from :func:`~dataflow.rng.datapoint_rng` per call.
    Native: one numpy copy.
    """

    native = True

    def _offsets(self, h, w, ch, cw):
        g = _rng.datapoint_rng()
        return int(g.integers(0, h - ch + 1)), int(g.integers(0, w - cw + 1))


class CenterCrop(_Crop):
    """Crop the central ``(h, w)`` window (``size`` int: square) of an HW or HWC image; when the
    margin is odd, the extra pixel is left at the bottom/right (offset ``(H - h) // 2``). Returns
    a new contiguous array. A crop larger than the image raises ``ValueError``.

    Native: one numpy copy.
    """

    native = True

    def _offsets(self, h, w, ch, cw):
        return (h - ch) // 2, (w - cw) // 2


_FLIP_CV_DTYPES = frozenset(np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16,
                                                   np.int32, np.float32, np.float64))
_cv2 = None     # the cv2 module, False when it cannot be imported, None: not tried


def _optional_cv2():
    """The cv2 module where OpenCV is installed (the ops that use it have a numpy way too),
    else ``None``; tried once."""
    global _cv2
    if _cv2 is None:
        try:
            from ..parallel import cvthreads
            _cv2 = cvthreads.import_cv2()
        except ImportError:
            _cv2 = False
    return _cv2 or None


def _flip_lr(x):
    """``x[:, ::-1]`` as a new C-contiguous array: ``cv2.flip`` where OpenCV is installed and
    takes the image (up to 4 channels of its dtypes; 224 x 224 x 3 uint8: 6 us against numpy's
    460 us for the strided copy), else numpy."""
    cv2 = _optional_cv2()
    if cv2 is not None and x.dtype in _FLIP_CV_DTYPES and x.size and \
            (x.ndim == 2 or x.shape[2] <= 4):
        src = x if x.flags.c_contiguous else np.ascontiguousarray(x)
        out = cv2.flip(src, 1)
        return out.reshape(x.shape) if out.shape != x.shape else out
    return x[:, ::-1].copy()


class RandomHorizontalFlip(Op):
    """With probability ``prob``, flip an HW or HWC image left-right (``x[:, ::-1]``, as a new
    contiguous array); otherwise return the image unchanged.

    Draws one float from :func:`~dataflow.rng.datapoint_rng` per call, whatever ``prob``.
    Native: one ``cv2.flip`` (GIL released) where OpenCV is installed, else one numpy copy.
    """

    native = True
    _fields = ("prob",)

    def __init__(self, prob=0.5, index=None):
        super().__init__(index)
        if isinstance(prob, bool) or not isinstance(prob, (int, float, np.floating)) or \
                not 0 <= prob <= 1:
            raise ValueError(f"RandomHorizontalFlip: prob must be a number in [0, 1], "
                             f"got {prob!r}")
        self.prob = float(prob)

    def apply(self, x):
        _check_image(self, x)
        if _rng.datapoint_rng().random() < self.prob:
            return _flip_lr(x)
        return x


class Normalize(Op):
    """``(x - mean) / std`` per channel, as float32.

    The input is an HWC image (channels on the last axis) or an HW image (one channel), of an
    integer or floating dtype. ``mean`` and ``std`` are scalars or sequences with one value per
    channel; a single value applies to every channel. The result is a new float32 array of the
    input's shape. A length that matches neither 1 nor the number of channels raises
    ``ValueError``; so does a ``std`` with a zero.

    Native: vectorised numpy; a uint8 image, where OpenCV is installed, by looking its values up
    in a table of the 256 results per channel (``cv2.LUT``), computed by that same float32
    arithmetic, so bit for bit the same (224 x 224 x 3 into CHW: 81 us instead of 145).
    """

    native = True
    _fields = ("mean", "std")

    def __init__(self, mean, std, index=None):
        super().__init__(index)
        self._mean = self._vector("mean", mean)
        self._std = self._vector("std", std)
        if np.any(self._std == 0):
            raise ValueError(f"Normalize: std must not contain 0, got {std!r}")
        if self._mean.size != self._std.size and 1 not in (self._mean.size, self._std.size):
            raise ValueError(f"Normalize: mean has {self._mean.size} values and std "
                             f"{self._std.size}; they must match (or one be a single value)")
        self.mean = self._mean.tolist() if self._mean.size > 1 else float(self._mean[0])
        self.std = self._std.tolist() if self._std.size > 1 else float(self._std[0])
        # Row k: the result for each uint8 value in channel k (one row if mean and std are
        # single values), by the float32 arithmetic of _normalize_into.
        self._lut = np.ascontiguousarray(
            ((np.arange(256, dtype=np.float32)[:, None] - self._mean) / self._std).T)
        # the same tables interleaved as an HWC image's channels, for one cv2.LUT call
        self._lut_hwc = self._lut[0] if len(self._lut) == 1 else \
            np.ascontiguousarray(self._lut.T).reshape(256, 1, len(self._lut))

    @staticmethod
    def _vector(name, v):
        try:
            a = np.asarray(v)
            if a.dtype.kind in "USa" or (a.dtype.kind == "O" and any(
                    isinstance(x, (str, bytes)) for x in a.flat)):
                raise TypeError               # text ("3") would be read as a number
            a = a.astype(np.float32)
        except (TypeError, ValueError):
            raise TypeError(f"Normalize: {name} must be a number or a sequence of numbers, "
                            f"got {v!r}") from None
        if a.ndim > 1 or a.size == 0:
            raise ValueError(f"Normalize: {name} must be a number or a flat non-empty "
                             f"sequence, got {v!r}")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"Normalize: {name} must be finite, got {v!r}")
        return a.reshape(-1)

    def _channels(self, x):
        """Check ``x`` against mean/std; return its channel count."""
        _check_image(self, x, kinds="iuf")
        c = x.shape[2] if x.ndim == 3 else 1
        for name, v in (("mean", self._mean), ("std", self._std)):
            if v.size not in (1, c):
                raise self._err(ValueError, f"{name} has {v.size} values but the image has {c} "
                                            f"channel{'s' if c != 1 else ''} (shape {x.shape})")
        return c

    def _normalize_into(self, x, c, planes):
        """Channel k of the HWC image ``x``, normalized, into ``planes[k]``: numpy broadcasts a
        length-3 last axis slowly (about twice the time of this). Contiguous float32 planes of
        a uint8 image: by table lookups where OpenCV is installed."""
        # OpenCV's path for up to 4 channels, as apply()'s (cv2.split takes 128 at most)
        cv2 = _optional_cv2() if x.dtype == np.uint8 and c <= 4 else None
        if cv2 is not None and all(p.flags.c_contiguous for p in planes):
            src = x if x.flags.c_contiguous else np.ascontiguousarray(x)
            rows = self._lut if len(self._lut) == c else [self._lut[0]] * c
            for k, plane in enumerate(cv2.split(src) if c > 1 else [src[..., 0]]):
                cv2.LUT(plane, rows[k], dst=planes[k])
            return
        mean = np.broadcast_to(self._mean, (c,))
        std = np.broadcast_to(self._std, (c,))
        for k in range(c):
            np.subtract(x[..., k], mean[k], out=planes[k], dtype=np.float32)
            planes[k] /= std[k]

    def apply(self, x):
        c = self._channels(x)
        if x.ndim != 3:
            out = x.astype(np.float32)   # always a copy
            out -= self._mean[0]
            out /= self._std[0]
            return out
        cv2 = _optional_cv2() if x.dtype == np.uint8 and c <= 4 else None
        if cv2 is not None:        # every channel's table at once, interleaved as the image
            # (_channels checked that the tables are one, or one per channel)
            out = cv2.LUT(x if x.flags.c_contiguous else np.ascontiguousarray(x), self._lut_hwc)
            return out.reshape(x.shape)          # cv2 drops a last axis of 1
        out = np.empty(x.shape, np.float32)
        self._normalize_into(x, c, [out[..., k] for k in range(c)])
        return out

    def merge_next(self, nxt):
        if type(nxt) is HWC2CHW and nxt.index == self.index:
            return _NormalizeThenCHW(self, nxt)
        return None


class _NormalizeThenCHW(Op):
    """``Normalize`` then ``HWC2CHW`` (same index) in one step, as :class:`Compose` runs the
    pair: each channel is normalized straight into its contiguous CHW plane, instead of into
    a strided HWC array that is then transposed (about 8x faster on a 224x224x3 image). The
    result is bit for bit the pair's, and so are the errors (raised by the op they come from).
    """

    native = True

    def __init__(self, normalize, to_chw):
        super().__init__(normalize.index)
        self.normalize, self.to_chw = normalize, to_chw

    def apply(self, x):
        c = self.normalize._channels(x)
        if x.ndim != 3:
            return self.to_chw.apply(self.normalize.apply(x))    # HWC2CHW raises the error
        out = np.empty((c,) + x.shape[:2], np.float32)
        self.normalize._normalize_into(x, c, out)
        return out

    def __repr__(self):
        return f"Compose([{self.normalize!r}, {self.to_chw!r}])"


class HWC2CHW(Op):
    """Transpose an HWC image to CHW (``x.transpose(2, 0, 1)``) as a new contiguous array.
    Anything but 3 dimensions raises ``ValueError``.

    Native: one numpy copy.
    """

    native = True

    def apply(self, x):
        if not isinstance(x, np.ndarray):
            raise self._err(TypeError, f"expected a numpy array (an HWC image), "
                                       f"got {type(x).__name__}")
        if x.ndim != 3:
            raise self._err(ValueError, f"expected an HWC image (3 dimensions), "
                                        f"got shape {x.shape}")
        return np.ascontiguousarray(x.transpose(2, 0, 1))
