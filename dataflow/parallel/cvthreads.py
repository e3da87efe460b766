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

Forking. A pool thread of OpenCV that holds one of the pool's locks when the consumer forks
leaves that lock held for ever in the child, whose next parallel OpenCV call then hangs (35 of
3,000 forks right after the consumer used the pool, measured with OpenCV 5.1's 16 threads on 2
busy cores). So a worker is forked with OpenCV's pool stopped: :func:`stopped_for_fork` sets
the consumer's count to 1 around the fork (OpenCV then joins its threads), and puts it back
after, which starts the threads again on the next parallel call. The child inherits no pool
thread and sets its own limit. That holds for OpenCV's own pthreads pool (the opencv-python
wheels). Where OpenCV runs another framework (TBB, OpenMP) this cannot stop its threads: a
worker forked with such a cv2 imported leaves OpenCV's count as inherited (changing it could
deadlock), and :func:`fork_safe` tells the default start method to use the fork server.
"""
import contextlib
import itertools
import os
import sys
import threading

from .._helpers import available_cpus

__all__ = ["threads_for", "set_process_limit", "hold", "release", "apply_pending",
           "import_cv2", "stopped_for_fork", "fork_safe"]

_lock = threading.Lock()
_pending = None          # a limit to apply once cv2 is imported, or None
_process_limit = None    # set by a worker process for its life
_held = {}               # token -> limit, one per running thread pool
_tokens = itertools.count()
_restore = None          # OpenCV's thread count before the first pool changed it
_frozen = False          # a forked child that inherited cv2: never change the count
_own_pool = None         # whether OpenCV runs parallel code on its own pthreads pool (cached)


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
    ``inherited``: the process was forked with a cv2 whose threads could not be stopped
    (:func:`stopped_for_fork` yielded False), so OpenCV's count is left as inherited, for good
    (see the module doc)."""
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


def _runs_own_pool(cv2):
    """Whether OpenCV runs its parallel code on its own pthreads pool, whose threads
    ``setNumThreads(1)`` stops and joins (the opencv-python wheels), rather than on TBB, OpenMP
    or a parallel backend plugin chosen with ``OPENCV_PARALLEL_BACKEND``."""
    global _own_pool
    if _own_pool is None:
        info = cv2.getBuildInformation() if hasattr(cv2, "getBuildInformation") else ""
        framework = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                          if line.strip().startswith("Parallel framework:")), "")
        _own_pool = framework in ("pthreads", "none")
    return _own_pool and not os.environ.get("OPENCV_PARALLEL_BACKEND")


def fork_safe():
    """Whether forking this process leaves OpenCV usable in the child: cv2 is not imported, or
    its pool is one :func:`stopped_for_fork` can stop."""
    cv2 = sys.modules.get("cv2")
    return cv2 is None or not hasattr(cv2, "setNumThreads") or _runs_own_pool(cv2)


@contextlib.contextmanager
def stopped_for_fork(forking=True):
    """Around the start of a worker process: when ``forking``, OpenCV's pool threads are
    stopped, so that the child inherits none of their locks (see the module doc), and the
    consumer's count is put back afterwards. Yields whether the child may set its own OpenCV
    thread count: always for a child that is not forked, or forked without cv2, or with its
    pool stopped; not where OpenCV's threads are not its own (:func:`fork_safe`)."""
    cv2 = sys.modules.get("cv2")
    if not forking or cv2 is None or not hasattr(cv2, "setNumThreads"):
        yield True
        return
    if not _runs_own_pool(cv2):
        yield False
        return
    # not holding _lock across the fork: the child would inherit it held
    with _lock:
        count = cv2.getNumThreads()
        if count != 1:
            cv2.setNumThreads(1)        # OpenCV stops and joins its pool's threads
    try:
        yield True
    finally:
        with _lock:
            if count != 1 and cv2.getNumThreads() == 1:
                cv2.setNumThreads(count)    # threads start again on the next parallel call


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
