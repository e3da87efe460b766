"""The DataFlow protocol, as in tensorpack.

A DataFlow is an iterable of *datapoints* (lists, tuples or dicts of components). Before iterating,
the consumer calls :meth:`DataFlow.reset_state` once, in the process and thread that will iterate;
it is where a dataflow seeds its random state or starts its workers.
"""
import threading

from . import rng as _rng
from .stats import instrument as _instrument_stats, tell_inputs as _tell_stats_inputs

__all__ = ["DataFlow", "ProxyDataFlow", "RNGDataFlow", "DataFlowTerminated",
           "DataFlowReentrantGuard", "UnknownLengthError"]


class UnknownLengthError(NotImplementedError, TypeError):
    """Raised by ``len()`` of a dataflow whose length is not known. It is a
    ``NotImplementedError``, as in tensorpack, so ``except NotImplementedError`` still catches it,
    and a ``TypeError``, which ``list()``, ``tuple()``, ``sorted()`` and friends take to mean
    "no length: just iterate"."""


class DataFlowTerminated(BaseException):
    """Raised by a dataflow whose producer has stopped for good (for example, a queue that was
    closed). It derives from ``BaseException`` as in tensorpack, so that a bare ``except Exception``
    in a map function does not swallow it."""


class DataFlowReentrantGuard:
    """A context manager that makes a non-reentrant dataflow fail fast.

    Entering it while it is already entered (by another iteration of the same dataflow, in this
    thread or another one) raises ``RuntimeError`` instead of interleaving two iterations.
    """

    def __init__(self):
        self._lock = threading.Lock()

    # A dataflow that holds a guard may be sent to worker processes (a runner ships its copy):
    # the copy gets a fresh, unlocked guard.
    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def __enter__(self):
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("This DataFlow is not reentrant: it is already being iterated "
                               "(in this thread or another one).")
        return self

    def __exit__(self, exc_type, exc, tb):
        self._lock.release()
        return False


class DataFlow:
    """Base class of every dataflow.

    Subclasses implement ``__iter__`` (one pass over the data) and, when the number of datapoints
    per pass is known, ``__len__``.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        _instrument_stats(cls)      # every dataflow records statistics (dataflow.stats)

    def __iter__(self):
        raise NotImplementedError

    def __len__(self):
        """The number of datapoints of one pass. Raises :class:`UnknownLengthError` (a
        ``NotImplementedError``) when unknown."""
        raise UnknownLengthError(f"{type(self).__name__} does not know its length")

    def reset_state(self):
        """Prepare the dataflow for iteration in the current process. Call it once before the first
        ``__iter__``; for dataflows that hold workers, it (re)starts them."""

    def close(self):
        """Release what this dataflow, and every dataflow it reads from, holds (worker threads
        and processes); idempotent. ``reset_state()`` starts again. Also available as
        ``with df: ...``. Dataflows that hold nothing just pass the call upstream."""
        for source in _sources(self):
            source.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # tensorpack kept these for old code; so do we.
    def get_data(self):
        return self.__iter__()

    def size(self):
        return self.__len__()


class RNGDataFlow(DataFlow):
    """A dataflow with its own random state ``self.rng`` (a ``numpy.random.RandomState``), set in
    ``reset_state``. With :func:`dataflow.set_seed` the streams are reproducible; see
    :mod:`dataflow.rng`."""

    rng = None

    def reset_state(self):
        self.rng = _rng.get_rng(self)


class ProxyDataFlow(DataFlow):
    """A dataflow that wraps another one (``self.ds``) and by default forwards everything to it."""

    def __init__(self, ds):
        self.ds = ds

    def reset_state(self):
        self.ds.reset_state()

    def __len__(self):
        return len(self.ds)

    def __iter__(self):
        return iter(self.ds)


def _sources(df):
    """The dataflows ``df`` reads from: ``df.ds`` and the members of ``df.df_lists`` (plain or in
    ``(dataflow, probability)`` pairs), when they have a ``close``."""
    found = [getattr(df, "ds", None)]
    for item in getattr(df, "df_lists", None) or ():
        found.append(item[0] if isinstance(item, (tuple, list)) else item)
    return [d for d in found if callable(getattr(d, "close", None))]


_tell_stats_inputs(_sources)
