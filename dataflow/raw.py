"""Dataflows that produce data from Python objects: lists, generators, iterables, queues, or
random numbers. Names, signatures and semantics follow ``tensorpack.dataflow.raw`` (0.11)."""
import copy

import numpy as np

from .base import DataFlow, DataFlowReentrantGuard, RNGDataFlow, UnknownLengthError

__all__ = ["FakeData", "DataFromQueue", "DataFromList", "DataFromGenerator", "DataFromIterable"]


def _guard_of(df):
    """The reentrancy guard of ``df``, created on first use.

    Guards hold a ``threading.Lock``, which cannot be pickled; like tensorpack we create them in
    ``reset_state`` (which runs where the dataflow will be iterated) and, if the user iterates
    without calling ``reset_state``, here."""
    guard = getattr(df, "_guard", None)
    if guard is None:
        guard = df._guard = DataFlowReentrantGuard()
    return guard


def _require_rng(df):
    if df.rng is None:
        raise RuntimeError(f"{type(df).__name__} has no random state: call reset_state() before "
                           "iterating it.")
    return df.rng


class FakeData(RNGDataFlow):
    """Random datapoints of given shapes, for benchmarks and tests.

    Each datapoint is a list with one ``np.ndarray`` per entry of ``shapes``, uniformly drawn from
    ``domain`` (``[low, high)``) and cast to ``dtype``. Every pass has exactly ``size`` datapoints.
    With ``random=False`` one datapoint is drawn at the start of each pass and yielded (as a shallow
    copy of the same list) ``size`` times, which measures the pipeline and not the generation.
    """

    def __init__(self, shapes, size=1000, random=True, dtype="float32", domain=(0, 1)):
        """
        Args:
            shapes (list): a list of shapes (lists/tuples of ints), one per component.
            size (int): number of datapoints of one pass.
            random (bool): draw new data for every datapoint (True) or reuse one (False).
            dtype (str or list): a dtype, or a list with one dtype per component.
            domain (tuple or list): a ``(low, high)`` pair, or a list with one pair per component.
        """
        super().__init__()
        self.shapes = [tuple(s) for s in shapes]
        self._size = int(size)
        if self._size < 0:
            raise ValueError(f"FakeData: size must be >= 0, got {size}")
        self.random = random
        n = len(self.shapes)
        if isinstance(dtype, (list, tuple)):
            self.dtype = list(dtype)
        else:
            self.dtype = [dtype] * n
        if (isinstance(domain, (list, tuple)) and len(domain) == 2
                and all(np.isscalar(v) for v in domain)):
            self.domain = [tuple(domain)] * n
        else:
            self.domain = [tuple(d) for d in domain]
        if len(self.dtype) != n:
            raise ValueError(f"FakeData: got {len(self.dtype)} dtypes for {n} shapes")
        if len(self.domain) != n:
            raise ValueError(f"FakeData: got {len(self.domain)} domains for {n} shapes")

    def __len__(self):
        return self._size

    def _draw(self, rng):
        val = []
        for shape, dtype, (low, high) in zip(self.shapes, self.dtype, self.domain):
            v = rng.rand(*shape) * (high - low) + low
            val.append(np.asarray(v).astype(dtype))
        return val

    def __iter__(self):
        rng = _require_rng(self)
        if self.random:
            for _ in range(self._size):
                yield self._draw(rng)
        else:
            val = self._draw(rng)
            for _ in range(self._size):
                yield copy.copy(val)


class DataFromQueue(DataFlow):
    """Yields ``queue.get()`` forever (any object with a blocking ``get()`` method).

    Not reentrant: a second iteration started while one is running raises ``RuntimeError``, since
    two consumers would silently split the queue's items between them.
    """

    def __init__(self, queue):
        self.queue = queue
        self._guard = None

    def reset_state(self):
        self._guard = DataFlowReentrantGuard()

    def __iter__(self):
        with _guard_of(self):
            while True:
                yield self.queue.get()


class DataFromList(RNGDataFlow):
    """The elements of a list (or any sequence) as datapoints.

    Each pass yields every element exactly once: in order with ``shuffle=False``, otherwise in the
    order of a fresh random permutation of the indices drawn from ``self.rng``.
    """

    def __init__(self, lst, shuffle=True):
        """
        Args:
            lst (list): the datapoints.
            shuffle (bool): shuffle them at every pass.
        """
        super().__init__()
        self.lst = lst
        self.shuffle = shuffle

    def __len__(self):
        return len(self.lst)

    def __iter__(self):
        if not self.shuffle:
            return iter(self.lst)     # the list's own iterator: no generator frame per datapoint
        return self._shuffled()

    def _shuffled(self):
        idxs = np.arange(len(self.lst))
        _require_rng(self).shuffle(idxs)
        for k in idxs:
            yield self.lst[k]


class DataFromGenerator(DataFlow):
    """Datapoints from a generator.

    ``gen`` is either a callable returning an iterable (a generator function: every pass calls it
    again) or an iterable. A one-shot iterator (a generator object, say) can be consumed once: a
    pass that is started after it was exhausted raises ``RuntimeError`` rather than silently
    yielding nothing; a pass that starts after an earlier pass was stopped early resumes where it
    stopped. ``len()`` raises ``NotImplementedError`` unless ``size`` is given.
    """

    def __init__(self, gen, size=None):
        """
        Args:
            gen: a callable returning an iterable, or an iterable.
            size (int, optional): the number of datapoints of one pass, if known.
        """
        self._gen = gen
        self._size = None if size is None else int(size)
        self._one_shot = (not callable(gen)) and iter(gen) is gen
        self._exhausted = False

    def __len__(self):
        if self._size is None:
            raise UnknownLengthError("DataFromGenerator does not know its length "
                                     "(pass size= if it is known)")
        return self._size

    def __iter__(self):
        if callable(self._gen):
            yield from self._gen()
            return
        if self._one_shot and self._exhausted:
            raise RuntimeError("DataFromGenerator wraps a generator (iterator) object, which was "
                               "already exhausted by an earlier pass. Pass a generator function "
                               "(a callable returning a new generator) to iterate more than once.")
        # a for loop, not ``yield from``: closing this pass early must not close the user's iterator
        for dp in self._gen:
            yield dp
        self._exhausted = True


class DataFromIterable(DataFlow):
    """The elements of an iterable as datapoints; each pass calls ``iter(iterable)``.

    ``len()`` is ``len(iterable)`` when the iterable has a length (taken at construction, as in
    tensorpack), otherwise it raises ``NotImplementedError``.
    """

    def __init__(self, iterable):
        self._itr = iterable
        try:
            self._len = len(iterable)
        except TypeError:
            self._len = None

    def __len__(self):
        if self._len is None:
            raise UnknownLengthError("DataFromIterable: the wrapped iterable has no length")
        return self._len

    def __iter__(self):
        for dp in self._itr:  # not ``yield from``: closing a pass must not close the iterable
            yield dp
