"""The reference workloads of shared/benchmark-workloads.md and the consumer that reads them.

Imported only by the fork servers and the measuring children, never by the harness process itself
(which must not import numpy before the BLAS pins are set, and does no measuring).
"""
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


class Workload:
    def __init__(self, wid, label, func, payload, check):
        self.id = wid
        self.label = label
        self.func = func
        self.payload = payload            # bytes per output datapoint, as the reference says
        self.check = check                # sanity check of the first datapoint received


WORKLOADS = {
    1: Workload(1, "tiny (identity)", map_identity, 0, _check_scalars(1)),
    2: Workload(2, "150 KB image", map_image, 224 * 224 * 3,
                _check_array((224, 224, 3), np.uint8)),
    3: Workload(3, "4 MiB array", map_big, 4 << 20,
                _check_array((1024, 1024), np.float32)),
    4: Workload(4, "pure Python ~1 ms", map_python, 0, _check_scalars(2)),
    5: Workload(5, "BLAS ~1 ms (1 thread)", map_blas, 0, _check_scalars(2)),
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
