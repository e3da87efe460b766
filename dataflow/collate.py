"""Collation: many datapoints into one batched datapoint (tensorpack's
``BatchData.aggregate_batch``), used by :class:`~dataflow.BatchData`,
:class:`~dataflow.BucketBatchData` and the map-and-batch dataflows."""
import math

import numpy as np

__all__ = ["aggregate_batch", "batch_numpy"]


def _shape_of(x):
    try:
        return np.shape(x)
    except Exception:  # a ragged nested list, say
        return f"<{type(x).__name__}>"


def batch_numpy(data_list, key=None):
    """Batch one component. Python ``int`` -> int32 (int64 if a value does not fit),
    ``bool`` -> bool (int32, as ``int``, when other values are mixed in), ``float`` -> float32,
    ``str``/``bytes`` -> numpy str array, numpy arrays and scalars -> their dtype (of the first
    one; for numpy strings, the width of the longest; for a numpy bool first, bool only if every
    value is one, else numpy's common type of the numbers, and ``ValueError`` for anything else)
    with a new leading axis; anything else is returned as the list itself. A value that the
    batch's dtype would change rather than store (2.5 in an int32 batch, 300 in a uint8 one, a
    finite 1e40 in a float32 one, None or 5 in a string one) raises ``ValueError`` naming the
    datapoint; tensorpack stored 2, 44, inf, 'None' and '5'. So does a value the dtype cannot
    hold at all (a Python int beyond int64; 300 as a Python int in a uint8 component)."""
    data = data_list[0]
    widen = False       # int32 from Python ints: int64 where a value needs it
    if type(data) is bool:
        # bool only if every value is one: numpy casts anything to bool ('xyz' and 2 became
        # True); a mixed component takes tensorpack's int32 rule, which refuses what is no number
        dtype = "bool" if all(type(x) is bool or type(x) is np.bool_ for x in data_list) \
            else "int32"
        widen = dtype == "int32"
    elif isinstance(data, int) and not isinstance(data, np.generic):
        dtype, widen = "int32", True
    elif type(data) is float:
        dtype = "float32"
    elif isinstance(data, (str, bytes)):
        dtype = "str"
    elif isinstance(data, (np.ndarray, np.generic)):
        dtype = data.dtype
        if dtype.kind in "US":      # fixed-width strings: the first one's width would cut longer
            dtype = dtype.kind      # ones (tensorpack's do); numpy picks the width of the longest
        elif dtype.kind == "b" and not all(_is_bool(x) for x in data_list):
            # numpy casts anything to bool (13, 1.5 and 'zx' became True): numbers mixed in
            # take numpy's common type, anything else is refused
            dtype = _common_number_dtype(data_list, key)
    else:
        return list(data_list)
    alike = _all_alike(data_list)
    try:
        if alike and type(data) is not float:
            out = _asarray(data_list, dtype, widen)
        elif alike:
            # a Python float beyond float32 becomes inf, which is found below and refused:
            # numpy's "overflow encountered in cast" before that error is not news
            with np.errstate(over="ignore"):
                out = _asarray(data_list, dtype, widen)
        else:
            # values of other types are checked below: numpy's warnings of their cast are not
            # news
            with np.errstate(over="ignore", invalid="ignore"):
                out = _asarray(data_list, dtype, widen)
    except (ValueError, TypeError, OverflowError) as e:
        shapes = [_shape_of(x) for x in data_list]
        seen = list(dict.fromkeys(shapes))
        first_bad = next((i for i, s in enumerate(shapes) if s != shapes[0]), None)
        if first_bad is None:       # one shape: a value numpy cannot convert to the dtype
            types = [type(x).__name__ for x in data_list]
            if widen and isinstance(e, OverflowError):     # beyond int64 too
                dtype = "int64"
            first_bad = next((i for i, x in enumerate(data_list) if not _converts(x, dtype)), 0)
            value = data_list[first_bad]
            what = f"{value!r:.60}" if isinstance(e, OverflowError) else f"a {types[first_bad]}"
            raise ValueError(
                f"BatchData: cannot batch component {key!r} as {np.dtype(dtype)}: datapoint "
                f"{first_bad} has {what}. Types in the batch: {types}. "
                f"({type(e).__name__}: {e})") from e
        raise ValueError(
            f"BatchData: cannot batch component {key!r}: its values are not of one "
            f"consistent shape (first mismatch at datapoint {first_bad}). Shapes seen: {seen}; "
            f"all shapes in the batch: {shapes}. ({type(e).__name__}: {e})") from e
    if alike:
        # Python floats beyond float32 became inf (numpy warned of it). The sum of squares is
        # finite when every value is (0.5 us against 1.7 for np.isfinite(out).all() on 32); one
        # that overflows only costs the full check.
        if type(data) is float and not math.isfinite(out.dot(out)):
            _check_unchanged(out, data_list, key)
    elif out.dtype.kind in "iufUS":
        _check_unchanged(out, data_list, key)
    return out


def _asarray(data_list, dtype, widen):
    try:
        return np.asarray(data_list, dtype=dtype)
    except OverflowError:           # a Python int beyond int32
        if not widen:
            raise
        return np.asarray(data_list, dtype="int64")


def _all_alike(data_list):
    """Whether every value has the first one's type (and, for arrays, dtype; a numpy scalar's
    type is its dtype)."""
    cls = data_list[0].__class__
    for x in data_list:
        if x.__class__ is not cls:
            return False
    if cls is np.ndarray:
        d = data_list[0].dtype
        for x in data_list:
            if x.dtype is not d and x.dtype != d:
                return False
    return True


def _check_unchanged(out, data_list, key):
    """``ValueError`` for a value that the batch's dtype (the first value's, tensorpack's rule)
    changed rather than stored: a fractional or out-of-range number in an integer batch (1 then
    2.5 made [1, 2]; 300 in a uint8 batch became 44), a finite number that overflowed a float
    batch to inf. (A float64 rounded to float32 is stored, as numpy does.)"""
    if out.dtype.kind in "US":
        _check_strings(out, data_list, key)
        return
    for i, x in enumerate(data_list):
        value = np.asarray(x)
        if value.dtype.kind not in "biuf":
            continue
        stored = out[i]
        if out.dtype.kind in "iu":
            changed = stored.astype(value.dtype) != value
        else:
            changed = np.isinf(stored) & np.isfinite(value)
        if np.any(changed):
            j = int(np.flatnonzero(changed)[0])
            raise ValueError(
                f"BatchData: cannot batch component {key!r} as {out.dtype}, the dtype its first "
                f"value gives it (tensorpack's rule): datapoint {i} has "
                f"{value.flat[j].item()!r}, which {out.dtype} would store as "
                f"{stored.flat[j].item()!r}. "
                f"{_one_type_hint(data_list[0], x, i)}, or convert them in the map function.")


def _check_strings(out, data_list, key):
    """``ValueError`` for a value of a string batch that is no string: numpy stores ``None`` as
    'None' and 5 as '5' (as tensorpack did)."""
    for i, x in enumerate(data_list):
        if isinstance(x, (str, bytes)) or _dtype_of(x).kind in "US":
            continue
        raise ValueError(
            f"BatchData: cannot batch component {key!r} as strings (its first value is one): "
            f"datapoint {i} has {x!r:.60} ({type(x).__name__}), which would be stored as "
            f"{out[i].tolist()!r:.60}. Give the component's values one type, or convert them "
            f"in the map function.")


def _one_type_hint(first, x, i):
    if isinstance(first, (np.ndarray, np.generic)) or isinstance(x, (np.ndarray, np.generic)):
        def what(v):
            return v.dtype if isinstance(v, (np.ndarray, np.generic)) else \
                f"a Python {type(v).__name__}"
        return (f"Give the component's values one dtype (the first is {what(first)}, "
                f"datapoint {i}'s {what(x)})")
    return f"Give the component's values one type (make the first one a {type(x).__name__} too)"


def _dtype_of(x):
    if isinstance(x, (np.ndarray, np.generic)):
        return x.dtype
    try:
        return np.asarray(x).dtype
    except (ValueError, TypeError):     # a ragged list
        return np.dtype(object)


def _is_bool(x):
    return type(x) is bool or _dtype_of(x).kind == "b"


def _common_number_dtype(data_list, key):
    """The dtype numpy promotes a component of booleans and numbers to; ``ValueError`` naming
    the first datapoint that is no number (nor an array or list of numbers)."""
    for i, x in enumerate(data_list):
        dtype = _dtype_of(x)
        if dtype.kind not in "biufc":
            raise ValueError(
                f"BatchData: cannot batch component {key!r}: its first value is boolean and "
                f"datapoint {i} has {_describe(x, dtype)}, which is neither boolean nor a "
                f"number. Types in the batch: "
                f"{[type(v).__name__ for v in data_list]}.")
    # Python scalars as themselves: numpy promotes them as weak (2.5 keeps float32 arrays)
    return np.result_type(*[x if type(x) in (bool, int, float, complex) else _dtype_of(x)
                            for x in data_list])


def _describe(x, dtype):
    if isinstance(x, (np.ndarray, np.generic, list, tuple)):
        return f"a {type(x).__name__} of dtype {dtype}"
    return f"a {type(x).__name__}"


def _converts(value, dtype):
    try:
        np.asarray(value, dtype=dtype)
        return True
    except (ValueError, TypeError, OverflowError):
        return False


def aggregate_batch(data_holder, use_list=False):
    """Aggregate a list of datapoints (lists/tuples, or dicts) into one batched datapoint.

    Returns a list (for list/tuple datapoints) or a dict (keys of the first datapoint) whose
    entries are lists (``use_list=True``) or numpy batches (see :func:`batch_numpy`).
    """
    first_dp = data_holder[0]
    if isinstance(first_dp, (list, tuple)):
        n = len(first_dp)
        for i, dp in enumerate(data_holder):
            if not isinstance(dp, (list, tuple)) or len(dp) != n:
                _structure_error(i, dp, first_dp)
        result = []
        for k in range(n):
            data_list = [x[k] for x in data_holder]
            result.append(data_list if use_list else batch_numpy(data_list, k))
    elif isinstance(first_dp, dict):
        keys = first_dp.keys()
        for i, dp in enumerate(data_holder):
            if not isinstance(dp, dict) or dp.keys() != keys:
                _structure_error(i, dp, first_dp)
        result = {}
        for key in keys:
            data_list = [x[key] for x in data_holder]
            result[key] = data_list if use_list else batch_numpy(data_list, key)
    else:
        raise ValueError(f"Datapoint has to be a list, tuple or dict. Got {type(first_dp)}")
    return result


def _structure_error(i, dp, first):
    """A datapoint of another structure than the batch's first: tensorpack sized the batch
    from the first one, so extra components were dropped silently and missing ones raised a
    bare IndexError or KeyError."""
    raise ValueError(f"BatchData: datapoint {i} of the batch has {_structure(dp)}, datapoint 0 "
                     f"has {_structure(first)}: every datapoint of a batch needs the same "
                     "structure")


def _structure(dp):
    if isinstance(dp, dict):
        return "the keys [" + ", ".join(sorted(map(repr, dp.keys()))) + "]"
    if isinstance(dp, (list, tuple)):
        return f"{len(dp)} component" + ("" if len(dp) == 1 else "s")
    return f"type {type(dp).__name__}"
