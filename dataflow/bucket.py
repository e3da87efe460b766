"""Batch datapoints of similar length together: :class:`BucketBatchData`.

The semantics are those of MindSpore's ``Dataset.bucket_batch_by_length``, adapted to our
datapoints (lists/tuples or dicts of components) and to :class:`~dataflow.BatchData`'s way of
stacking components.
"""
import bisect
import numbers
from collections.abc import Mapping

import numpy as np

from . import checkpoint as _ckpt
from ._helpers import add_note, check_flag
from .base import ProxyDataFlow, UnknownLengthError
from .collate import batch_numpy

__all__ = ["BucketBatchData"]

_NAME = "BucketBatchData"


def _is_int(x):
    """A Python or numpy integer, but not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def _components(dp, index=None):
    """The component keys of a datapoint (number ``index`` of the pass, for the error): indices
    of a list/tuple, keys of a dict."""
    if isinstance(dp, (list, tuple)):
        return range(len(dp))
    if isinstance(dp, Mapping):
        return list(dp.keys())
    which = "a datapoint" if index is None else f"datapoint {index} of this pass"
    raise ValueError(f"{_NAME}: {which} is a {type(dp).__name__}; a datapoint has to be a "
                     "list, tuple or dict")


def default_element_length(dp):
    """The length of the first component of ``dp`` (``dp[0]``, or the first value of a dict).

    An array's length is ``shape[0]`` (0 for a 0-d array), a list's or tuple's is its ``len``,
    and a scalar (a Python or numpy number, a ``str`` or ``bytes``) has length 0.
    """
    keys = _components(dp)
    if len(keys) == 0:
        raise ValueError(f"{_NAME}: the datapoint has no component to take the length of")
    x = dp[keys[0]]
    if isinstance(x, (list, tuple)):
        return len(x)
    if isinstance(x, (numbers.Number, np.generic, str, bytes)):
        return 0
    shape = getattr(x, "shape", None)
    if isinstance(shape, tuple):
        return int(shape[0]) if shape else 0
    raise TypeError(f"{_NAME}: cannot take the length of component {keys[0]!r} of type "
                    f"{type(x).__name__}; pass an element_length_function")


class _Buckets:
    """The buckets ``[0, b0), [b0, b1), ..., [b_{k-1}, inf)`` and their batch sizes.

    Guarantees, once constructed: boundaries are strictly increasing positive ints, and there is
    exactly one positive int batch size per bucket (``len(boundaries) + 1`` of them).
    """

    def __init__(self, boundaries, batch_sizes):
        if not isinstance(boundaries, (list, tuple)):
            raise ValueError(f"{_NAME}: bucket_boundaries must be a list of ints, "
                             f"got {type(boundaries).__name__}")
        if not isinstance(batch_sizes, (list, tuple)):
            raise ValueError(f"{_NAME}: bucket_batch_sizes must be a list of ints, "
                             f"got {type(batch_sizes).__name__}")
        for i, b in enumerate(boundaries):
            if not _is_int(b) or b <= 0:
                raise ValueError(f"{_NAME}: bucket_boundaries must be positive ints; "
                                 f"bucket_boundaries[{i}] is {b!r}")
        for i in range(1, len(boundaries)):
            if boundaries[i] <= boundaries[i - 1]:
                raise ValueError(f"{_NAME}: bucket_boundaries must be strictly increasing; "
                                 f"bucket_boundaries[{i - 1}]={boundaries[i - 1]} and "
                                 f"bucket_boundaries[{i}]={boundaries[i]}")
        if len(batch_sizes) != len(boundaries) + 1:
            raise ValueError(f"{_NAME}: bucket_batch_sizes must have one entry per bucket, "
                             f"len(bucket_boundaries) + 1 = {len(boundaries) + 1}, "
                             f"got {len(batch_sizes)}")
        for i, s in enumerate(batch_sizes):
            if not _is_int(s) or s <= 0:
                raise ValueError(f"{_NAME}: bucket_batch_sizes must be positive ints; "
                                 f"bucket_batch_sizes[{i}] is {s!r}")
        self.boundaries = [int(b) for b in boundaries]
        self.batch_sizes = [int(s) for s in batch_sizes]

    def __len__(self):
        return len(self.batch_sizes)

    def index_of(self, length):
        """The bucket of ``length``: ``i`` such that ``b_{i-1} <= length < b_i``."""
        return bisect.bisect_right(self.boundaries, length)

    def is_last(self, index):
        """Whether bucket ``index`` is the unbounded one, ``[b_{k-1}, inf)``."""
        return index == len(self.boundaries)

    def upper_bound(self, index):
        """The exclusive upper bound of bounded bucket ``index``."""
        return self.boundaries[index]


class _PadSpec:
    """How to pad one component: a target shape (``None`` entries: the largest in the batch; the
    whole shape ``None``: every dimension) and a fill value (``None``: the dtype's zero, ``""``
    for strings).

    :meth:`pad` guarantees an array of shape ``(n,) + target`` with the values' common dtype
    (``np.result_type`` of the non-empty values, strings widened to hold the longest and the fill
    value), each value in the top-left corner and the fill value (cast to that dtype) elsewhere,
    or a ``ValueError`` naming the component.
    """

    def __init__(self, key, spec):
        if not isinstance(spec, (list, tuple)) or len(spec) != 2:
            raise ValueError(f"{_NAME}: pad_info[{key!r}] must be a pair (pad_shape, pad_value), "
                             f"got {spec!r}")
        shape, value = spec
        if shape is not None:
            if not isinstance(shape, (list, tuple)):
                raise ValueError(f"{_NAME}: pad_info[{key!r}]: pad_shape must be None or a "
                                 f"tuple/list of ints and Nones, got {shape!r}")
            for d in shape:
                if d is not None and (not _is_int(d) or d < 0):
                    raise ValueError(f"{_NAME}: pad_info[{key!r}]: pad_shape entries must be "
                                     f"None or non-negative ints, got {shape!r}")
            shape = tuple(None if d is None else int(d) for d in shape)
        self.key = key
        self.shape = shape
        self.value = value

    def _target(self, arrays, bound):
        key = self.key
        shapes = [a.shape for a in arrays]
        rank = len(shapes[0]) if self.shape is None else len(self.shape)
        if any(len(s) != rank for s in shapes):
            want = ("the same rank" if self.shape is None
                    else f"rank {rank} (pad_shape {self.shape})")
            raise ValueError(f"{_NAME}: cannot pad component {key!r}: its values must have {want}; "
                             f"shapes in the batch: {shapes}")
        if self.shape is not None:
            # as MindSpore: every None entry goes to the boundary when there is one
            return tuple((max(s[d] for s in shapes) if bound is None else bound)
                         if n is None else n for d, n in enumerate(self.shape))
        target = [max(s[d] for s in shapes) for d in range(rank)]
        if bound is not None:
            if rank == 0:
                raise ValueError(f"{_NAME}: cannot pad component {key!r} to the bucket "
                                 "boundary: its values are scalars (no dimension 0)")
            target[0] = bound
        return tuple(target)

    @property
    def to_boundary(self):
        """Whether ``pad_to_bucket_boundary`` changes this component's target: its pad_shape
        leaves some dimension to the batch."""
        return self.shape is None or None in self.shape

    def pad(self, values, bound=None, indices=None):
        """Pad and stack ``values`` (one per datapoint of the batch). ``bound``, if given, is the
        bucket's boundary minus 1: the size of each dimension that pad_shape leaves None, or of
        dimension 0 when pad_shape is None (the others: the largest in the batch). ``indices``
        are the datapoints' indices in the pass, for error messages."""
        key = self.key
        try:
            arrays = [np.asarray(v) for v in values]
        except ValueError as e:  # a ragged nested list, say
            raise ValueError(f"{_NAME}: cannot pad component {key!r}: a value is not an array "
                             f"of one shape ({e})") from e
        dtype = self._dtype(arrays, indices)
        target = self._target(arrays, bound)
        for j, a in enumerate(arrays):
            if any(s > t for s, t in zip(a.shape, target)):
                where = j if indices is None else indices[j]
                raise ValueError(f"{_NAME}: cannot pad component {key!r}: datapoint {where} has "
                                 f"shape {a.shape}, larger than the target shape {target}")
        try:
            fill = (np.zeros((), dtype) if self.value is None
                    else np.asarray(self.value, dtype=dtype))
        except (OverflowError, ValueError, TypeError) as e:
            raise ValueError(f"{_NAME}: cannot pad component {key!r}: pad_value {self.value!r} "
                             f"does not fit its dtype {dtype} ({e})") from e
        out = np.full((len(arrays),) + target, fill, dtype=dtype)
        for j, a in enumerate(arrays):
            out[(j,) + tuple(slice(0, s) for s in a.shape)] = a
        return out

    def _dtype(self, arrays, indices):
        """The dtype that holds every value of the batch and the fill value: an empty value
        (``[]`` is float64 to numpy) has no say unless all are empty."""
        dtypes = [a.dtype for a in arrays if a.size] or [a.dtype for a in arrays]
        fill = None if self.value is None else np.asarray(self.value)
        if fill is not None and fill.dtype.kind in "US" and dtypes[0].kind == fill.dtype.kind:
            dtypes.append(fill.dtype)           # a pad string longer than every value
        try:
            return np.result_type(*dtypes)
        except TypeError as e:
            where = "" if indices is None else f" (datapoints {list(indices)} of this pass)"
            raise ValueError(f"{_NAME}: cannot pad component {self.key!r}: its values have no "
                             f"common dtype{where}: {sorted(set(map(str, dtypes)))}") from e


class BucketBatchData(ProxyDataFlow):
    """Group datapoints into buckets by length and produce a batch whenever a bucket is full.

    With boundaries ``[b0, ..., b_{k-1}]`` there are ``k + 1`` buckets ``[0, b0), [b0, b1), ...,
    [b_{k-1}, inf)``; a datapoint of length exactly ``b_i`` goes to bucket ``i + 1``. Bucket ``i``
    produces a batch as soon as it holds ``bucket_batch_sizes[i]`` datapoints, so batches come in
    the order the buckets fill. At the end of each pass the non-empty buckets are produced as
    smaller batches, in bucket order, or dropped with ``drop_remainder=True``. Every pass starts
    with empty buckets, and each batch holds the datapoints of one bucket in arrival order.

    Components named in ``pad_info`` are padded (see :class:`_PadSpec`); the others are batched
    as :meth:`BatchData.aggregate_batch` does, except that, when ``pad_info`` is given, values of
    different shapes are padded to the largest in the batch with zeros (``""`` for strings), as
    MindSpore pads the columns its ``pad_info`` leaves out; without ``pad_info`` they raise a
    ``ValueError`` naming the component and the datapoints. The datapoints of a batch must have
    the same components (``ValueError`` naming the one that differs).

    With ``pad_to_bucket_boundary=True``, as MindSpore, each dimension that a component's
    pad_shape leaves None is padded to ``b_i - 1`` in a batch from bucket ``[b_{i-1}, b_i)``;
    a pad_shape of None (every dimension to the largest in the batch) pads dimension 0 so and
    the others to the largest in the batch (MindSpore would leave them all to the batch). A
    datapoint that falls in the last, unbounded bucket then raises ``ValueError``; where every
    pad_shape is given in full, no boundary is used and the last bucket is batched as usual.

    ``len()`` raises ``NotImplementedError``: the number of batches depends on the lengths.
    """

    def __init__(self, ds, bucket_boundaries, bucket_batch_sizes, element_length_function=None,
                 pad_info=None, pad_to_bucket_boundary=False, drop_remainder=False):
        """
        Args:
            ds (DataFlow): a dataflow of lists/tuples or dicts.
            bucket_boundaries (list[int]): strictly increasing positive ints.
            bucket_batch_sizes (list[int]): one positive batch size per bucket
                (``len(bucket_boundaries) + 1`` of them).
            element_length_function (datapoint -> int): the length of a datapoint; by default
                that of its first component (see :func:`default_element_length`).
            pad_info (dict): ``{component index or key: (pad_shape, pad_value)}``; ``pad_shape``
                None pads every dimension to the largest in the batch, a tuple gives the target
                shape (its None entries: the largest in the batch). ``pad_value`` (None: the
                dtype's zero, ``""`` for strings) is cast to the values' common dtype.
            pad_to_bucket_boundary (bool): pad the dimensions that the pad_shapes of
                ``pad_info`` leave None (dimension 0 where a pad_shape is None) to the bucket's
                upper boundary minus 1. Requires ``pad_info``.
            drop_remainder (bool): drop, instead of producing, the incomplete batches left in the
                buckets at the end of a pass.
        """
        super().__init__(ds)
        self.buckets = _Buckets(bucket_boundaries, bucket_batch_sizes)
        if element_length_function is not None and not callable(element_length_function):
            raise ValueError(f"{_NAME}: element_length_function must be callable, "
                             f"got {element_length_function!r}")
        self.element_length_function = element_length_function or default_element_length
        if pad_info is not None and not isinstance(pad_info, Mapping):
            raise ValueError(f"{_NAME}: pad_info must be None or a dict, "
                             f"got {type(pad_info).__name__}")
        self.pad_specs = {k: _PadSpec(k, v) for k, v in (pad_info or {}).items()}
        if pad_to_bucket_boundary and not self.pad_specs:
            raise ValueError(f"{_NAME}: pad_to_bucket_boundary=True needs pad_info naming the "
                             "components to pad")
        self.pad_to_bucket_boundary = check_flag(f"{_NAME}: pad_to_bucket_boundary",
                                                 pad_to_bucket_boundary)
        # whether a boundary is used: not when every pad_shape is fully given (as MindSpore)
        self._pads_to_boundary = self.pad_to_bucket_boundary and any(
            s.to_boundary for s in self.pad_specs.values())
        self.drop_remainder = check_flag(f"{_NAME}: drop_remainder", drop_remainder)

    def __len__(self):
        raise UnknownLengthError(f"{_NAME} does not know its length: the number of batches "
                                 "depends on the lengths of the datapoints")

    def _length(self, dp, index):
        try:
            length = self.element_length_function(dp)
        except Exception as e:
            add_note(e, f"{_NAME}: in element_length_function of datapoint {index} of this pass")
            raise
        if not _is_int(length):
            raise TypeError(f"{_NAME}: the length of datapoint {index} of this pass must be an "
                            f"int, got {length!r} ({type(length).__name__})")
        if length < 0:
            raise ValueError(f"{_NAME}: the length of datapoint {index} of this pass is "
                             f"{length}; it must be >= 0")
        return int(length)

    def _bucket_of(self, dp, index):
        """The bucket of datapoint number ``index`` of this pass, after checking it."""
        keys = _components(dp, index)
        for key in self.pad_specs:
            if key not in keys:
                raise ValueError(f"{_NAME}: pad_info names component {key!r}, which datapoint "
                                 f"{index} of this pass does not have (it has {list(keys)})")
        length = self._length(dp, index)
        b = self.buckets.index_of(length)
        if self._pads_to_boundary and self.buckets.is_last(b):
            raise ValueError(f"{_NAME}: datapoint {index} of this pass has length {length}, in "
                             f"the last bucket [{self.buckets.boundaries[-1]}, inf), which has "
                             "no boundary to pad to (pad_to_bucket_boundary=True)")
        return b

    def _batch(self, bucket, dps, indices):
        """One batch of the datapoints ``dps`` (``indices`` in the pass) of bucket ``bucket``."""
        bound = self.buckets.upper_bound(bucket) - 1 if self._pads_to_boundary else None
        first = dps[0]
        keys = _components(first, indices[0])
        for dp, index in zip(dps, indices):
            if set(_components(dp, index)) != set(keys):
                raise ValueError(f"{_NAME}: datapoint {index} of this pass has components "
                                 f"{list(_components(dp, index))}, datapoint {indices[0]} of the "
                                 f"same batch {list(keys)}")
        out = {} if isinstance(first, Mapping) else []
        for key in keys:
            values = [dp[key] for dp in dps]
            spec = self.pad_specs.get(key)
            if spec is not None:
                batched = spec.pad(values, bound, indices)
            else:
                try:
                    batched = batch_numpy(values, key)
                except ValueError as e:
                    if not self.pad_specs:
                        raise ValueError(f"{_NAME}: cannot batch component {key!r} of datapoints "
                                         f"{indices} of this pass without padding (give "
                                         f"pad_info): {e}") from e
                    # as MindSpore: with pad_info, the other components are padded too
                    batched = _PadSpec(key, (None, None)).pad(values, None, indices)
            if isinstance(out, dict):
                out[key] = batched
            else:
                out.append(batched)
        return out

    # Position: the index of the next input datapoint, the indices held in each bucket, the
    # input's position before each held one (a resume reads exactly those again, see
    # dataflow.checkpoint.refill) and, once the input has ended, the next bucket to flush.
    _resume = None
    _at = None                 # the running pass's bookkeeping (see __iter__)

    def __iter__(self):
        r, self._resume = self._resume, None
        nb = len(self.buckets)
        at = self._at = {"index": 0, "flush": None, "held": [[] for _ in range(nb)],
                         "keys": {}, "track": None}
        held = [[] for _ in range(nb)]
        if r is None:
            self.ds._abandon()          # a new pass of ds (see DataFlow._abandon)
        else:
            got = _ckpt.refill(self.ds, [tuple(k) for k in r["keys"]], r["src"])
            at["index"], at["flush"] = r["index"], r["flush"]
            at["held"] = [list(h) for h in r["held"]]
            at["keys"] = {k: p for k, p in r["keys"]}
            held = [[got[i] for i in h] for h in at["held"]]
        return self._one_pass(at, held)

    def _one_pass(self, at, held):
        held_indices, keys = at["held"], at["keys"]
        if at["flush"] is None:
            at["track"] = track = _trackable(self.ds)
            it = iter(self.ds)
            while True:
                key = self.ds._get_position() if track is True else None
                dp = next(it, _END)
                if dp is _END:
                    break
                index = at["index"]
                at["index"] = index + 1
                b = self._bucket_of(dp, index)
                held[b].append(dp)
                held_indices[b].append(index)
                keys[index] = key
                if len(held[b]) == self.buckets.batch_sizes[b]:
                    batch = self._batch(b, held[b], held_indices[b])
                    for i in held_indices[b]:
                        del keys[i]
                    held[b], held_indices[b] = [], []
                    yield batch
            at["flush"] = 0
        if not self.drop_remainder:
            for b in range(at["flush"], len(held)):
                if held[b]:
                    batch = self._batch(b, held[b], held_indices[b])
                    at["flush"] = b + 1
                    yield batch
        self._at = None

    def _get_position(self):
        if self._resume is not None:
            return self._resume
        at = self._at
        if at is None:                  # between passes
            return {"index": 0, "flush": None, "held": [[] for _ in range(len(self.buckets))],
                    "keys": [],
                    "src": self.ds._get_position()}
        if at["track"] is not None and at["track"] is not True:
            raise at["track"]
        flush = at["flush"]
        held = [h if flush is None or b >= flush else [] for b, h in enumerate(at["held"])]
        return {"index": at["index"], "flush": flush, "held": [list(h) for h in held],
                "keys": [[i, at["keys"][i]] for h in held for i in h],
                "src": self.ds._get_position()}

    def _set_position(self, position):
        self._resume = position
        self.ds._set_position(position["src"])

    def _abandon(self):
        self._resume = self._at = None
        self.ds._abandon()

    def _fingerprint_params(self):
        return {"boundaries": list(self.buckets.boundaries),
                "batch_sizes": list(self.buckets.batch_sizes),
                "drop_remainder": self.drop_remainder,
                "pad_to_bucket_boundary": self.pad_to_bucket_boundary}


_END = object()


def _trackable(df):
    return _ckpt.rereadable(df, "BucketBatchData")
