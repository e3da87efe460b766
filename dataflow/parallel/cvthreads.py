"""OpenCV's own thread pool in map workers.

OpenCV runs many functions (``resize``, ``warpAffine``, ``cvtColor`` on large images, ...) on
a thread pool as large as the machine. N map workers doing that at once ask for N times as many
threads as there are cores, and lose time to the oversubscription. So while a pool of map
workers runs, OpenCV in its process is limited to ``threads_for(N)`` = ``cpus // N`` threads
(at least 1), ``cpus`` being the CPUs this process may use:

* a worker process (and a Ray actor, with its reserved CPUs) sets the limit for its whole life;
* a thread pool sets it for the process while the pool runs (the smallest limit of the pools
  running wins) and puts the previous value back when the last pool closes.

This never imports OpenCV: the limit is applied at once if ``cv2`` is already imported, and
otherwise when it is first imported through :func:`import_cv2` (how dataflow's own code imports
it), or at the start of the next chunk of map work that finds ``cv2`` imported (a map function
that imports it itself).

One exception: a worker *forked* from a consumer that had already imported cv2 leaves OpenCV's
count as it inherited it. Changing it there can deadlock (the child inherits the pool's locks
but not its threads; measured with OpenCV 5.0: ``cv2.setNumThreads`` in such a child, or in the
consumer just before the fork, hangs the child), so such workers may oversubscribe. Workers
started by the fork server or spawned, and forked workers that import cv2 themselves, are
limited.
"""
import itertools
import sys
import threading

from .._helpers import available_cpus

__all__ = ["threads_for", "set_process_limit", "hold", "release", "apply_pending",
           "import_cv2"]

_lock = threading.Lock()
_pending = None          # a limit to apply once cv2 is imported, or None
_process_limit = None    # set by a worker process for its life
_held = {}               # token -> limit, one per running thread pool
_tokens = itertools.count()
_restore = None          # OpenCV's thread count before the first pool changed it
_frozen = False          # a forked child that inherited cv2: never change the count


def threads_for(num_workers):
    """The OpenCV threads each of ``num_workers`` workers should use: ``cpus // num_workers``,
    at least 1."""
    return max(1, available_cpus() // max(1, int(num_workers)))


def _set(n):
    """Apply limit ``n`` now if cv2 is imported, else remember it for later. Outside a worker
    process, remember OpenCV's own count first, to put it back."""
    global _pending, _restore
    if _frozen:
        _pending = None
        return
    cv2 = sys.modules.get("cv2")
    if cv2 is None or not hasattr(cv2, "setNumThreads"):
        _pending = n
        return
    _pending = None
    current = cv2.getNumThreads()
    if current == n:
        return                              # nothing to change (and safe in a forked child)
    if _process_limit is None and _restore is None:
        _restore = current
    cv2.setNumThreads(int(n))


def _current():
    if _process_limit is not None:
        return _process_limit
    if _held:
        return min(_held.values())
    return None


def set_process_limit(n, inherited=False):
    """In a worker process (or actor): limit OpenCV to ``n`` threads for the process's life.
    ``inherited``: the process was forked with cv2 already imported, so OpenCV's count is left
    as inherited, for good (see the module doc)."""
    global _process_limit, _frozen
    with _lock:
        _process_limit = max(1, int(n))
        _held.clear()                       # a forked child inherits its parent's pools' entries
        _frozen = bool(inherited)
        _set(_process_limit)


def hold(n):
    """A thread pool starts: limit OpenCV to ``n`` threads while it runs. Returns a token for
    :func:`release`."""
    with _lock:
        token = next(_tokens)
        _held[token] = max(1, int(n))
        _set(_current())
        return token


def release(token):
    """The thread pool of ``token`` has closed: relax the limit, or put back OpenCV's
    previous thread count when no pool is left. Unknown tokens are ignored (idempotent)."""
    global _pending, _restore
    with _lock:
        if _held.pop(token, None) is None:
            return
        limit = _current()
        if limit is not None:
            _set(limit)
            return
        _pending = None
        cv2 = sys.modules.get("cv2")
        if _restore is not None and cv2 is not None:
            cv2.setNumThreads(_restore)
        _restore = None


def apply_pending():
    """Apply a remembered limit if cv2 has been imported since (cheap when there is none)."""
    if _pending is not None and "cv2" in sys.modules:
        with _lock:
            if _pending is not None:
                _set(_pending)


def import_cv2():
    """``import cv2`` with the worker's thread limit applied; ``ImportError`` names the extra."""
    try:
        import cv2
    except ImportError as e:
        raise ImportError("this needs OpenCV: pip install 'dataflow-rt[images]'  "
                          "(or: pip install opencv-python-headless)") from e
    apply_pending()
    return cv2
