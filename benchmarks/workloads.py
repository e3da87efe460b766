"""The reference workloads of shared/benchmark-workloads.md and the consumer that reads them.

Workloads 1-5 map ``[k]`` datapoints one by one; workload ``"img"`` is an image pipeline over
in-memory JPEGs (decode, random crop, flip, normalize, HWC->CHW) whose stream yields batches.

Imported only by the fork servers and the measuring children, never by the harness process itself
(which must not import numpy before the BLAS pins are set, and does no measuring).
"""
import io

import numpy as np

N_SOURCE = 10000          # datapoints of one pass over the source
PAGE = 4096               # the consumer reads one byte of every page of every array


def source_list():
    """The source datapoints: ``[k]`` for k in range(10000)."""
    return [[k] for k in range(N_SOURCE)]


# ---------------------------------------------------------------------------- map functions
# Module-level functions, so that they pickle by reference for systems that spawn workers.

def map_identity(dp):
    return dp


def map_image(dp):
    return np.full((224, 224, 3), dp[0] & 0xFF, dtype=np.uint8)


def map_big(dp):
    return np.full((1024, 1024), float(dp[0]), dtype=np.float32)


def map_python(dp):
    s = 0
    for i in range(24000):
        s += i * i
    return [dp[0], s & 0xFF]


_A = np.random.RandomState(0).standard_normal((290, 290))    # fixed 290x290 float64


def map_blas(dp):
    return [dp[0], float((_A @ _A)[0, 0])]


# ---------------------------------------------------------------------------- checks
def _as_array(x):
    if isinstance(x, np.ndarray):
        return x
    if _is_tensor(x):
        return x.numpy()
    return None


def _check_scalars(n):
    def check(dp):
        return isinstance(dp, (list, tuple)) and len(dp) == n and int(dp[0]) == dp[0]
    return check


def _check_array(shape, dtype):
    def check(dp):
        a = _as_array(dp)
        return a is not None and a.shape == shape and a.dtype == dtype
    return check


# ---------------------------------------------------------------------------- workload "img"
# N distinct in-memory JPEGs, generated once per process from a fixed seed; the source of the
# image pipeline is [[jpeg_bytes_k, label_k] for k in range(N)], cycled pass after pass.
IMG_N = 256
IMG_SHAPE = (256, 320)                 # height, width of the encoded images (RGB)
IMG_CROP = 224
IMG_BATCH = 32
IMG_QUALITY = 90
IMG_SEED = 1234
IMG_MEAN = (123.675, 116.28, 103.53)   # ImageNet's, in 0-255 units
IMG_STD = (58.395, 57.12, 57.375)
IMG_LABELS = 1000
_jpegs = None


def _synthetic_image(rng, h, w):
    """An h x w RGB uint8 image: a random two-colour gradient, random rectangles, mild noise."""
    yy = np.linspace(0.0, 1.0, h, dtype=np.float32)[:, None, None]
    xx = np.linspace(0.0, 1.0, w, dtype=np.float32)[None, :, None]
    c0, cx, cy = (rng.uniform(0, 255, 3).astype(np.float32) for _ in range(3))
    img = (c0 + (cx - c0) * xx + (cy - c0) * yy).astype(np.int16)
    for _ in range(int(rng.integers(4, 12))):
        y0, x0 = int(rng.integers(0, h - 8)), int(rng.integers(0, w - 8))
        y1, x1 = int(rng.integers(y0 + 8, h + 1)), int(rng.integers(x0 + 8, w + 1))
        img[y0:y1, x0:x1] = rng.integers(0, 256, 3)
    img += rng.integers(-10, 11, img.shape, dtype=np.int16)     # texture for the encoder
    np.clip(img, 0, 255, out=img)
    return img.astype(np.uint8)


def jpeg_source():
    """The source datapoints of workload "img": ``[jpeg_bytes_k, label_k]`` for k in range(256).

    Generated once per process (the fork servers do it before forking runs) with Pillow, from a
    fixed seed, at JPEG quality 90; every call returns a new list of the same bytes objects.
    """
    global _jpegs
    if _jpegs is None:
        from PIL import Image
        rng = np.random.default_rng(IMG_SEED)
        out = []
        for _ in range(IMG_N):
            buf = io.BytesIO()
            Image.fromarray(_synthetic_image(rng, *IMG_SHAPE), "RGB").save(
                buf, format="JPEG", quality=IMG_QUALITY)
            out.append(buf.getvalue())
        _jpegs = out
    return [[b, k % IMG_LABELS] for k, b in enumerate(_jpegs)]


def img_available():
    """None if workload "img" can run in this process (Pillow with JPEG support), else why not."""
    try:
        from PIL import Image, features
    except ImportError as exc:
        return "Pillow is not importable (%s); pip install Pillow" % exc
    if not features.check("jpg"):
        return "Pillow was built without JPEG support"
    del Image
    return None


_MEAN32 = np.asarray(IMG_MEAN, dtype=np.float32)
_STD32 = np.asarray(IMG_STD, dtype=np.float32)


def img_pipeline_numpy(dp):
    """The image pipeline in plain numpy/Pillow, for the peers (tensorpack, torch): decode,
    random 224 crop, random horizontal flip, (x - mean) / std as float32, HWC -> CHW.
    Draws from numpy's global random state (per process; locked, so thread-safe)."""
    from PIL import Image
    with Image.open(io.BytesIO(dp[0])) as im:
        if im.mode != "RGB":
            im = im.convert("RGB")
        x = np.asarray(im)
    h, w = x.shape[:2]
    top = np.random.randint(0, h - IMG_CROP + 1)
    left = np.random.randint(0, w - IMG_CROP + 1)
    x = x[top:top + IMG_CROP, left:left + IMG_CROP]
    if np.random.random_sample() < 0.5:
        x = x[:, ::-1]
    x = x.astype(np.float32)           # the one copy of the crop
    x -= _MEAN32
    x /= _STD32
    return [np.ascontiguousarray(x.transpose(2, 0, 1)), dp[1]]


def _check_img_batch(dp):
    if not isinstance(dp, (list, tuple)) or len(dp) != 2:
        return False
    x, y = _as_array(dp[0]), _as_array(dp[1])
    return (x is not None and y is not None
            and x.shape == (IMG_BATCH, 3, IMG_CROP, IMG_CROP) and x.dtype == np.float32
            and y.shape == (IMG_BATCH,) and y.dtype.kind in "iu")


def _source_k():
    return source_list()


class Workload:
    def __init__(self, wid, label, func, payload, check, source=_source_k, batch=None):
        self.id = wid
        self.label = label
        self.func = func
        self.payload = payload            # bytes per output datapoint, as the reference says
        self.check = check                # sanity check of the first datapoint received
        self.source = source              # () -> the source datapoints (a new list)
        self.batch = batch                # datapoints per item of the stream; None: unbatched


WORKLOADS = {
    1: Workload(1, "tiny (identity)", map_identity, 0, _check_scalars(1)),
    2: Workload(2, "150 KB image", map_image, 224 * 224 * 3,
                _check_array((224, 224, 3), np.uint8)),
    3: Workload(3, "4 MiB array", map_big, 4 << 20,
                _check_array((1024, 1024), np.float32)),
    4: Workload(4, "pure Python ~1 ms", map_python, 0, _check_scalars(2)),
    5: Workload(5, "BLAS ~1 ms (1 thread)", map_blas, 0, _check_scalars(2)),
    # payload per image: the float32 CHW crop and its int64 label, as batched
    "img": Workload("img", "JPEG pipeline, batch 32", img_pipeline_numpy,
                    3 * IMG_CROP * IMG_CROP * 4 + 8, _check_img_batch, source=jpeg_source,
                    batch=IMG_BATCH),
}


# ---------------------------------------------------------------------------- the consumer
_sink = 0


def _is_tensor(x):
    t = type(x)
    return t.__module__.startswith("torch") and hasattr(x, "numpy") and hasattr(x, "element_size")


if hasattr(np, "lib") and hasattr(getattr(np.lib, "array_utils", None), "byte_bounds"):
    _byte_bounds = np.lib.array_utils.byte_bounds       # numpy >= 2
else:                                                   # pragma: no cover - numpy 1.x
    _byte_bounds = np.byte_bounds


def _read_pages(b):
    """Read one byte per page of the 1-D uint8 view ``b``, and its last byte."""
    global _sink
    _sink = (_sink + int(b[::PAGE].sum()) + int(b[-1])) & 0xFFFFFFFF


def touch(a):
    """Read one byte of every 4 KiB page ``a`` occupies; return ``a.nbytes``."""
    n = a.nbytes
    if n == 0:
        return 0
    if a.dtype.hasobject:
        return sum(consume(x) for x in a.flat)
    if a.flags.c_contiguous or a.flags.f_contiguous:
        _read_pages(a.ravel(order="K").view(np.uint8))       # a view, no copy
        return n
    # Not contiguous: read the pages of the memory span it covers inside its contiguous base.
    base = a
    while isinstance(base.base, np.ndarray):
        base = base.base
    if base.flags.c_contiguous or base.flags.f_contiguous:
        lo, hi = _byte_bounds(a)
        blo, _ = _byte_bounds(base)
        _read_pages(base.ravel(order="K").view(np.uint8)[lo - blo:hi - blo])
    else:   # exotic layout over a foreign buffer: copying reads every byte, which over-pays
        _read_pages(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
    return n


def consume(dp):
    """What every benchmark consumer does with a datapoint; returns the array bytes received."""
    if isinstance(dp, np.ndarray):
        return touch(dp)
    if isinstance(dp, (list, tuple)):
        n = 0
        for x in dp:
            if isinstance(x, (list, tuple, dict, np.ndarray)) or _is_tensor(x):
                n += consume(x)
        return n
    if isinstance(dp, dict):
        return sum(consume(x) for x in dp.values())
    if _is_tensor(dp):
        return touch(dp.numpy())      # torch's DataLoader turns numpy arrays into CPU tensors
    return 0
