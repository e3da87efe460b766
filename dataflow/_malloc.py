"""glibc malloc settings for a process that allocates and frees large blocks over and over.

With glibc's defaults a freed block above 128 KiB goes back to the kernel (it was mmapped, or
the heap top it left free is trimmed), and the next one is fresh memory that page-faults in:
ZeroMQ allocates every message it sends or receives, so each 150 KB datapoint moved over a
socket paid about 37 page faults on each side (about 60 us of CPU per datapoint on the
sender, measured on the 2-vCPU development VM, against under 20 us with memory kept).
:func:`keep_freed_memory` makes glibc serve blocks up to 32 MiB from the heap and keep up to
128 MiB of freed heap, so such blocks are reused warm. It affects the whole process; it does
nothing on other platforms or C libraries.
"""
import ctypes
import sys

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20       # blocks up to this size come from the heap
TRIM_THRESHOLD = 128 << 20      # freed heap kept before any is returned to the kernel


def keep_freed_memory():
    """Let glibc keep freed memory in this process instead of returning it to the kernel (see
    the module doc). True if the settings were applied."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):   # no C library symbols, or not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # Setting either turns off glibc's dynamic mmap threshold, so the trim threshold is set only
    # once the mmap threshold is (a 32-bit glibc refuses one above 512 KiB: then glibc's own
    # adaptive thresholds are left alone rather than pinned at their 128 KiB start).
    if not mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD):
        return False
    return bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
