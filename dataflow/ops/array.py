"""Ops on arrays and labels of any shape: dtype casts and one-hot encoding."""
import numpy as np

from .base import Op

__all__ = ["TypeCast", "OneHot"]


class TypeCast(Op):
    """Cast to ``dtype`` with numpy's ``astype`` (unsafe casting: out-of-range values wrap or
    truncate as numpy defines). An array comes back as an array (itself when it already has the
    dtype); a scalar (Python or numpy) comes back as a numpy scalar of ``dtype``; a list becomes
    an array. A value numpy cannot cast raises ``TypeError`` or ``ValueError`` naming the op.

    Native: one numpy conversion (for array inputs; a Python list is converted element by
    element, so pass arrays).
    """

    native = True
    _fields = ("dtype",)

    def __init__(self, dtype, index=None):
        super().__init__(index)
        try:
            self.dtype = np.dtype(dtype)
        except TypeError as e:
            raise TypeError(f"TypeCast: not a numpy dtype: {dtype!r}") from e
        if self.dtype.kind == "O":
            raise TypeError("TypeCast: casting to the object dtype is not supported")
        if dtype is None or (self.dtype.kind == "V" and not self.dtype.names):
            # np.dtype(None) is float64 and np.dtype([]) an empty record: both are mistakes
            raise TypeError(f"TypeCast: dtype must name a numeric dtype, got {dtype!r}")

    def apply(self, x):
        try:
            if isinstance(x, np.ndarray):
                return x.astype(self.dtype, copy=False)
            a = np.asarray(x).astype(self.dtype)
        except (TypeError, ValueError) as e:
            shape = getattr(x, "shape", None)      # (np.shape of a ragged list raises too)
            raise type(e)(f"TypeCast: cannot cast {type(x).__name__}"
                          f"{'' if shape is None else f' (shape {shape})'} to {self.dtype}: "
                          f"{e}") from e
        return a[()] if a.ndim == 0 else a


class OneHot(Op):
    """One-hot encode integer class labels as float32: a label ``y`` becomes a vector of
    ``num_classes`` zeros with a 1 at ``y``. An int (Python or numpy) gives shape
    ``(num_classes,)``; an integer array of shape ``S`` gives ``S + (num_classes,)``.

    A label outside ``[0, num_classes)`` raises ``ValueError`` naming it; a non-integer label
    (a float, a bool) raises ``TypeError``.

    Native: vectorised numpy, no per-element Python (the time for a single label is a few
    microseconds either way).
    """

    native = True
    _fields = ("num_classes",)

    def __init__(self, num_classes, index=None):
        super().__init__(index)
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or \
                num_classes < 1:
            raise ValueError(f"OneHot: num_classes must be a positive int, got {num_classes!r}")
        self.num_classes = int(num_classes)

    def apply(self, y):
        a = np.asarray(y)
        if a.dtype.kind not in "iu":
            raise self._err(TypeError, f"labels must be integers, got dtype {a.dtype} "
                                       f"({type(y).__name__})")
        n = self.num_classes
        flat = a.reshape(-1)
        bad = (flat < 0) | (flat >= n)
        if bad.any():
            raise self._err(ValueError, f"label {flat[bad][0]} is out of range for "
                                        f"num_classes={n} (labels must be in [0, {n}))")
        out = np.zeros((flat.size, n), dtype=np.float32)
        out[np.arange(flat.size), flat] = 1
        return out.reshape(a.shape + (n,))
