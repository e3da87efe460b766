"""The native marker, the base class of built-in ops, :class:`Compose` and :func:`fuse`.

*Native* is the one fact the run-in-thread table (:mod:`dataflow.parallel.policy`) needs about a
map op: a native op spends its time in C code that releases the GIL (numpy, Pillow) and does no
per-element Python work, so threads run it in parallel and it never needs a worker process.
Built-in ops state it in their class attribute ``native``; a user function is marked with
:func:`native`; :func:`is_native` reads both.
"""
import functools
import numbers
import types
from collections.abc import Mapping
from copy import copy

from ..base import restore_attributes

__all__ = ["native", "is_native", "op_name", "Op", "Compose", "Lambda", "fuse"]

_MARK = "__dataflow_native__"


class _NativeFunction:
    """A callable that :func:`native` could not mark in place (a builtin, a ufunc, a bound
    method, a built-in op): calls ``__wrapped__`` with the same arguments. Keeps the wrapped
    callable's ``__name__``, ``__qualname__``, ``__doc__`` and signature, and pickles (with
    pickle or cloudpickle) as long as the wrapped callable does."""

    __dataflow_native__ = True

    def __init__(self, fn):
        functools.update_wrapper(self, fn)   # sets __wrapped__, __name__, __doc__, ...

    def __call__(self, *args, **kwargs):
        return self.__wrapped__(*args, **kwargs)

    def __reduce__(self):
        return _NativeFunction, (self.__wrapped__,)

    def __repr__(self):
        return f"native({self.__wrapped__!r})"


def native(fn):
    """Mark ``fn`` as native: it releases the GIL for (nearly) all of its run time, so the map
    runs it in threads even when ``python_multiprocessing=True``. Use it as a decorator.

    Only mark functions whose work happens in C without the GIL (numpy on large arrays, Pillow,
    OpenCV, a compiled extension); a function doing per-element Python work gains nothing from
    threads.

    It is also a class decorator: ``@dataflow.native class MyAug(imgaug.ImageAugmentor)``
    marks the instances of ``MyAug`` and of its subclasses, so a map of built-in and ``MyAug``
    augmentors (:class:`~dataflow.ops.Augment`) runs in threads.

    A Python function, a class or a ``functools.partial`` is marked in place and returned: it
    stays the same object, with the same signature, and pickles as before (so ``native(f)``
    marks ``f`` for every use; marking a class marks its instances, marking a method in a class
    body marks it for every instance). Any other callable (a builtin, a numpy ufunc, a bound
    method, a callable object, a built-in op) is left untouched and returned in a small wrapper
    with its ``__name__``, ``__doc__``, ``__wrapped__`` and signature, which pickles when the
    callable does.
    """
    if not callable(fn):
        raise TypeError(f"native() needs a callable, got {type(fn).__name__}")
    if isinstance(fn, (types.FunctionType, type, functools.partial)):
        try:
            setattr(fn, _MARK, True)
            return fn
        except (AttributeError, TypeError):   # a built-in class, say
            pass
    return _NativeFunction(fn)


def is_native(op):
    """Whether ``op`` is native: a built-in op whose ``native`` is true (a :class:`Compose` is
    native when all its ops are), a callable marked with :func:`native` (or a
    ``functools.partial`` of one), or a method of a class whose function was marked."""
    if isinstance(op, Op):
        return bool(op.native)
    mark = getattr(op, _MARK, None)
    if mark is not None:
        return bool(mark)
    if isinstance(op, functools.partial):
        return is_native(op.func)
    return False


def op_name(op):
    """A short name for messages: the function's qualified name, or the op's class name."""
    if isinstance(op, Lambda):
        return op_name(op.func)
    if isinstance(op, Op):
        return type(op).__name__
    if isinstance(op, _NativeFunction):
        return op_name(op.__wrapped__)
    if isinstance(op, functools.partial):
        return f"partial({op_name(op.func)})"
    return getattr(op, "__qualname__", None) or getattr(op, "__name__", None) or \
        type(op).__name__


class Op:
    """Base of the built-in ops.

    An op is called with one value. With ``index=None`` it transforms that value and returns
    the result. With ``index=k`` (an int, numpy integers included, for list/tuple datapoints, a
    key for dict datapoints) the value is a datapoint: the op transforms component ``k`` and
    returns a shallow copy of the datapoint with the new component (a tuple becomes a list, as
    in ``MapDataComponent``); the caller's datapoint is never modified. No op modifies its input
    array in place.

    Subclasses implement :meth:`apply` and set ``native`` truthfully (see the module doc).
    """

    native = False
    _fields = ()          # constructor arguments shown by repr, besides index

    def __init__(self, index=None):
        if isinstance(index, bool):
            raise TypeError(f"{type(self).__name__}: index must be None, an int or a dict key, "
                            f"got {index!r}")
        if isinstance(index, numbers.Integral):
            index = int(index)      # a numpy integer indexes a list too, as in tensorpack
        self.index = index

    def apply(self, value):
        """Transform one value (what the op does with ``index=None``)."""
        raise NotImplementedError

    def __setstate__(self, state):
        # a worker's copy: attributes one by one (see DataFlow.__setstate__)
        restore_attributes(self, state)

    def __call__(self, dp):
        if self.index is None:
            return self.apply(dp)
        if isinstance(dp, (list, tuple)):
            if not isinstance(self.index, int):
                raise TypeError(f"{self!r}: a list/tuple datapoint needs an int index, "
                                f"got {self.index!r}")
            if not -len(dp) <= self.index < len(dp):
                raise IndexError(f"{self!r}: the datapoint has {len(dp)} components, "
                                 f"no component {self.index}")
            out = list(dp) if isinstance(dp, tuple) else copy(dp)
        elif isinstance(dp, Mapping):
            if self.index not in dp:
                raise KeyError(f"{self!r}: the datapoint has no key {self.index!r} "
                               f"(keys: {list(dp)[:10]})")
            out = copy(dp)
        else:
            raise TypeError(f"{self!r}: with an index, the op expects a datapoint (list, tuple "
                            f"or dict), got {type(dp).__name__}")
        r = self.apply(dp[self.index])
        if r is None:
            return None
        out[self.index] = r
        return out

    def merge_next(self, nxt):
        """An op that gives exactly what applying this op then ``nxt`` gives, in one faster
        step, or None (the default: no such op). :class:`Compose` uses it on consecutive
        pairs."""
        return None

    def _err(self, exc_type, msg):
        return exc_type(f"{type(self).__name__}: {msg}")

    def __repr__(self):
        args = [f"{f}={getattr(self, f)!r}" for f in self._fields]
        if self.index is not None:
            args.append(f"index={self.index!r}")
        return f"{type(self).__name__}({', '.join(args)})"


class Lambda(Op):
    """Apply a user function as an op, to the value or (with ``index``) to one component.
    ``native`` is :func:`is_native` of the function."""

    _fields = ("func",)

    def __init__(self, func, index=None):
        super().__init__(index)
        if not callable(func):
            raise TypeError(f"Lambda: func must be callable, got {type(func).__name__}")
        self.func = func

    @property
    def native(self):
        return is_native(self.func)

    def apply(self, value):
        return self.func(value)


def _flatten(ops, what):
    if callable(ops) and not isinstance(ops, (list, tuple)):
        ops = [ops]
    if not isinstance(ops, (list, tuple)):
        raise TypeError(f"{what}: expected a callable or a list of callables, "
                        f"got {type(ops).__name__}")
    out = []
    for i, op in enumerate(ops):
        if isinstance(op, Compose):
            out.extend(op.ops)          # already flat
        elif callable(op):
            out.append(op)
        else:
            raise TypeError(f"{what}: op #{i} is not callable: {op!r}")
    return out


class Compose(Op):
    """Apply ``ops`` in order, each to the result of the previous one. If any op returns
    ``None``, the datapoint is dropped: the rest are skipped and Compose returns ``None``.

    Compose has no index (its ops carry their own). Nested Composes are flattened into ``ops``.
    It is native when all its ops are (an empty Compose is the identity, and native).
    """

    def __init__(self, ops):
        super().__init__(None)
        self.ops = _flatten(ops, "Compose")
        # What __call__ runs: ``ops`` with each pair that an op can merge with its successor
        # (Op.merge_next, e.g. Normalize then HWC2CHW) replaced by the merged op.
        self._steps = []
        for op in self.ops:
            last = self._steps[-1] if self._steps else None
            merged = last.merge_next(op) if isinstance(last, Op) else None
            if merged is not None:
                self._steps[-1] = merged
            else:
                self._steps.append(op)

    @property
    def native(self):
        return all(is_native(op) for op in self.ops)

    def __call__(self, dp):
        for op in self._steps:
            dp = op(dp)
            if dp is None:
                return None
        return dp

    apply = __call__

    def __len__(self):
        return len(self.ops)

    def __repr__(self):
        return f"Compose({self.ops!r})"


def fuse(ops):
    """The op list ``ops`` (a callable or a list; Composes are flattened into their members)
    with every run of two or more consecutive native ops replaced by one native
    :class:`Compose`, so that a run is one call. A non-native op breaks a run. Applying the
    result in order gives exactly what applying ``ops`` in order gives."""
    out, run = [], []

    def flush():
        if len(run) == 1:
            out.append(run[0])
        elif run:
            out.append(Compose(run))
        run.clear()

    for op in _flatten(ops, "fuse"):
        if is_native(op):
            run.append(op)
        else:
            flush()
            out.append(op)
    flush()
    return out
