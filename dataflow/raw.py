"""Dataflows that produce data from Python objects: lists, generators, iterables, queues, or
random numbers. Names, signatures and semantics follow ``tensorpack.dataflow.raw`` (0.11)."""
import copy
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from . import checkpoint as _ckpt
from ._helpers import check_flag, check_int
from .base import DataFlow, DataFlowReentrantGuard, EndlessError, RNGDataFlow, UnknownLengthError
from .stats import Counted as _Counted

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
        if not isinstance(shapes, (list, tuple)) or \
                not all(hasattr(s, "__iter__") and not isinstance(s, (str, bytes))
                        for s in shapes):
            raise TypeError(f"FakeData: shapes must be a list of shapes (lists or tuples of "
                            f"ints), got {shapes!r}")
        self.shapes = [tuple(check_int(f"FakeData: shapes[{i}]", d, 0) for d in s)
                       for i, s in enumerate(shapes)]
        self._size = check_int("FakeData: size", size, 0, whole_floats=True)
        self.random = check_flag("FakeData: random", random)
        n = len(self.shapes)
        if isinstance(dtype, (list, tuple)):
            self.dtype = list(dtype)
        else:
            self.dtype = [dtype] * n
        for d in self.dtype:
            try:
                np.dtype(d)
            except TypeError:
                raise TypeError(f"FakeData: not a numpy dtype: {d!r}") from None
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
        return _ckpt.replay_counted(self, self._one_pass)

    def _one_pass(self):
        rng = _require_rng(self)
        if self.random:
            for _ in range(self._size):
                yield self._draw(rng)
        else:
            val = self._draw(rng)
            for _ in range(self._size):
                yield copy.copy(val)

    # its draws continue one random stream: it can only be replayed
    _get_position = _ckpt.replay_state
    _set_position = _ckpt.PassPosition._set_position
    _abandon = _ckpt.PassPosition._abandon
    _pass = _pos = 0
    _in_pass = False
    _resume = None

    def _fingerprint_params(self):
        return {"size": self._size, "random": bool(self.random)}


class DataFromQueue(DataFlow):
    """Yields ``queue.get()`` forever (any object with a blocking ``get()`` method).

    Not reentrant: a second iteration started while one is running raises ``RuntimeError``, since
    two consumers would silently split the queue's items between them.
    """

    def __init__(self, queue):
        if not callable(getattr(queue, "get", None)):
            raise TypeError(f"DataFromQueue: queue must have a get() method (a queue.Queue, a "
                            f"multiprocessing queue), got {queue!r:.60}")
        self.queue = queue
        self._guard = None

    def reset_state(self):
        self._guard = DataFlowReentrantGuard()

    def __len__(self):
        raise EndlessError("DataFromQueue is endless: len() is unavailable")

    def __iter__(self):
        return _ckpt.replay_counted(self, self._gets)

    def _gets(self):
        with _guard_of(self):
            while True:
                yield self.queue.get()

    # a queue cannot be read again: it can only be replayed
    _get_position = _ckpt.replay_state
    _set_position = _ckpt.PassPosition._set_position
    _abandon = _ckpt.PassPosition._abandon
    _pass = _pos = 0
    _in_pass = False
    _resume = None


def _check_sequence(lst):
    """``TypeError`` unless ``lst`` has a length and its datapoints at the indices ``0 ..
    len - 1`` (a set or a dict of other keys failed only at the first pass)."""
    try:
        n = len(lst)
        ok = hasattr(type(lst), "__getitem__")
    except TypeError:           # no len(): a generator, an iterator, a 0-d numpy array
        ok = False
    if not ok:
        raise TypeError(f"DataFromList: lst must be a sequence supporting len() and indexing "
                        f"(a list, tuple, numpy array, ...), got a {type(lst).__name__}; pass "
                        f"list(...) of it (DataFromGenerator takes a generator)")
    if isinstance(lst, Mapping):      # indexed by position: the keys must be 0 .. n - 1
        missing = next((k for k in range(n) if k not in lst), None)
        if missing is not None:
            raise TypeError(f"DataFromList: lst must be a sequence (a list, tuple, numpy array, "
                            f"...), got a {type(lst).__name__} without the key {missing!r} (its "
                            f"datapoints are read at the indices 0 .. {n - 1}); pass "
                            f"list(d.values()) or list(d.items())")


class DataFromList(_ckpt.PassPosition, RNGDataFlow):
    """The elements of a list (or any sequence) as datapoints.

    Each pass yields every element exactly once: in order with ``shuffle=False``, otherwise in the
    order of a fresh random permutation of the indices. The permutation of pass ``p`` is a pure
    function of ``p`` and of one number drawn from ``self.rng`` at the first pass, so that
    ``state_dict()`` is two ints and the seed, and resuming costs nothing.

    Elements are read by index, ``lst[i]`` for ``i`` in ``0 .. len - 1``, with and without
    ``shuffle``; so a dict keyed ``0 .. n - 1`` gives its values both ways (tensorpack 0.11
    iterated it with ``shuffle=False``, giving the keys, and gave the values when shuffling),
    and any other dict, a set or an iterator is refused with ``TypeError`` when built.
    """

    def __init__(self, lst, shuffle=True):
        """
        Args:
            lst (list): the datapoints.
            shuffle (bool): shuffle them at every pass.
        """
        super().__init__()
        _check_sequence(lst)
        self.lst = lst
        self.shuffle = check_flag("DataFromList: shuffle", shuffle)

    _base = None               # the seed of the permutations, drawn from self.rng
    _perm = None               # ((base, pass, length), the permutation of that pass)

    def __len__(self):
        return len(self.lst)

    def reset_state(self):
        super().reset_state()
        self._reset_position()
        self._live = None
        if self._resume is None:
            self._base = None

    def __iter__(self):
        self._live = None
        # the pass begins at iter(), not at the first next(): an iterator made and dropped
        # unstarted (by JoinData, say) counts as a pass, resumed or not
        p, start = self._begin_pass()
        lst = self.lst
        if isinstance(lst, (list, tuple)):
            # Over a list: the list's own iterator (in order) or the list's items at the indices
            # of the pass's permutation (shuffled), then a call that ends the pass (when the
            # iterator is exhausted, as the generator of _one_pass would), all in C: no Python
            # frame is resumed per datapoint. The iterator in self._live says how many
            # datapoints of the pass are left (the position, and the statistics' count).
            if self.shuffle:
                self._live = it = iter(self._permutation(p)[start:])
                items = map(lst.__getitem__, it)
            else:
                self._live = it = items = iter(lst[start:]) if start else iter(lst)
            out = _Counted(items, iter(self._finish_pass, None))
            n = len(lst) - start
            out.count = lambda: n - it.__length_hint__()
            return out
        return self._one_pass(p, start)

    def _permutation(self, p):
        """The order of pass ``p``, as a list of indices (see the class doc)."""
        lst = self.lst
        if self._base is None:
            self._base = int(_require_rng(self).randint(2**31))
        key = (self._base, p, len(lst))
        if self._perm is None or self._perm[0] != key:   # kept: a resume seeks often
            self._perm = (key, _ckpt.keyed_permutation(self._base, p, len(lst)).tolist())
        return self._perm[1]

    def _finish_pass(self):
        """The end of an in-order pass over a list (see __iter__); returns None, the sentinel
        that stops ``iter(self._finish_pass, None)``."""
        self._live = None
        self._end_pass()

    def _one_pass(self, p, start):
        # A sequence other than a list or tuple (a pass over a list is __iter__'s chain).
        # The position of a shuffled pass is not stored per datapoint (that costs a measurable
        # share of a cheap pipeline): it is read from the iterator in self._live, whose
        # __length_hint__ (PEP 424) says how many datapoints of the pass are left.
        lst = self.lst
        if not self.shuffle:
            for k in range(start, len(lst)):
                self._pos = k + 1
                yield lst[k]
        else:
            self._live = it = iter(self._permutation(p)[start:])
            for k in it:
                yield lst[k]
        self._live = None
        self._end_pass()

    _live = None               # the iterator of the running pass (see _one_pass)

    def _get_position(self):
        if self._live is not None and self._in_pass and self._resume is None:
            self._pos = len(self.lst) - self._live.__length_hint__()
        s = _ckpt.PassPosition._get_position(self)
        if self.shuffle:
            s.setdefault("base", _ckpt.base_seed(self))
        return s

    def _set_position(self, position):
        _ckpt.PassPosition._set_position(self, position)
        if position.get("base") is not None:
            self._base = int(position["base"])

    def _fingerprint_params(self):
        return {"len": len(self.lst), "shuffle": bool(self.shuffle)}


class DataFromGenerator(DataFlow):
    """Datapoints from a generator.

    ``gen`` is either a callable returning an iterable (a generator function: every pass calls it
    again) or an iterable. A one-shot iterator (a generator object, say) can be consumed once: a
    pass that is started after it was exhausted raises ``RuntimeError`` rather than silently
    yielding nothing; a pass that starts after an earlier pass was stopped early resumes where it
    stopped. ``len()`` is ``size`` if given, else ``len(gen)`` when ``gen`` has a length (a
    list, say; as in tensorpack), else it raises ``NotImplementedError``.
    """

    def __init__(self, gen, size=None):
        """
        Args:
            gen: a callable returning an iterable, or an iterable.
            size (int, optional): the number of datapoints of one pass, if known.
        """
        if not callable(gen) and not hasattr(gen, "__iter__"):
            raise TypeError(f"DataFromGenerator: gen must be a callable returning an iterable, "
                            f"or an iterable, got {gen!r:.60}")
        self._gen = gen
        self._size = None if size is None else \
            check_int("DataFromGenerator: size", size, 0, whole_floats=True)
        # its own iterator (told without calling iter(), which would begin a dataflow's pass)
        self._one_shot = (not callable(gen)) and isinstance(gen, Iterator)
        self._exhausted = False

    def __len__(self):
        if self._size is not None:
            return self._size
        try:
            return len(self._gen)      # tensorpack's len(): that of a list given as gen
        except (TypeError, NotImplementedError):
            raise UnknownLengthError("DataFromGenerator does not know its length "
                                     "(pass size= if it is known)") from None

    def __iter__(self):
        return _ckpt.replay_counted(self, self._one_pass)

    # a generator cannot say where it is: it can only be replayed
    _get_position = _ckpt.replay_state
    _set_position = _ckpt.PassPosition._set_position
    _abandon = _ckpt.PassPosition._abandon
    _pass = _pos = 0
    _in_pass = False
    _resume = None

    def _one_pass(self):
        if callable(self._gen):
            yield from self._gen()
            return
        yield from _pass_of_iterable(self, self._gen, "Pass a generator function (a callable "
                                     "returning a new generator) to iterate more than once.")


def _pass_of_iterable(df, iterable, fix):
    """One pass of ``iterable`` for ``df``, whose ``_one_shot`` says whether the iterable is its
    own iterator (a generator object, a file): such a one is consumed once, and a pass started
    after it was exhausted raises ``RuntimeError`` (naming ``fix``) rather than silently
    yielding nothing; one stopped early resumes where it stopped."""
    if df._one_shot and df._exhausted:
        raise RuntimeError(f"{type(df).__name__} wraps an iterator ({type(iterable).__name__} "
                           f"object), which was already exhausted by an earlier pass. {fix}")
    # a for loop, not ``yield from``: closing this pass early must not close the user's iterator
    for dp in iterable:
        yield dp
    df._exhausted = True


class DataFromIterable(DataFlow):
    """The elements of an iterable as datapoints; each pass calls ``iter(iterable)``. A one-shot
    iterator (a generator object, a file) is consumed once, as by :class:`DataFromGenerator`: a
    pass started after it was exhausted raises ``RuntimeError`` (tensorpack's pass was silently
    empty), and one started after an earlier pass stopped early resumes where it stopped
    (tensorpack closed the generator, losing the rest).

    ``len()`` is ``len(iterable)`` when the iterable has a length (taken at construction, as in
    tensorpack), otherwise it raises ``NotImplementedError``; an iterable whose ``len()`` raises
    (a dataflow of unknown length: ``NotImplementedError``) has none, as in tensorpack.
    """

    def __init__(self, iterable):
        self._itr = iterable
        self._one_shot = isinstance(iterable, Iterator)      # see DataFromGenerator
        self._exhausted = False
        try:
            self._len = len(iterable)
        except Exception:
            self._len = None

    def __len__(self):
        if self._len is None:
            raise UnknownLengthError("DataFromIterable: the wrapped iterable has no length")
        return self._len

    def __iter__(self):
        if isinstance(self._itr, Sequence):      # indexable: resumes exactly, by index
            p, start = _ckpt.PassPosition._begin_pass(self)
            return self._from(start)
        return _ckpt.replay_counted(self, self._one_pass)

    def _from(self, start):
        seq = self._itr
        for k in range(start, len(seq)):
            self._pos = k + 1
            yield seq[k]
        _ckpt.PassPosition._end_pass(self)

    def _one_pass(self):
        return _pass_of_iterable(self, self._itr, "Give a re-iterable object (a list, a "
                                 "dataflow) to iterate more than once.")

    # another re-iterable object is replayed: its position is the count of datapoints returned
    def _get_position(self):
        if isinstance(self._itr, Sequence):
            return _ckpt.PassPosition._get_position(self)
        return _ckpt.replay_state(self)

    _set_position = _ckpt.PassPosition._set_position
    _abandon = _ckpt.PassPosition._abandon
    _pass = _pos = 0
    _in_pass = False
    _resume = None
