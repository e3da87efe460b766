"""The value codec of tensorpack's files and frames: how one datapoint becomes bytes.

API (what the format modules and the remote dataflows use)::

    dumps(obj, format="msgpack") -> bytes
    Encoder(format="msgpack")(obj) -> buffer     # the same bytes, for writers' loops
    loads(buf, *, allow_pickle=True, where=None) -> object
    sniff(buf) -> "msgpack" | "pickle"
    PickleRefusedError, DecodeError            # both subclasses of ValueError
    FORMATS == ("msgpack", "pickle")

* ``format="msgpack"`` writes exactly what msgpack-numpy writes (``msgpack.packb(obj,
  use_bin_type=True)`` with its ``encode`` hook), which tensorpack 0.11 reads with
  ``TENSORPACK_SERIALIZE=msgpack``: an array is the map ``{b'nd': True, b'type': dtype.str,
  b'kind': b'', b'shape': [...], b'data': <raw C-order bytes>}`` (structured dtypes: ``type`` is
  ``dtype.descr`` and ``kind`` ``b'V'``; object arrays: ``kind`` ``b'O'`` and ``data`` a pickle),
  a numpy scalar ``{b'nd': False, b'type': ..., b'data': ...}``, a ``complex`` ``{b'complex':
  True, b'data': repr(c)}``. Tuples come back as lists; ``np.float64`` and ``np.str_`` are
  written as plain ``float``/``str`` (msgpack sees their base class).
* ``format="pickle"`` writes ``pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)``, what
  tensorpack 0.11 writes and reads by default.

:func:`loads` tells the two apart from the bytes (nothing records the format): a pickle of
protocol 2 to 5 starts with ``0x80, <protocol>``; a msgpack value starting with ``0x80`` (an
empty map) is that one byte long. With ``allow_pickle=False`` a pickle (also the pickle inside
a msgpack object array) raises :class:`PickleRefusedError` naming ``where`` (a file and record,
an endpoint) and the option: unpickling runs whatever code the bytes name.

Arrays decoded from msgpack are read-only, as tensorpack's msgpack path gives them. When ``buf``
is at least :data:`ZERO_COPY_MIN` bytes long they are views into ``buf`` (no copy of the array
bytes; the array keeps ``buf`` alive), except where the array bytes are not aligned for the
dtype: those are copied, so every decoded array is aligned. Smaller values are decoded by
msgpack's C unpacker, which copies (cheaper than a Python walk for small values).

Errors: a value that cannot be decoded raises :class:`DecodeError` naming ``where`` and the
cause; an object that cannot be encoded raises ``TypeError`` naming its type.
"""
import functools
import pickle
import re
import struct

import numpy as np

from .._helpers import check_flag
from .. import _msgpack as msgpack   # msgpack's own classes, even after msgpack_numpy.patch()

__all__ = ["FORMATS", "ZERO_COPY_MIN", "dumps", "loads", "sniff", "DecodeError",
           "PickleRefusedError"]

FORMATS = ("msgpack", "pickle")

ZERO_COPY_MIN = 16 * 1024
"""Values of at least this many bytes are decoded by a walk that leaves array bytes in place."""


class DecodeError(ValueError):
    """A value that is neither valid msgpack(-numpy) nor a pickle, or does not decode."""


class PickleRefusedError(ValueError):
    """A pickle value met with ``allow_pickle=False``."""


# -- encoding ------------------------------------------------------------------------------------

def _encode_default(obj):
    """msgpack's ``default`` hook: the msgpack-numpy layout for arrays, numpy scalars, complex."""
    if isinstance(obj, np.ndarray):
        dtype = obj.dtype
        kind = dtype.kind
        if kind != "V" and kind != "O":          # the common case first
            return {b"nd": True, b"type": dtype.str, b"kind": b"", b"shape": obj.shape,
                    b"data": _raw(obj)}
        if kind == "V":
            return {b"nd": True, b"type": obj.dtype.descr, b"kind": b"V",
                    b"shape": obj.shape, b"data": _raw(obj)}
        if kind == "O":
            return {b"nd": True, b"type": obj.dtype.descr, b"kind": b"O",
                b"shape": obj.shape, b"data": obj.dumps()}
    if isinstance(obj, (np.bool_, np.number)):
        return {b"nd": False, b"type": obj.dtype.str, b"data": obj.tobytes()}
    if isinstance(obj, complex):
        return {b"complex": True, b"data": repr(obj)}
    if isinstance(obj, int):        # msgpack hands on the ints it cannot hold
        what = obj if obj.bit_length() <= 256 else f"of {obj.bit_length()} bits"
        raise TypeError(f"cannot encode the int {what} as msgpack: it holds integers from "
                        "-2**63 to 2**64 - 1")
    raise TypeError(f"cannot encode an object of type {type(obj).__module__}."
                    f"{type(obj).__qualname__} as msgpack")


def _raw(arr):
    """The C-order bytes of ``arr``: a view when it is contiguous, else a copy."""
    try:
        data = arr.data
    except ValueError:      # no buffer format for the dtype (datetime64): the same bytes as uint8
        return arr.reshape(-1).view(np.uint8).data if arr.flags.c_contiguous else arr.tobytes()
    return data if data.c_contiguous else arr.tobytes()


_SPLICE_MIN = 16 * 1024
_POOLED_MAX = 1 << 20       # a packer that made a longer value is dropped, not kept with its buffer
_PACKERS = []               # idle packers (autoreset): list.pop/append are atomic, so any thread
                            # takes one of its own, and a nested dumps() takes another


def _msgpack_dumps(obj):
    if type(obj) in (list, tuple):
        for c in obj:
            if type(c) is np.ndarray and c.nbytes >= _SPLICE_MIN:
                return _spliced(obj)
    pool = _PACKERS
    packer = pool.pop() if pool else msgpack.Packer(use_bin_type=True, default=_encode_default)
    out = packer.pack(obj)          # on an error the packer resets itself, and is dropped here
    if len(out) <= _POOLED_MAX:
        pool.append(packer)
    return out


def _spliced(seq):
    """The same bytes as ``packb(seq)`` for a list with large arrays at its top level, with each
    array's bytes copied once into the result (msgpack's packer copies them again and again
    while it grows its buffer)."""
    pack = msgpack.Packer(use_bin_type=True, default=_encode_default).pack
    chunks = [_array_header(len(seq))]
    for c in seq:
        if type(c) is np.ndarray and c.nbytes >= _SPLICE_MIN and c.dtype.kind not in "VO":
            # the map with an empty data bin (c4 00 last), then the real bin header and data
            head = pack({b"nd": True, b"type": c.dtype.str, b"kind": b"", b"shape": c.shape,
                         b"data": b""})
            chunks.append(head[:-2])
            chunks.append(_bin_header(c.nbytes))
            chunks.append(_raw(c))
        else:
            chunks.append(pack(c))
    return b"".join(chunks)


def _array_header(n):
    if n < 16:
        return bytes([0x90 | n])
    return b"\xdc" + struct.pack(">H", n) if n < 1 << 16 else b"\xdd" + struct.pack(">I", n)


def _bin_header(n):
    if n < 1 << 8:
        return b"\xc4" + bytes([n])
    if n < 1 << 16:
        return b"\xc5" + struct.pack(">H", n)
    if n < 1 << 32:
        return b"\xc6" + struct.pack(">I", n)
    raise ValueError(f"an array of {n} bytes is too large for msgpack (at most 2**32 - 1)")


def dumps(obj, format="msgpack"):
    """Encode ``obj`` as ``format`` ("msgpack" or "pickle"); see the module doc. Raises
    ``TypeError`` for an object the format cannot hold."""
    if format == "msgpack":
        return _msgpack_dumps(obj)
    if format == "pickle":
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    raise ValueError(f"unknown format {format!r}: expected one of {FORMATS}")


class Encoder:
    """One writer's encoder: ``encoder(obj)`` gives the bytes of ``dumps(obj, format)`` as a
    read-only buffer, valid until the next call or ``release()``. msgpack values are packed
    into one buffer reused from value to value (a fresh buffer per value costs page faults: for
    150 KB arrays, more than the copy itself), so a writer that copies the value at once (an
    LMDB put, a ZeroMQ send with copy) pays one copy of the array bytes and no allocation."""

    def __init__(self, format="msgpack"):
        if format not in FORMATS:
            raise ValueError(f"unknown format {format!r}: expected one of {FORMATS}")
        self.format = format
        self._packer = (msgpack.Packer(use_bin_type=True, autoreset=False,
                                       default=_encode_default)
                        if format == "msgpack" else None)
        self._view = None

    def __call__(self, obj):
        if self._packer is None:
            return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        self.release()
        self._packer.pack(obj)          # on an error the packer resets itself
        self._view = self._packer.getbuffer()
        return self._view

    def release(self):
        """End the validity of the last buffer (the packer's memory is kept for the next)."""
        if self._view is not None:
            self._view.release()
            self._view = None
            self._packer.reset()


# -- decoding ------------------------------------------------------------------------------------

def sniff(buf):
    """ "pickle" if ``buf`` starts like a pickle of protocol 2..5, else "msgpack"."""
    return "pickle" if len(buf) >= 2 and buf[0] == 0x80 and 2 <= buf[1] <= 5 else "msgpack"


def _where(where):
    return f"{where}: " if where else ""


def _refuse(where, what="the value is a pickle"):
    raise PickleRefusedError(
        f"{_where(where)}{what}, and loading a pickle runs whatever code its bytes name; "
        "refused because allow_pickle=False. Pass allow_pickle=True only for data from a "
        "source you trust.")


def loads(buf, *, allow_pickle=True, where=None):
    """Decode one value written by :func:`dumps` (or by tensorpack 0.11 with either encoding).

    Args:
        buf: a bytes-like object (bytes, memoryview, mmap slice, zmq frame buffer).
        allow_pickle (bool): accept pickle values (and object arrays inside msgpack).
        where (str): names the value in errors, e.g. "file /x.lmdb, record b'00000003'".
    """
    if allow_pickle.__class__ is not bool:      # (no call for a bool: one per record read)
        allow_pickle = check_flag("allow_pickle", allow_pickle)    # "False" would be true
    try:
        kind = sniff(buf)
    except TypeError:                           # no len() or no bytes: not a buffer
        raise TypeError(f"{_where(where)}codec.loads needs a bytes-like object (bytes, "
                        f"memoryview, mmap slice), got {type(buf).__name__}") from None
    if kind == "pickle":
        if not allow_pickle:
            _refuse(where)
        try:
            return pickle.loads(buf)
        except Exception as e:
            raise DecodeError(f"{_where(where)}the value looks like a pickle but does not "
                              f"unpickle: {type(e).__name__}: {e}") from e
    try:
        if len(buf) >= ZERO_COPY_MIN:
            mv = _bytes_view(buf)
            v = _flat_list(mv)
            return v if v is not None else _Walker(mv, allow_pickle, where).value()
        return msgpack.unpackb(buf, raw=False, strict_map_key=False,
                               object_hook=_HOOKS[bool(allow_pickle)] if where is None
                               else _Hook(allow_pickle, where))
    except PickleRefusedError:
        raise
    except DecodeError:
        raise
    except Exception as e:
        raise DecodeError(f"{_where(where)}the value is neither a pickle nor valid "
                          f"msgpack(-numpy): {type(e).__name__}: {e}") from e


def _descr(t):
    """msgpack-numpy's structured ``type`` (descr as nested lists) back to a numpy dtype."""
    def field(f):
        f = list(f)
        if isinstance(f[1], list):
            f[1] = [field(x) for x in f[1]]
        if len(f) > 2:
            f[2] = tuple(f[2])
        return tuple(f)
    return np.dtype([field(x) for x in t])


def _get(d, key):
    v = d.get(key.encode(), _MISSING)
    return d[key] if v is _MISSING else v


# The key sets of msgpack-numpy's records, by the value of "nd": an array (with "kind" since
# msgpack-numpy 0.4), a numpy scalar.
_ND_KEYS = {True: ({"nd", "type", "kind", "shape", "data"}, {"nd", "type", "shape", "data"}),
            False: ({"nd", "type", "data"},)}


def _is_array_record(d):
    """Whether map ``d`` is msgpack-numpy's record of an array or a numpy scalar: ``nd`` True or
    False and exactly its record's keys, as bytes (how msgpack-numpy writes them) or as str
    (older writers). Any other map with an ``nd`` key is a user's map, as msgpack-numpy reads
    it (``{"nd": 3}`` stays a dict)."""
    nd = d[b"nd"] if b"nd" in d else d.get("nd")
    keys = {k.decode() if isinstance(k, bytes) else k for k in d}
    return type(nd) is bool and keys in _ND_KEYS[nd]


def _is_complex_record(d):
    """Whether map ``d`` is msgpack-numpy's record of a Python complex (bytes keys)."""
    return len(d) == 2 and d.get(b"complex") is True and isinstance(d.get(b"data"), (str, bytes))


_MISSING = object()


def _str_of(data):
    return data.decode() if isinstance(data, bytes) else data


class _DtypeCache(dict):
    """``dtype.str`` -> dtype, filled on first use (``np.dtype(str)`` costs more than a lookup)."""

    def __missing__(self, key):
        if not isinstance(key, str) or len(self) > 1024:
            return None
        dtype = self[key] = np.dtype(key)
        return dtype


_DTYPES = _DtypeCache()


class _DtypeCacheB(dict):
    """The same keyed by the ASCII bytes of ``dtype.str`` (None for what is not a dtype)."""

    def __missing__(self, key):
        if len(self) > 1024:
            return None
        try:
            dtype = np.dtype(key.decode("ascii"))
        except (TypeError, ValueError, UnicodeDecodeError):
            dtype = None
        self[key] = dtype
        return dtype


_DTYPES_B = _DtypeCacheB()
# The map of an array of a plain dtype as msgpack-numpy writes it, in one match: groups are the
# fixstr byte and text of ``type`` (a short dtype.str such as "<f4"; others take the long way),
# the fixarray byte and the items of ``shape`` (msgpack uints; each item's first byte tells its
# length, so the match cannot end early), and the length of the ``data`` bin.
_PLAIN_ARRAY = re.compile(
    rb"\x85\xc4\x02nd\xc3\xc4\x04type([\xa1-\xa6])([<>|=][a-zA-Z][0-9]{1,4})"
    rb"\xc4\x04kind\xc4\x00\xc4\x05shape([\x90-\x9f])"
    rb"((?:[\x00-\x7f]|\xcc.|\xcd..|\xce....|\xcf........)*?)"
    rb"\xc4\x04data(?:\xc4(.)|\xc5(..)|\xc6(....))", re.S)
_UINT_WIDTH = {0xcc: 1, 0xcd: 2, 0xce: 4, 0xcf: 8}


def _dims(b):
    """The ints of a run of msgpack uints."""
    out, i = [], 0
    while i < len(b):
        w = _UINT_WIDTH.get(b[i], 0)
        out.append(b[i] if w == 0 else int.from_bytes(b[i + 1:i + 1 + w], "big"))
        i += 1 + w
    return out


def _array(d, data, allow_pickle, where, copy_unaligned):
    """The ndarray or numpy scalar described by map ``d`` whose ``data`` is ``data``."""
    if not _get(d, "nd"):
        dtype = np.dtype(_get(d, "type"))
        return np.frombuffer(data, dtype=dtype, count=1)[0]
    kind = _get(d, "kind")
    shape = tuple(_get(d, "shape"))
    if kind == b"O" or kind == "O":
        if not allow_pickle:
            _refuse(where, "the value holds an object array, which msgpack-numpy stores as "
                           "a pickle")
        return pickle.loads(bytes(data))
    dtype = _descr(_get(d, "type")) if kind in (b"V", "V") else np.dtype(_get(d, "type"))
    count = 1
    for s in shape:
        count *= s
    if count * dtype.itemsize != len(data):
        raise DecodeError(f"{_where(where)}array of shape {shape} and dtype {dtype} needs "
                          f"{count * dtype.itemsize} bytes, the record holds {len(data)}")
    arr = np.frombuffer(data, dtype=dtype, count=count)
    if copy_unaligned and not arr.flags.aligned:
        arr = arr.copy()
    arr.flags.writeable = False
    return arr.reshape(shape)


def _Hook(allow_pickle, where):
    """An ``object_hook`` for msgpack's C unpacker (small values: the array bytes are copies).
    A closure, not an object with ``__call__``: msgpack calls it for every map."""
    dtypes, frombuffer = _DTYPES, np.frombuffer

    def hook(d):
        # the common case first: an array of a plain dtype, as msgpack-numpy writes it
        if len(d) == 5 and d.get(b"kind") == b"" and d.get(b"nd") is True:
            dtype = dtypes[d[b"type"]]
            if dtype is not None:
                shape = d[b"shape"]
                arr = frombuffer(d[b"data"], dtype)
                if len(shape) == 1 and len(arr) == shape[0]:
                    return arr
                return arr.reshape(shape)
        if (b"nd" in d or "nd" in d) and _is_array_record(d):
            return _array(d, _get(d, "data"), allow_pickle, where, False)
        if b"complex" in d and _is_complex_record(d):
            return complex(_str_of(d[b"data"]))
        return d
    return hook


_HOOKS = {True: _Hook(True, None), False: _Hook(False, None)}


class SmallBatch:
    """Decodes many small msgpack values (each known to be msgpack and under
    :data:`ZERO_COPY_MIN` bytes) at once, for readers of files of small records: values of one
    layout column by column with numpy (:func:`_same_layout`), others with one C unpacker.

    ``add(buf)`` queues a value (the buffer must stay valid until ``decode``); ``decode()``
    returns the queued values decoded, in order, and empties the queue; ``decode_list(bufs)``
    decodes a list the caller queued itself. Each value must end exactly where the next one
    starts (checked), so a damaged value cannot borrow bytes of its neighbour. On any failure
    decoding raises :class:`BatchError` with the index of the first value that does not decode
    on its own, and the values before it.
    """

    def __init__(self, allow_pickle, size=256):
        self.size = size
        self._hook = _HOOKS[bool(allow_pickle)]
        self._one = small_msgpack_loads(allow_pickle)
        self._bufs = []

    def __len__(self):
        return len(self._bufs)

    def add(self, buf):
        """Queue ``buf``; True when the batch is full."""
        self._bufs.append(buf)
        return len(self._bufs) >= self.size

    def decode(self):
        bufs, self._bufs = self._bufs, []
        return self.decode_list(bufs)

    def decode_list(self, bufs):
        try:
            out = same_layout(bufs)
            if out is not None:
                return out
            joined = b"".join(bufs)
            total = len(joined)
            up = msgpack.Unpacker(None, raw=False, strict_map_key=False,
                                  object_hook=self._hook, max_buffer_size=total)
            up.feed(joined)
            out, unpack, tell = [], up.unpack, up.tell
            end = 0
            for buf in bufs:
                out.append(unpack())
                end += len(buf)
                if tell() != end:
                    raise ValueError("a value does not end where the next one starts")
            return out
        except Exception:
            pass
        done = []
        for i, buf in enumerate(bufs):          # find the culprit, one value at a time
            try:
                done.append(self._one(buf))
            except Exception as e:
                raise BatchError(i, done, e) from None
        raise BatchError(len(bufs), done, ValueError("values run into each other"))


_SAME_LAYOUT_MAX = 256 * 1024     # bytes of a batch decoded column by column (its arrays share it)
_BE_INTS = {0xcc: ">u1", 0xcd: ">u2", 0xce: ">u4", 0xcf: ">u8", 0xd0: ">i1", 0xd1: ">i2",
            0xd2: ">i4", 0xd3: ">i8", 0xca: ">f4", 0xcb: ">f8"}


def _layout(row):
    """Where the items of a flat datapoint are in its bytes ``row`` (a short list of plain
    arrays of at least one dimension, ints and floats): a list of ``("fix", offset)`` (a
    positive fixint: the byte is the value), ``("num", offset, big-endian dtype)`` (the value
    after a type byte) and ``("arr", offset, dtype, shape, nbytes)``; None for anything else."""
    first = row[0]
    if not 0x91 <= first <= 0x9f:
        return None
    items, p, n = [], 1, len(row)
    for _ in range(first - 0x90):
        if p >= n:
            return None
        b = row[p]
        if b <= 0x7f:
            items.append(("fix", p))
            p += 1
        elif b in _BE_INTS:
            dt = np.dtype(_BE_INTS[b])
            items.append(("num", p + 1, dt))
            p += 1 + dt.itemsize
        elif b == 0x85:
            mo = _PLAIN_ARRAY.match(row, p)
            if mo is None:
                return None
            tlen, tstr, nd, dims, b8, b16, b32 = mo.groups()
            dtype = _DTYPES_B[tstr]
            shape = tuple(_dims(dims))
            size = int.from_bytes(b8 or b16 or b32, "big")
            count = 1
            for c in shape:
                count *= c
            if dtype is None or tlen[0] - 0xa0 != len(tstr) or len(shape) != nd[0] - 0x90 \
                    or not shape or count * dtype.itemsize != size:
                return None
            items.append(("arr", mo.end(), dtype, shape, size))
            p = mo.end() + size
        else:
            return None
    return items if p == n else None


def same_layout(bufs):
    """The values of ``bufs`` (a list of buffers) decoded column by column when they are small
    msgpack datapoints of one layout (:func:`_same_layout`), else None; then decode them
    another way (:class:`SmallBatch`), which also names a bad one. A reader can try this on a
    run of raw values before looking at any of them one by one: a pickle, a large value or
    anything else not of one flat layout gives None."""
    if len(bufs) < 2 or len(set(map(len, bufs))) != 1 or \
            len(bufs[0]) * len(bufs) > _SAME_LAYOUT_MAX or len(bufs[0]) >= ZERO_COPY_MIN:
        return None
    return _same_layout(b"".join(bufs), len(bufs))


def _same_layout(joined, m):
    """The ``m`` values of ``joined`` (each ``len(joined) // m`` bytes) decoded column by column
    when they are flat datapoints of one layout (:func:`_layout` of the first, and every other
    value equal to it outside the numbers and array data): what msgpack's unpacker gives, with
    each array a read-only row of one block per column. None when that does not hold."""
    rows = np.frombuffer(joined, np.uint8).reshape(m, -1)
    items = _layout(joined[:rows.shape[1]])
    if items is None:
        return None
    fixed = np.ones(rows.shape[1], bool)        # the bytes every value must share
    columns = []
    for item in items:
        if item[0] == "fix":
            col = rows[:, item[1]]
            if col.max() > 0x7f:
                return None
            fixed[item[1]] = False
            columns.append(col.tolist())
        elif item[0] == "num":
            off, dt = item[1], item[2]
            fixed[off:off + dt.itemsize] = False
            columns.append(rows[:, off:off + dt.itemsize].copy().view(dt).ravel().tolist())
        else:
            off, dtype, shape, size = item[1:]
            fixed[off:off + size] = False
            block = rows[:, off:off + size].copy().view(dtype).reshape((m,) + shape)
            block.flags.writeable = False
            columns.append(list(block))
    keep = rows[:, fixed]
    if not (keep == keep[0]).all():
        return None
    return list(map(list, zip(*columns)))


class BatchError(Exception):
    """Raised by :meth:`SmallBatch.decode`: ``index`` of the first value that does not decode,
    ``done`` the values before it, ``error`` the cause."""

    def __init__(self, index, done, error):
        super().__init__(f"value {index}: {type(error).__name__}: {error}")
        self.index, self.done, self.error = index, done, error


def small_msgpack_loads(allow_pickle):
    """``loads`` for a value known to be msgpack and under :data:`ZERO_COPY_MIN` bytes, as one
    C call (for readers' inner loops). Errors are msgpack's or numpy's own, not DecodeError."""
    return functools.partial(msgpack.unpackb, raw=False, strict_map_key=False,
                             object_hook=_HOOKS[bool(allow_pickle)])


class _Span:
    """A bin value inside a map, kept as a slice of the buffer until the map is known."""
    __slots__ = ("view",)

    def __init__(self, view):
        self.view = view


_U16, _U32, _U64 = struct.Struct(">H"), struct.Struct(">I"), struct.Struct(">Q")
_I8, _I16, _I32, _I64 = (struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"),
                         struct.Struct(">q"))
_F32, _F64 = struct.Struct(">f"), struct.Struct(">d")


def _bytes_view(buf):
    """``buf`` as a 1-D memoryview of bytes."""
    if type(buf) is memoryview and buf.format == "B" and buf.ndim == 1:
        return buf
    return memoryview(buf).cast("B")


# the msgpack ints a flat datapoint holds besides arrays: first byte -> (struct, size)
_INTS = {0xcc: struct.Struct(">B"), 0xcd: _U16, 0xce: _U32, 0xcf: _U64, 0xd0: _I8,
         0xd1: _I16, 0xd2: _I32, 0xd3: _I64, 0xca: _F32, 0xcb: _F64}


_BIN_WIDTH = {0xc4: 1, 0xc5: 2, 0xc6: 4}     # msgpack bin 8/16/32: bytes of its length


def _flat_list(mv):
    """The common large datapoint in one loop: a list of at most 15 items, each an array of a
    plain dtype (as msgpack-numpy writes it), a byte string, an int or a float; the arrays are
    views of ``mv`` as :class:`_Walker` makes them, a byte string is ``bytes`` (a copy, as
    msgpack gives it). None for anything else, or anything wrong (the walker then decodes it,
    or names the error)."""
    n = len(mv)
    first = mv[0]
    if not 0x91 <= first <= 0x9f:
        return None
    out = []
    p = 1
    match, dtypes, ints, readonly = _PLAIN_ARRAY.match, _DTYPES_B, _INTS, mv.readonly
    for _ in range(first - 0x90):
        if p >= n:
            return None
        b = mv[p]
        if b <= 0x7f:
            out.append(b)
            p += 1
        elif b == 0x85:
            mo = match(mv, p, p + 256)
            if mo is None:
                return None
            tlen, tstr, nd, dims, b8, b16, b32 = mo.groups()
            ndim = nd[0] - 0x90
            dtype = dtypes[tstr]
            if dtype is None or tlen[0] - 0xa0 != len(tstr):
                return None
            if len(dims) == ndim and dims.isascii():    # every dimension < 128: one byte each
                shape = tuple(dims)
            elif ndim == 1:                         # one dimension, a uint of 1 to 8 bytes
                shape = (int.from_bytes(dims[1:], "big"),)
            else:
                shape = tuple(_dims(dims))
                if len(shape) != ndim:
                    return None
            size = int.from_bytes(b8 or b16 or b32, "big")
            start = mo.end()
            p = start + size
            count = 1
            for c in shape:
                count *= c
            if p > n or count * dtype.itemsize != size:
                return None
            arr = np.frombuffer(mv, dtype, count, start)
            if dtype.alignment > 1 and not arr.flags.aligned:
                arr = arr.copy()
                arr.flags.writeable = False
            elif not readonly:                      # never write into a writable buffer
                arr.flags.writeable = False
            out.append(arr if ndim == 1 else arr.reshape(shape))
        elif b in ints:
            st = ints[b]
            end = p + 1 + st.size
            if end > n:
                return None
            out.append(st.unpack_from(mv, p + 1)[0])
            p = end
        elif b in _BIN_WIDTH:                       # a byte string (an encoded image): bytes,
            w = _BIN_WIDTH[b]                       # as msgpack gives it (one copy)
            start = p + 1 + w
            end = start + int.from_bytes(mv[p + 1:start], "big")
            if end > n:
                return None
            out.append(mv[start:end].tobytes())
            p = end
        elif b >= 0xe0:
            out.append(b - 0x100)
            p += 1
        else:
            return None
    return out if p == n else None


def flat_list(buf):
    """For readers' inner loops: the datapoint in ``buf`` (a large msgpack value, not a pickle)
    when it is the common flat list :func:`loads` decodes in one loop, else None (then call
    :func:`loads`, which decodes anything and names errors)."""
    return _flat_list(_bytes_view(buf))


class _Walker:
    """A msgpack reader in Python for large values: the ``data`` of an array map becomes an
    ndarray over ``buf`` itself (read-only, no copy), everything else is decoded as msgpack's
    C unpacker would (``raw=False``)."""

    def __init__(self, buf, allow_pickle, where):
        self.mv = memoryview(buf).cast("B") if not isinstance(buf, memoryview) or \
            buf.format != "B" or buf.ndim != 1 else buf
        self.readonly = self.mv.readonly
        self.pos = 0
        self.allow_pickle = allow_pickle
        self.where = where

    def value(self):
        mv = self.mv
        first = mv[0] if len(mv) else 0
        if 0x91 <= first <= 0x9f:          # a datapoint: a short list; its items in one loop
            self.pos = 1
            v = []
            for _ in range(first - 0x90):
                p = self.pos
                b = mv[p] if p < len(mv) else -1
                if b == 0x85:
                    arr = self._plain_array(p)
                    if arr is not None:
                        v.append(arr)
                        continue
                elif 0 <= b <= 0x7f:            # a small int (a label)
                    self.pos = p + 1
                    v.append(b)
                    continue
                v.append(self._any(False))
        else:
            v = self._any(False)
        if self.pos != len(self.mv):
            raise DecodeError(f"{_where(self.where)}{len(self.mv) - self.pos} bytes of extra "
                              "data after the msgpack value")
        return v

    def _take(self, n):
        p = self.pos
        end = p + n
        if end > len(self.mv):
            raise DecodeError(f"{_where(self.where)}the msgpack value is truncated (needs "
                              f"{end} bytes, has {len(self.mv)})")
        self.pos = end
        return self.mv[p:end]

    def _unpack(self, st):
        return st.unpack(self._take(st.size))[0]

    def _any(self, in_map):
        p = self.pos
        if p < len(self.mv) and self.mv[p] == 0x85:
            arr = self._plain_array(p)
            if arr is not None:
                return arr
        b = self._take(1)[0]
        if b <= 0x7f:
            return b
        if b >= 0xe0:
            return b - 0x100
        if 0x90 <= b <= 0x9f:
            return self._list(b & 0x0f)
        if 0x80 <= b <= 0x8f:
            return self._map(b & 0x0f)
        if 0xa0 <= b <= 0xbf:
            return self._str(b & 0x1f)
        if b == 0xc0:
            return None
        if b == 0xc2:
            return False
        if b == 0xc3:
            return True
        if b in (0xc4, 0xc5, 0xc6):
            n = self._take(1)[0] if b == 0xc4 else self._unpack(_U16 if b == 0xc5 else _U32)
            view = self._take(n)
            return _Span(view) if in_map else bytes(view)
        if b == 0xca:
            return self._unpack(_F32)
        if b == 0xcb:
            return self._unpack(_F64)
        if b == 0xcc:
            return self._take(1)[0]
        if b == 0xcd:
            return self._unpack(_U16)
        if b == 0xce:
            return self._unpack(_U32)
        if b == 0xcf:
            return self._unpack(_U64)
        if b == 0xd0:
            return self._unpack(_I8)
        if b == 0xd1:
            return self._unpack(_I16)
        if b == 0xd2:
            return self._unpack(_I32)
        if b == 0xd3:
            return self._unpack(_I64)
        if b in (0xd9, 0xda, 0xdb):
            n = self._take(1)[0] if b == 0xd9 else self._unpack(_U16 if b == 0xda else _U32)
            return self._str(n)
        if b in (0xdc, 0xdd):
            return self._list(self._unpack(_U16 if b == 0xdc else _U32))
        if b in (0xde, 0xdf):
            return self._map(self._unpack(_U16 if b == 0xde else _U32))
        if 0xd4 <= b <= 0xd8 or b in (0xc7, 0xc8, 0xc9):
            return self._ext(b)
        raise DecodeError(f"{_where(self.where)}byte 0x{b:02x} at offset {self.pos - 1} "
                          "starts no msgpack value")

    def _plain_array(self, p):
        """The common case in one step: the map of an array of a plain dtype at ``p``, as
        msgpack-numpy writes it (:data:`_PLAIN_ARRAY`). None when it is not that."""
        mo = _PLAIN_ARRAY.match(self.mv, p, p + 256)    # bounded: the header is short
        if mo is None:
            return None
        tlen, tstr, nd, dims, b8, b16, b32 = mo.groups()
        ndim = nd[0] - 0x90
        if tlen[0] - 0xa0 != len(tstr):
            return None
        dtype = _DTYPES_B[tstr]
        if dtype is None:
            return None
        if len(dims) == ndim and dims.isascii():     # every dimension < 128: one byte each
            shape = list(dims)
        elif ndim == 1:                              # one dimension, a uint of 1 to 8 bytes
            shape = [int.from_bytes(dims[1:], "big")]
        else:
            shape = _dims(dims)
            if len(shape) != ndim:
                return None
        n = int.from_bytes(b8 or b16 or b32, "big")
        start = mo.end()
        end = start + n
        mv = self.mv
        if end > len(mv):
            raise DecodeError(f"{_where(self.where)}the msgpack value is truncated (needs "
                              f"{end} bytes, has {len(mv)})")
        if ndim == 1:
            count = shape[0]
        else:
            count = 1
            for c in shape:
                count *= c
        if count * dtype.itemsize != n:
            raise DecodeError(f"{_where(self.where)}array of shape {tuple(shape)} and dtype "
                              f"{dtype} needs {count * dtype.itemsize} bytes, the record "
                              f"holds {n}")
        arr = np.frombuffer(mv, dtype, count, start)
        if dtype.alignment > 1 and not arr.flags.aligned:
            arr = arr.copy()
            arr.flags.writeable = False
        elif not self.readonly:             # never write into a writable buffer
            arr.flags.writeable = False
        self.pos = end
        return arr if ndim == 1 else arr.reshape(shape)

    def _ext(self, b):
        if b >= 0xd4:
            n = 1 << (b - 0xd4)
        else:
            n = self._take(1)[0] if b == 0xc7 else self._unpack(_U16 if b == 0xc8 else _U32)
        code = self._unpack(_I8)
        data = bytes(self._take(n))
        if code == -1:
            return msgpack.Timestamp.from_bytes(data)
        return msgpack.ExtType(code, data)

    def _str(self, n):
        return str(self._take(n), "utf-8")

    def _list(self, n):
        return [self._any(False) for _ in range(n)]

    def _map(self, n):
        d = {}
        spans = False
        for _ in range(n):
            k = self._any(False)
            if isinstance(k, list):
                k = tuple(k)
            v = self._any(True)
            spans = spans or type(v) is _Span
            d[k] = v
        data = None
        if spans:
            for k, v in d.items():
                if type(v) is _Span:
                    if k == b"data" or k == "data":
                        data = v.view
                    d[k] = bytes(v.view) if len(v.view) < ZERO_COPY_MIN else v.view
        if (b"nd" in d or "nd" in d) and _is_array_record(d):
            return _array(d, data if data is not None else _get(d, "data"), self.allow_pickle,
                          self.where, True)
        for k, v in d.items():                  # a map that is not an array: bytes, not views
            if type(v) is memoryview:
                d[k] = bytes(v)
        if b"complex" in d and _is_complex_record(d):
            return complex(_str_of(d[b"data"]))
        return d


def pickle_hint(format):
    """What to add to a "cannot be encoded" error: msgpack carries numbers, strings, bytes,
    None, lists, dicts and numpy arrays and scalars; anything else needs pickle."""
    if format == "msgpack":
        return ("; msgpack stores numbers, strings, bytes, None, lists, dicts and numpy arrays: "
                "pass format='pickle' to store any picklable object (readers then need "
                "allow_pickle=True, the default of LMDBSerializer.load)")
    return ""
