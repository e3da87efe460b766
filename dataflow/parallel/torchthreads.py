"""torch's intra-op threads in worker processes.

A worker forked from a consumer that had imported torch runs torch on one thread. torch's
OpenMP pool, once the consumer has used it with two or more threads, hangs a forked child's
first parallel operation with more than one thread (measured with torch 2.13: a 300x300 matmul
in the child never returned, also after ``torch.set_num_threads(2)`` there; after
``torch.set_num_threads(1)`` it ran), and whether the consumer has used the pool cannot be seen
from here. torch's ``DataLoader`` sets one thread in each of its workers for the same reason.

A worker that imports torch itself (spawned, started by the fork server, or forked before the
consumer imported torch) gets ``threads_for(N)`` threads, as for OpenCV (:mod:`.cvthreads`), so
that N workers do not each start a thread per core; the limit is applied at the start of the
next chunk of map work after torch was imported. This never imports torch.
"""
import sys

__all__ = ["set_process_limit", "apply_pending"]

_pending = None     # the limit to apply once torch is imported, or None


def set_process_limit(n, inherited=False):
    """In a worker process (or actor), for its life: torch on ``n`` threads, or on one where
    the process was forked with torch imported (``inherited``; see the module doc)."""
    global _pending
    torch = sys.modules.get("torch")
    if inherited and torch is not None:
        _pending = None
        _set(torch, 1)
    else:
        _pending = max(1, int(n))
        apply_pending()


def apply_pending():
    """Apply the limit if torch has been imported since (cheap when there is nothing to do)."""
    global _pending
    if _pending is not None:
        torch = sys.modules.get("torch")
        if torch is not None and hasattr(torch, "set_num_threads"):
            n, _pending = _pending, None
            _set(torch, n)


def _set(torch, n):
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
