"""The reference workloads of shared/benchmark-workloads.md and the consumer that reads them.

Workloads 1-5 map ``[k]`` datapoints one by one; workload ``"img"`` is an image pipeline over
in-memory JPEGs (decode, random crop, flip, normalize, HWC->CHW) whose stream yields batches;
``"fbresnet"`` is tensorpack's ImageNet training augmentation over in-memory JPEGs, batched too;
``"lmdb"`` and ``"lmdb-tiny"`` read an LMDB file sequentially. Their data is written once per
harness run (``python -m benchmarks.workloads prepare DIR ...``) into the directory named by
the environment variable ``DATAFLOW_BENCH_DATA_DIR``.

Imported only by the fork servers and the measuring children (and the LMDB writer), never by the
harness process itself (which must not import numpy before the BLAS pins are set, and does no
measuring).
"""
import io
import os
import sys
import threading

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


_MEAN_CHW = np.asarray(IMG_MEAN, dtype=np.float32).reshape(3, 1, 1)
_STD_CHW = np.asarray(IMG_STD, dtype=np.float32).reshape(3, 1, 1)


def img_pipeline_numpy(dp):
    """The image pipeline in plain numpy/Pillow, as a peer's user would write it (for
    ``benchmarks.images``): decode, random 224 crop, random horizontal flip, HWC -> CHW,
    (x - mean) / std as float32. Draws from numpy's global random state (per process; locked,
    so thread-safe).

    The crop and the flip are views; the transpose is made contiguous while still uint8, so that
    the float32 arithmetic broadcasts the per-channel constants over rows of 224 (normalising an
    HWC array broadcasts them over its last axis of 3, which costs 13x as much: 1.4 ms against
    0.1 ms per image on the 2-vCPU VM)."""
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
    x = np.ascontiguousarray(x.transpose(2, 0, 1)).astype(np.float32)
    x -= _MEAN_CHW
    x /= _STD_CHW
    return [x, dp[1]]


_img_ops = {}            # pid -> this process's Compose of dataflow's image ops
_img_lock = threading.Lock()


def img_ops(m):
    """Workload img's op list from the dataflow module ``m``: ``Decode``, ``RandomCrop(224)``,
    ``RandomHorizontalFlip``, ``Normalize(mean, std)``, ``HWC2CHW``, all on component 0."""
    o = m.ops
    return [o.Decode(index=0), o.RandomCrop(IMG_CROP, index=0), o.RandomHorizontalFlip(index=0),
            o.Normalize(IMG_MEAN, IMG_STD, index=0), o.HWC2CHW(index=0)]


def img_pipeline_ops(dp):
    """Workload img's map function in every system: dataflow's image ops (:func:`img_ops`)
    composed, called from a plain Python function. Built on first use, once per process, and
    shared by its threads (the ops keep no state; their random draws come from
    ``dataflow.rng``, per thread)."""
    return _per_process(_img_ops, _img_lock, _compose_img_ops)(dp)


def _compose_img_ops():
    import dataflow
    return dataflow.ops.Compose(img_ops(dataflow))


def _per_process(cache, lock, build):
    """``build()``'s object for this process, made on first use and kept in ``cache`` (a dict
    keyed by pid: a forked child makes its own, so that its random stream is its own)."""
    pid = os.getpid()
    obj = cache.get(pid)
    if obj is None:
        with lock:
            obj = cache.get(pid)
            if obj is None:
                cache.clear()
                obj = cache[pid] = build()
    return obj


def _check_img_batch(dp):
    if not isinstance(dp, (list, tuple)) or len(dp) != 2:
        return False
    x, y = _as_array(dp[0]), _as_array(dp[1])
    return (x is not None and y is not None
            and x.shape == (IMG_BATCH, 3, IMG_CROP, IMG_CROP) and x.dtype == np.float32
            and y.shape == (IMG_BATCH,) and y.dtype.kind in "iu")


# ---------------------------------------------------------------------------- workload "fbresnet"
# tensorpack's ImageNet training augmentation over 512 in-memory JPEGs of random 300-500 px
# (benchmarks/images.py's source), with dataflow's imgaug in every system: every library runs
# the same map function, map_fbresnet.
FB_BATCH = 32
FB_CROP = 224
FB_PICKLE = "fbresnet-source.pkl"
# The directory of the data the harness writes once per run (the LMDB files, the fbresnet JPEGs).
DATA_DIR_ENV = "DATAFLOW_BENCH_DATA_DIR"
_fb_source = None
_fb_augs = {}            # pid -> the AugmentorList of this process
_fb_lock = threading.Lock()


def _fbresnet_defs():
    """(fbresnet_augmentor, fbresnet_source): the one place this file takes them from."""
    from .fbresnet import fbresnet_augmentor
    from .images import fbresnet_source
    return fbresnet_augmentor, fbresnet_source


def fbresnet_augmentors():
    """A new list of the fbresnet augmentors, from dataflow's imgaug (BGR input)."""
    import dataflow
    return _fbresnet_defs()[0](dataflow.imgaug)


def fbresnet_source():
    """The source datapoints of workload "fbresnet": ``[uint8 array of JPEG bytes, label]`` x 512,
    once per process (the fork servers do it before forking runs): loaded from the pickle the
    harness had written into $DATAFLOW_BENCH_DATA_DIR (encoding them takes ~5 s per process),
    else generated here."""
    global _fb_source
    if _fb_source is None:
        d = os.environ.get(DATA_DIR_ENV)
        path = os.path.join(d, FB_PICKLE) if d else None
        if path and os.path.exists(path):
            import pickle
            with open(path, "rb") as f:
                _fb_source = pickle.load(f)
        else:
            _fb_source = _fbresnet_defs()[1]()
    return list(_fb_source)


def write_fbresnet_source(directory):
    """Pickle the fbresnet source into ``directory`` (written to a temporary name, renamed)."""
    import pickle
    path = os.path.join(directory, FB_PICKLE)
    with open(path + ".tmp", "wb") as f:
        pickle.dump(_fbresnet_defs()[1](), f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(path + ".tmp", path)
    return path


def fbresnet_available():
    """None if workload "fbresnet" can run in this process (cv2, Pillow, dataflow's imgaug)."""
    try:
        import cv2  # noqa: F401
        import dataflow
        dataflow.imgaug.AugmentorList  # noqa: B018
    except (ImportError, AttributeError) as exc:
        return "fbresnet needs cv2 and dataflow.imgaug (%s); pip install opencv-python-headless" \
            % exc
    return img_available()


def _fbresnet_augmentor_list():
    """This process's ``AugmentorList``, built on first use: once per process (a forked worker
    builds its own, so that its random stream is its own); shared by the process's threads."""
    return _per_process(_fb_augs, _fb_lock, lambda: _imgaug().AugmentorList(fbresnet_augmentors()))


def _imgaug():
    import dataflow
    return dataflow.imgaug


def imdecode_bgr(buf):
    """``cv2.imdecode(buf, IMREAD_COLOR)``: HWC uint8 BGR."""
    import cv2
    return cv2.imdecode(buf, cv2.IMREAD_COLOR)


def map_fbresnet(dp):
    """decode (BGR) then the fbresnet augmentors: ``[uint8 (224, 224, 3), label]``, C-contiguous
    (the flip returns a view with a negative stride, which torch's collate refuses; every system
    pays the same copy)."""
    return [np.ascontiguousarray(_fbresnet_augmentor_list().augment(imdecode_bgr(dp[0]))), dp[1]]


def _check_fb_batch(dp):
    if not isinstance(dp, (list, tuple)) or len(dp) != 2:
        return False
    x, y = _as_array(dp[0]), _as_array(dp[1])
    return (x is not None and y is not None
            and x.shape == (FB_BATCH, FB_CROP, FB_CROP, 3) and x.dtype == np.uint8
            and y.shape == (FB_BATCH,) and y.dtype.kind in "iu")


# ---------------------------------------------------------------------------- workloads "lmdb"
# An LMDB file per workload, of the reference's size (lmdb: 4,000 records of [uint8 array of
# ~150 KB, label]; lmdb-tiny: 200,000 of [int, float32 array of 16]), written once per harness
# run with dataflow.LMDBSerializer.save (format "msgpack": tensorpack reads it with
# TENSORPACK_SERIALIZE=msgpack) into the directory named by DATA_DIR_ENV, as <dir>/<workload
# id>.mdb. The serial dataflow and tensorpack systems read it with LMDBSerializer.load, pass after
# pass; the peers and the parallel mappers map read_lmdb / read_lmdb_tiny (open the file once per
# process, read-only, lock=False; get record k; decode with the codec LMDBSerializer uses) over a
# source of record indices that cycles through the file and outlasts the run (lmdb_source), so
# that their one pass never ends inside a run. Every run first reads the file through, so the
# page cache is warm (warm_lmdb).
LMDB_WORKLOADS = ("lmdb", "lmdb-tiny")
LMDB_JPEG_BYTES = (148_000, 152_000)     # the range of a record's array length
LMDB_TINY_FLOATS = 16
# Past the most datapoints a run reads, the source of record indices holds the buffer of
# tensorpack's strict process mapper (200): once it has sent a pass's last datapoint it drains
# its buffer, and there it hangs now and then (every process waiting in recv; about 1 run in 10
# on lmdb in --quick before this margin), so no run reaches that point.
LMDB_MARGIN = 200
_lmdb_envs = {}                           # path -> (pid, lmdb.Environment)
_lmdb_local = threading.local()           # per thread: {path: (pid, read transaction)}
_lmdb_lock = threading.Lock()


def lmdb_path(wid):
    d = os.environ.get(DATA_DIR_ENV)
    if not d:
        raise RuntimeError("workload %s: %s is not set (the harness writes the LMDB files and "
                           "sets it)" % (wid, DATA_DIR_ENV))
    return os.path.join(d, "%s.mdb" % wid)


def lmdb_available(wid):
    """None if workload ``wid``'s LMDB file can be read in this process, else why not."""
    try:
        import lmdb  # noqa: F401
    except ImportError as exc:
        return "lmdb is not importable (%s); pip install 'dataflow-rt[formats]'" % exc
    d = os.environ.get(DATA_DIR_ENV)
    if not d:
        return "%s is not set (the harness writes the LMDB files)" % DATA_DIR_ENV
    if not os.path.exists(lmdb_path(wid)):
        return "%s was not written (see the harness's notes)" % lmdb_path(wid)
    return None


def _lmdb_txn(path):
    """This thread's read transaction on ``path``, in an environment opened once per process."""
    pid = os.getpid()
    txns = getattr(_lmdb_local, "txns", None)
    if txns is None:
        txns = _lmdb_local.txns = {}
    got = txns.get(path)
    if got is not None and got[0] == pid:
        return got[1]
    with _lmdb_lock:
        env = _lmdb_envs.get(path)
        if env is None or env[0] != pid:     # none yet, or inherited across fork: open our own
            import lmdb
            env = _lmdb_envs[path] = (pid, lmdb.open(path, subdir=False, readonly=True,
                                                     lock=False, readahead=True,
                                                     map_size=1 << 40, max_readers=1024))
    txn = env[1].begin(write=False)
    txns[path] = (pid, txn)
    return txn


def close_lmdb():
    """Close the environments this process opened for the readers (the runs just exit; tests
    call this)."""
    with _lmdb_lock:
        envs = list(_lmdb_envs.values())
        _lmdb_envs.clear()
    _lmdb_local.txns = {}
    for pid, env in envs:
        if pid == os.getpid():
            env.close()


def _read(wid, k):
    from dataflow.formats import codec
    path = lmdb_path(wid)
    value = _lmdb_txn(path).get(b"%08d" % k)
    if value is None:
        raise KeyError("%s: no record %d" % (path, k))
    return codec.loads(value, where="%s record %d" % (path, k))


def read_lmdb(dp):
    """Record ``dp[0]`` of workload lmdb's file, decoded: ``[uint8 array, label]``."""
    return _read("lmdb", dp[0])


def read_lmdb_tiny(dp):
    """Record ``dp[0]`` of workload lmdb-tiny's file, decoded: ``[int, float32 array (16,)]``."""
    return _read("lmdb-tiny", dp[0])


_lmdb_records = {}


def lmdb_records(wid):
    """How many records workload ``wid``'s file holds (its entries less ``__keys__``)."""
    path = lmdb_path(wid)
    n = _lmdb_records.get(path)
    if n is None:
        import lmdb
        env = lmdb.open(path, subdir=False, readonly=True, lock=False)
        try:
            n = _lmdb_records[path] = env.stat()["entries"] - 1
        finally:
            env.close()
    return n


def lmdb_source(wid, n):
    """``[[k % records]]`` for the first ``n`` + LMDB_MARGIN datapoints: record indices in file
    order, cycling through workload ``wid``'s file."""
    records = lmdb_records(wid)
    return [[k % records] for k in range(n + LMDB_MARGIN)]


def warm_lmdb(wid):
    """Read workload ``wid``'s file through once (into the page cache), outside the timing."""
    buf = bytearray(1 << 22)
    with open(lmdb_path(wid), "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def lmdb_datapoints(wid, n):
    """The ``n`` datapoints written to workload ``wid``'s file, generated one by one from a fixed
    seed: lmdb ``[uint8 array of ~150 KB of random bytes (as a JPEG file's bytes, which LMDB does
    not look into), k % 1000]``, lmdb-tiny ``[k, float32 array of 16]``."""
    rng = np.random.default_rng(2026)
    if wid == "lmdb":
        pool = rng.integers(0, 256, 1 << 22, dtype=np.uint8)
        for k in range(n):
            size = int(rng.integers(*LMDB_JPEG_BYTES))
            start = int(rng.integers(0, len(pool) - size))
            yield [pool[start:start + size], k % 1000]
    else:
        for k in range(n):
            yield [k, rng.random(LMDB_TINY_FLOATS, dtype=np.float32)]


def write_lmdb(directory, wid, n):
    """Write workload ``wid``'s file of ``n`` records under ``directory`` with dataflow's
    ``LMDBSerializer.save``."""
    import dataflow

    class Records(dataflow.DataFlow):
        def __len__(self):
            return n

        def __iter__(self):
            return lmdb_datapoints(wid, n)

    path = os.path.join(directory, "%s.mdb" % wid)
    dataflow.LMDBSerializer.save(Records(), path)
    return path


def _check_lmdb(dp):
    if not isinstance(dp, (list, tuple)) or len(dp) != 2:
        return False
    a = _as_array(dp[0])
    return (a is not None and a.dtype == np.uint8 and a.ndim == 1
            and LMDB_JPEG_BYTES[0] <= len(a) < LMDB_JPEG_BYTES[1] and int(dp[1]) == dp[1])


def _check_lmdb_tiny(dp):
    if not isinstance(dp, (list, tuple)) or len(dp) != 2:
        return False
    a = _as_array(dp[1])
    return int(dp[0]) == dp[0] and a is not None and a.shape == (LMDB_TINY_FLOATS,) \
        and a.dtype == np.float32


def _source_k():
    return source_list()


class Workload:
    def __init__(self, wid, label, func, payload, check, source=_source_k, batch=None,
                 sized_source=False, warm=None):
        self.id = wid
        self.label = label
        self.func = func
        self.payload = payload            # bytes per output datapoint, as the reference says
        self.check = check                # sanity check of the first datapoint received
        self.source = source              # () -> the source datapoints (a new list), or
        self.sized_source = sized_source  # if True: (n) -> a source for runs reading up to n
        self.batch = batch                # datapoints per item of the stream; None: unbatched
        self.warm = warm                  # () -> None, run before each run's timing, or None

    def make_source(self, n):
        """The source datapoints of a run that reads up to ``n`` datapoints."""
        return self.source(n) if self.sized_source else self.source()


WORKLOADS = {
    1: Workload(1, "tiny (identity)", map_identity, 0, _check_scalars(1)),
    2: Workload(2, "150 KB image", map_image, 224 * 224 * 3,
                _check_array((224, 224, 3), np.uint8)),
    3: Workload(3, "4 MiB array", map_big, 4 << 20,
                _check_array((1024, 1024), np.float32)),
    4: Workload(4, "pure Python ~1 ms", map_python, 0, _check_scalars(2)),
    5: Workload(5, "BLAS ~1 ms (1 thread)", map_blas, 0, _check_scalars(2)),
    # payload per image: the float32 CHW crop and its int64 label, as batched
    "img": Workload("img", "JPEG pipeline, batch 32", img_pipeline_ops,
                    3 * IMG_CROP * IMG_CROP * 4 + 8, _check_img_batch, source=jpeg_source,
                    batch=IMG_BATCH),
    # payload per image: the uint8 HWC crop and its int64 label, as batched
    "fbresnet": Workload("fbresnet", "fbresnet augmentation, batch 32", map_fbresnet,
                         FB_CROP * FB_CROP * 3 + 8, _check_fb_batch, source=fbresnet_source,
                         batch=FB_BATCH),
    "lmdb": Workload("lmdb", "LMDB read, 150 KB records", read_lmdb, 150_000, _check_lmdb,
                     source=lambda n: lmdb_source("lmdb", n), sized_source=True,
                     warm=lambda: warm_lmdb("lmdb")),
    "lmdb-tiny": Workload("lmdb-tiny", "LMDB read, tiny records", read_lmdb_tiny,
                          LMDB_TINY_FLOATS * 4, _check_lmdb_tiny,
                          source=lambda n: lmdb_source("lmdb-tiny", n), sized_source=True,
                          warm=lambda: warm_lmdb("lmdb-tiny")),
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


_BYTES = (bytes, bytearray, memoryview)
_CONTAINERS = (list, tuple, dict, np.ndarray) + _BYTES


def consume(dp):
    """What every benchmark consumer does with a datapoint; returns the array bytes received."""
    if isinstance(dp, np.ndarray):
        return touch(dp)
    if isinstance(dp, (list, tuple)):
        n = 0
        for x in dp:
            if isinstance(x, _CONTAINERS) or _is_tensor(x):
                n += consume(x)
        return n
    if isinstance(dp, _BYTES):       # a byte string (lmdb's records): read its pages too
        return touch(np.frombuffer(dp, np.uint8))
    if isinstance(dp, dict):
        return sum(consume(x) for x in dp.values())
    if _is_tensor(dp):
        return touch(dp.numpy())      # torch's DataLoader turns numpy arrays into CPU tensors
    return 0


# ---------------------------------------------------------------------------- the data writer
def _main(argv):
    """``python -m benchmarks.workloads prepare DIR ITEM[,ITEM...]``, ITEM = ``lmdb=RECORDS``,
    ``lmdb-tiny=RECORDS`` or ``fbresnet``: write the data of the harness run into DIR (the
    harness runs this once, before starting the fork servers, and removes DIR at the end)."""
    if len(argv) != 3 or argv[0] != "prepare":
        raise SystemExit("usage: python -m benchmarks.workloads prepare DIR "
                         "lmdb=N,lmdb-tiny=N,fbresnet")
    for item in argv[2].split(","):
        wid, _, n = item.partition("=")
        if wid == "fbresnet":
            write_fbresnet_source(argv[1])
        elif wid in LMDB_WORKLOADS:
            write_lmdb(argv[1], wid, int(n))
        else:
            raise SystemExit("nothing to prepare for workload %r" % wid)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
