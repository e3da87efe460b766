"""Serialization of datapoints: the public codec and the wire format of the process transport.

``dumps(obj)`` encodes a datapoint into one message and ``loads(buf)`` decodes it again.
``dumps_oob``/``loads_oob`` are the same codec with large arrays kept out of band, so that a
transport can move their bytes by other means (for example through shared memory).

Values round-trip exactly, type included:

- ``None``, ``bool``, ``int`` of any size, ``float``, ``complex``, ``str`` and ``bytes``;
- ``list``, ``tuple`` and ``dict`` (keys may be any supported hashable value);
- numpy scalars (``np.float16(1.5)`` comes back as ``np.float16``);
- numpy arrays of boolean, integer, floating, complex, ``datetime64``, ``timedelta64``,
  fixed-width bytes (``S``), unicode (``U``) and raw void (``V``) dtypes, structured dtypes
  (kind ``V`` with fields, nested and padded ones included: the dtype's description travels with
  the raw bytes) with any shape, byte order and strides.  Dtype and shape are kept; an
  F-contiguous array comes back F-contiguous, any other array comes back C-contiguous.

Instances of subclasses of ``int``, ``float``, ``str``, ``bytes``, ``list``, ``tuple`` and
``dict`` (``IntEnum``, ``namedtuple``, ``OrderedDict``, ...) are encoded as their base type, or,
with ``allow_pickle=True`` (the process transport), pickled so that they come back as
themselves; those of ``numpy.ndarray`` (``memmap``, ``matrix``) are encoded as arrays;
``bytearray`` and ``memoryview`` come back as ``bytes``.

Anything else -- object arrays, masked arrays, sets, datetimes, fractions, dataclasses, custom
classes -- is carried by pickle only when the caller passes ``allow_pickle=True`` (the process
transport does, between a consumer and the workers it started, over private endpoints). The
decision is made per object, not per datapoint: in ``[big_array, {"meta": some_set}]`` only the
set is pickled and the array still travels out of band. Pickling uses protocol 5, so numpy arrays
inside a pickled object are out-of-band buffers like any other array; ``cloudpickle`` takes over
where pickle cannot (a class defined in ``__main__``, which a spawned process does not have).
Without ``allow_pickle`` such a value raises ``TypeError`` naming the type and where it was found,
for example ``cannot serialize object of type 'set' at [1]['mask']``, and a pickled record is
refused by the decoder: unpickling runs arbitrary code, so it must never be applied to bytes that
crossed a trust boundary by accident.

Message format of ``dumps`` (integers little-endian, offsets from the start of the message):

    prefix   b"DFMP", u8 version, 3 zero bytes, u32 buffer count N, u64 header length;
             then N x u64, the offset of each array buffer
    header   the msgpack encoding of the object; arrays are ext records that name a buffer
    buffers  the raw bytes of every array, each starting at a multiple of 64

All functions are thread-safe. The only state kept between calls is a cache of the dtypes
decoded so far and one reusable packer per thread for the records that describe arrays.
"""
import ctypes
import math
import pickle
import re
import struct
import sys
import threading

import numpy as np

from ._helpers import check_flag
from . import _msgpack as msgpack   # msgpack's own classes, even after msgpack_numpy.patch()

__all__ = ["DEFAULT_OOB_THRESHOLD", "dumps", "dumps_oob", "loads", "loads_oob"]

DEFAULT_OOB_THRESHOLD = 16 * 1024
"""Arrays of at least this many bytes are kept out of band by :func:`dumps_oob`."""

ALIGNMENT = 64
"""Every array buffer in a :func:`dumps` message starts at a multiple of this many bytes."""

_MAGIC = b"DFMP"
_VERSION = 1
_PREFIX = struct.Struct("<4sB3xIQ")

_EXT_INT, _EXT_TUPLE, _EXT_COMPLEX, _EXT_SCALAR, _EXT_ARRAY = 1, 2, 3, 4, 5
_EXT_PICKLE = 6             # [pickle bytes, [[buffer index, nbytes], ...]]
_EXT_PICKLE_INBAND = 7      # the pickle bytes alone (no out-of-band buffer: the common case)
_EXT_PICKLED_NEXT = 8       # no data: the next of the objects pickled for the whole message
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1   # the range msgpack encodes natively
_KINDS = frozenset("biufcmMSUV")                  # dtype kinds whose bytes are the values
_BASE_TYPES = ((float, float.__float__), (str, str.__str__), (bytes, bytes),
               (list, list), (dict, dict))
# Subclasses of the types msgpack carries (namedtuples, OrderedDict, IntEnum, ...) met by an
# encoder that may pickle: it pickles them, so they come back as themselves.
_SUBCLASS_OF_NATIVE = set()


class _Unsupported(TypeError):
    """Raised by the encoder's default hook; turned into a TypeError with a path."""

    def __init__(self, obj, what=None, reason=""):
        super().__init__()
        self.obj = obj
        self.what = what or f"object of type {type(obj).__name__!r}"
        self.reason = reason


class _Anchor(np.ndarray):
    """Private view type used by :func:`loads_oob`.

    numpy shortens chains of views by skipping intermediate views of the same type as the new
    one.  A view of this type is never skipped when making the final ``np.ndarray``, and no
    caller-supplied buffer can be of this type, so the buffer object always stays on the chain.
    """


def _dtype_ok(dtype):
    return dtype.kind in _KINDS and dtype.fields is None and not dtype.hasobject


# Structured dtypes seen so far -> the description that rebuilds them exactly, or None when
# none does (object fields, overlapping fields): such arrays are pickled.
_STRUCT_DESCR = {}


def _struct_descr(dtype):
    try:
        return _STRUCT_DESCR[dtype]
    except KeyError:
        pass
    descr = None
    if dtype.fields is not None and not dtype.hasobject:
        from numpy.lib import format as npformat
        try:
            candidate = npformat.dtype_to_descr(dtype)
            if isinstance(candidate, list) and npformat.descr_to_dtype(candidate) == dtype:
                descr = candidate
        except Exception:
            pass
    if len(_STRUCT_DESCR) < 1024:
        _STRUCT_DESCR[dtype] = descr
    return descr


def _struct_dtype(descr):
    """The structured dtype a header's description names; ``ValueError`` for anything else."""
    from numpy.lib import format as npformat
    dtype = npformat.descr_to_dtype(descr)
    if dtype.fields is None or dtype.hasobject:
        raise ValueError(f"unsupported dtype {dtype}")
    return dtype


# Decoded dtype strings, all checked by _dtype_ok (a message names few, and names them often).
_DTYPES = {}


def _dtype_of(code):
    """The supported dtype a header's dtype string names; ``ValueError`` for any other."""
    dtype = _DTYPES.get(code)
    if dtype is None:
        dtype = np.dtype(code)
        if not _dtype_ok(dtype):
            raise ValueError(f"unsupported dtype {dtype}")
        if len(_DTYPES) < 1024:
            _DTYPES[code] = dtype
    return dtype


# An ext record made without msgpack.ExtType's argument checks (a Python-level __new__ that cost
# more than packing a small record): the codes and payloads made here are always valid.
_ExtType = msgpack.ExtType
_tuple_new = tuple.__new__
_pickle_dumps, _pickle_loads = pickle.dumps, pickle.loads
_unpackb = msgpack.unpackb
# Whether a pickle names the sender's main script (a class or function of it, by reference),
# which a spawned process does not have: cloudpickle then carries it by value. A compiled
# search costs less than ``b"__main__" in data``, which first tries the needle as an int and
# makes a TypeError (that cost as much as pickling a small set).
_refers_to_main = re.compile(b"__main__").search
# True in a worker forked by its consumer: its ``__main__`` is the consumer's own, so a pickle
# that names it loads there as the very class or function (cloudpickle by value would make a
# new class in the consumer, and ``except MyError`` would not catch a worker's MyError).
_main_is_shared = False


def share_main_module():
    """Called in a worker forked by its consumer (see ``_main_is_shared``)."""
    global _main_is_shared
    _main_is_shared = True


def refers_to_unshared_main(data):
    """Whether the pickle ``data`` names ``__main__`` where the process that loads it has
    another one (cloudpickle must then carry what it names by value)."""
    return not _main_is_shared and _refers_to_main(data) is not None


def _ext(code, data):
    return _tuple_new(_ExtType, (code, data))


_PICKLED_NEXT = _ext(_EXT_PICKLED_NEXT, b"")


# Types seen so far whose objects the codec does not handle: they go to pickle at once, without
# the chain of isinstance checks (bounded; a type outside it only takes the long way).
_PICKLED_TYPES = set()


# Packs the small record that describes an array (one packer per thread, reused: making one
# per array cost more than packing the record).
_local = threading.local()


def _pack_record(record):
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    return packer.pack(record)


def _is_fortran(a):
    """Whether the array's bytes are laid out (and so are stored) in Fortran order."""
    return a.flags.f_contiguous and not a.flags.c_contiguous


def _byte_view(a):
    """A 1-D uint8 view of the array's data in C or F order; copies only a non-contiguous array."""
    if _is_fortran(a):
        a = a.T
    elif not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    return a.reshape(-1).view(np.uint8)


def _shape(flat, dtype, shape, fortran):
    """View the first bytes of the 1-D uint8 array ``flat`` as an array of dtype and shape."""
    nbytes = dtype.itemsize * math.prod(shape)
    if flat.size != nbytes:
        if flat.size < nbytes:
            raise ValueError(f"array needs {nbytes} bytes, buffer has {flat.size}")
        flat = flat[:nbytes]
    if fortran:
        return flat.view(dtype).reshape(shape, order="F")
    return flat.view(dtype).reshape(shape)


class _Encoder:
    """Packs one object; arrays of at least ``threshold`` bytes are appended to ``buffers``.

    With ``raw`` the arrays themselves are appended, for :func:`dumps` to copy into place;
    otherwise a 1-D uint8 view of their bytes is. With ``allow_pickle`` what the codec does not
    handle is pickled (see the module's docstring).
    """

    def __init__(self, buffers, threshold, raw=False, allow_pickle=False, to_pickle=None):
        self.buffers = buffers
        self.threshold = threshold
        self.raw = raw
        self.allow_pickle = allow_pickle
        self.to_pickle = to_pickle  # a list: what needs pickle is appended, not pickled here
        self.packer = None          # a Packer kept for reuse (see _encode); None while it packs

    def encode(self, obj):
        mark = len(self.buffers)
        mark_pickle = len(self.to_pickle) if self.to_pickle is not None else 0
        try:
            if type(obj) is np.ndarray:     # a bare array, common enough to skip the hook
                return _pack_record(self.array(obj))
            return self.pack(obj)
        except BaseException as exc:
            del self.buffers[mark:]
            if self.to_pickle is not None:
                del self.to_pickle[mark_pickle:]
            if isinstance(exc, _Unsupported):
                raise TypeError(f"cannot serialize {exc.what} at {_locate(obj, exc.obj)}"
                                f"{exc.reason}") from None
            raise

    def pack(self, obj):
        packer = self.packer
        if packer is None:      # none kept, or it is packing further up (a tuple's items)
            return msgpack.packb(obj, default=self.default, strict_types=True, use_bin_type=True)
        self.packer = None
        try:
            return packer.pack(obj)     # (a Packer empties itself when packing fails)
        finally:
            self.packer = packer

    def default(self, obj):
        if isinstance(obj, np.ndarray):
            return self.array(obj)
        if type(obj) in _PICKLED_TYPES:
            if self.to_pickle is not None:  # (self.pickled(obj)'s first branch, inline)
                self.to_pickle.append(obj)
                return _PICKLED_NEXT
            if self.allow_pickle:
                # pickled(obj) inline for plain pickle's success: the call alone cost a sixth
                # of pickling a small set
                first = len(self.buffers)
                try:
                    data = _pickle_dumps(obj, 5, buffer_callback=self._keep)
                except Exception:
                    data = None
                if data is not None and _refers_to_main(data) is None:
                    if len(self.buffers) == first:
                        return _tuple_new(_ExtType, (_EXT_PICKLE_INBAND, data))
                    return self._pickle_record(data, first)
                del self.buffers[first:]
            return self.pickled(obj)
        if isinstance(obj, np.generic):
            if not _dtype_ok(obj.dtype):
                return self.pickled(obj)        # a structured scalar, an object
            code = obj.dtype.str.encode()
            return msgpack.ExtType(_EXT_SCALAR, bytes([len(code)]) + code + obj.tobytes())
        if self.allow_pickle and type(obj) in _SUBCLASS_OF_NATIVE:
            # a namedtuple, an OrderedDict, an IntEnum, ...: between a consumer and its own
            # workers it comes back as itself (encoded as its base type it would not)
            return self.pickled(obj)
        if isinstance(obj, int):    # too large for msgpack, or a subclass such as IntEnum
            if obj.__class__ is not int and self.allow_pickle and \
                    len(_SUBCLASS_OF_NATIVE) < 1024:
                _SUBCLASS_OF_NATIVE.add(type(obj))
                return self.pickled(obj)
            value = int.__int__(obj)
            if _INT_MIN <= value <= _INT_MAX:
                return value
            return msgpack.ExtType(
                _EXT_INT, value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True))
        if isinstance(obj, tuple):
            if obj.__class__ is not tuple and self.allow_pickle and \
                    len(_SUBCLASS_OF_NATIVE) < 1024:
                _SUBCLASS_OF_NATIVE.add(type(obj))
                return self.pickled(obj)
            return msgpack.ExtType(_EXT_TUPLE, self.pack(list(obj)))
        if isinstance(obj, complex):
            return msgpack.ExtType(_EXT_COMPLEX, struct.pack("<dd", obj.real, obj.imag))
        for base, convert in _BASE_TYPES:
            if isinstance(obj, base):
                if self.allow_pickle and len(_SUBCLASS_OF_NATIVE) < 1024:
                    _SUBCLASS_OF_NATIVE.add(type(obj))
                    return self.pickled(obj)
                return convert(obj)
        if len(_PICKLED_TYPES) < 1024:
            _PICKLED_TYPES.add(type(obj))
        return self.pickled(obj)

    def array(self, obj):
        a = obj
        if type(a) is not np.ndarray:
            ma = sys.modules.get("numpy.ma")
            if ma is not None and isinstance(a, ma.MaskedArray):
                return self.pickled(obj)    # the mask would be lost as an array
            a = a.view(np.ndarray)
        if _dtype_ok(a.dtype):
            code = a.dtype.str
        else:
            code = _struct_descr(a.dtype)
            if code is None:
                return self.pickled(
                    obj, f"object of type {type(obj).__name__!r} with dtype {a.dtype}")
            a = a.view(np.dtype((np.void, a.dtype.itemsize)))   # raw items, padding included
        fortran = _is_fortran(a)
        if a.nbytes >= self.threshold:
            where = len(self.buffers)
            self.buffers.append(a if self.raw else _byte_view(a))
        else:
            where = a.tobytes(order="F" if fortran else "C")
        return _ext(_EXT_ARRAY, _pack_record([code, a.shape, fortran, where]))

    def pickled(self, obj, what=None):
        """``obj`` as a pickle record (protocol 5): ``[pickle bytes, [[buffer index, nbytes],
        ...]]``, its buffers of at least ``threshold`` bytes kept out of band like arrays; just
        the pickle bytes when it has none. With ``to_pickle``, ``obj`` is appended to it instead
        and the record says only "the next pickled object" (see :func:`dumps_oob`).

        Besides the pickling, this costs the record (an ``ExtType``) and a search of the pickle
        for ``__main__`` (benchmarks/pickle_path.py has the figures): no other object is made
        (out-of-band buffers go straight to ``buffers``), and :meth:`default` has this inline.
        """
        if not self.allow_pickle:
            raise _Unsupported(obj, what, " (only pickle carries it: pass allow_pickle=True "
                                          "where the reader is trusted)")
        if self.to_pickle is not None:
            self.to_pickle.append(obj)
            return _PICKLED_NEXT
        first = len(self.buffers)
        try:
            data = self.dumps(obj)
        except Exception as e:
            raise _Unsupported(obj, what, f" (it does not pickle: {type(e).__name__}: {e})") \
                from None
        if len(self.buffers) == first:
            return _tuple_new(_ExtType, (_EXT_PICKLE_INBAND, data))
        return self._pickle_record(data, first)

    def dumps(self, obj):
        """The pickle (protocol 5) of ``obj``, its large buffers appended to ``buffers``; by
        cloudpickle when plain pickle fails or the pickle names ``__main__`` (which a spawned
        process does not have). On failure nothing is appended and cloudpickle's error is
        raised."""
        buffers = self.buffers
        first = len(buffers)
        try:
            data = _pickle_dumps(obj, 5, buffer_callback=self._keep)
            if not refers_to_unshared_main(data):
                return data
        except Exception:
            pass
        del buffers[first:]
        import cloudpickle
        try:
            return cloudpickle.dumps(obj, protocol=5, buffer_callback=self._keep)
        except BaseException:
            del buffers[first:]
            raise

    def _pickle_record(self, data, first):
        """The record of pickle bytes whose out-of-band buffers are ``buffers[first:]``."""
        buffers = self.buffers
        return _ext(_EXT_PICKLE, _pack_record(
            [data, [[i, buffers[i].nbytes] for i in range(first, len(buffers))]]))

    def _keep(self, buffer):
        """pickle's buffer callback: large buffers out of band (appended to ``buffers``), small
        ones inside the pickle."""
        view = buffer.raw()
        if view.nbytes < self.threshold:
            return True
        self.buffers.append(np.frombuffer(view, np.uint8))
        return False


def _encode(obj, buffers, threshold, raw, allow_pickle, to_pickle=None):
    """``_Encoder(buffers, threshold, raw, allow_pickle, to_pickle).encode(obj)``, with this
    thread's encoder and its Packer reused: making them cost 4 times what packing a small
    datapoint does (the process transport encodes each result on its own). A call made while this
    thread's encoder is busy (a ``__reduce__`` that encodes, run by the pickle fallback) gets a
    fresh one."""
    enc = getattr(_local, "encoder", None)
    if enc is None:
        enc = _local.encoder = _Encoder(None, threshold)
        enc.packer = msgpack.Packer(default=enc.default, strict_types=True, use_bin_type=True)
    elif enc.buffers is not None:
        return _Encoder(buffers, threshold, raw, allow_pickle, to_pickle).encode(obj)
    enc.buffers, enc.threshold, enc.raw = buffers, threshold, raw
    enc.allow_pickle, enc.to_pickle = allow_pickle, to_pickle
    try:
        return enc.encode(obj)
    finally:
        enc.buffers = enc.to_pickle = None


class _Decoder:
    """Unpacks one header; ``resolve(i)`` gives out-of-band buffer ``i`` as a 1-D uint8 array.
    ``pickled`` is an iterator over the objects pickled for the whole message (see
    :func:`dumps_oob`'s ``to_pickle``), which its records take in order."""

    def __init__(self, resolve, allow_pickle=False, pickled=None):
        self.resolve = resolve
        self.allow_pickle = allow_pickle
        self.pickled = pickled

    def decode(self, header):
        try:
            # (self.unpack inline: this runs once per datapoint of the process transport)
            return _unpackb(header, ext_hook=self.ext_hook, raw=False, strict_map_key=False)
        except MemoryError:
            raise
        except Exception as exc:
            raise ValueError(f"malformed dataflow.serialize data: {exc}") from exc

    def unpack(self, data):
        return msgpack.unpackb(data, ext_hook=self.ext_hook, raw=False, strict_map_key=False)

    def ext_hook(self, code, data):
        if code == _EXT_PICKLED_NEXT:       # first: this should cost little beyond its pickle
            try:
                return next(self.pickled)
            except (TypeError, StopIteration):          # (TypeError: none given)
                raise ValueError("a record of an object pickled for the whole message, which "
                                 "does not carry that many") from None
        if code == _EXT_PICKLE_INBAND:      # first: this path should cost little beyond loads
            if not self.allow_pickle:
                raise ValueError("pickled data, which only allow_pickle=True may decode")
            return _pickle_loads(data)
        if code == _EXT_ARRAY:
            dtype, shape, fortran, where = msgpack.unpackb(data, raw=False)
            dtype = _dtype_of(dtype) if type(dtype) is str else _struct_dtype(dtype)
            for n in shape:
                if type(n) is not int or n < 0:
                    raise ValueError(f"bad array shape {shape!r}")
            if isinstance(where, bytes):            # inline: an owned, writable copy
                return _shape(np.frombuffer(where, np.uint8), dtype, shape, fortran).copy("A")
            if type(where) is not int or where < 0:
                raise ValueError(f"bad buffer index {where!r}")
            a = _shape(self.resolve(where), dtype, shape, fortran)
            return a if type(a) is np.ndarray else a.view(np.ndarray)
        if code == _EXT_TUPLE:
            items = self.unpack(data)
            if type(items) is not list:
                raise ValueError("bad tuple record")
            return tuple(items)
        if code == _EXT_INT:
            return int.from_bytes(data, "little", signed=True)
        if code == _EXT_SCALAR:
            dtype = np.dtype(data[1:1 + data[0]].decode("ascii"))
            raw = data[1 + data[0]:]
            if not _dtype_ok(dtype):
                raise ValueError(f"unsupported dtype {dtype}")
            if dtype.itemsize == 0:                 # np.str_(''), np.bytes_(b'')
                return dtype.type()
            if len(raw) != dtype.itemsize:
                raise ValueError(f"bad numpy scalar record for dtype {dtype}")
            return np.frombuffer(raw, dtype)[0]
        if code == _EXT_COMPLEX:
            return complex(*struct.unpack("<dd", data))
        if code == _EXT_PICKLE:
            return self.unpickle(msgpack.unpackb(data, raw=False))
        raise ValueError(f"unknown ext type {code}")

    def unpickle(self, record):
        """The object of a pickle record ``[pickle bytes, [[buffer index, nbytes], ...]]``."""
        if not self.allow_pickle:
            raise ValueError("pickled data, which only allow_pickle=True may decode")
        data, oob = record
        buffers = []
        for i, nbytes in oob:
            b = self.resolve(i)
            if b.size < nbytes:
                raise ValueError(f"buffer {i} has {b.size} bytes, the pickle needs {nbytes}")
            buffers.append(b[:nbytes])
        return _pickle_loads(data, buffers=buffers)


def _locate(root, target):
    """Describe where ``target`` sits inside ``root``, e.g. "[1]['mask']" (packing order)."""
    seen = set()

    def search(obj, path):
        if obj is target:
            return path, False
        if isinstance(obj, (list, tuple, dict)) and id(obj) not in seen:
            seen.add(id(obj))
            for key, value in (obj.items() if isinstance(obj, dict) else enumerate(obj)):
                if isinstance(obj, dict) and key is target:
                    return path, True
                found = search(value, f"{path}[{key!r}]")
                if found is not None:
                    return found
        return None

    found = search(root, "")
    if found is None:
        return "an unknown position"
    path, is_key = found
    return (path or "the top level") + (" (as a dict key)" if is_key else "")


_FILLED_IN_PLACE = 64 * 1024    # dumps: messages at least this large are filled in place


def _new_bytes(size):
    """A new ``bytes`` object of ``size`` (> 0) bytes, not yet filled, and a writable uint8 view
    of its contents, to fill before the object is handed to anyone. This is how C code makes a
    bytes object without a second copy (``PyBytes_FromStringAndSize(NULL, size)``); the view
    does not keep the object alive, so the caller holds both until it is filled. Where the C API
    is not reachable (not CPython), a ``bytearray`` and its view."""
    if _bytes_api is None:
        out = bytearray(size)
        return out, np.frombuffer(out, np.uint8)
    new, address_of = _bytes_api
    out = new(None, size)
    return out, np.frombuffer((ctypes.c_ubyte * size).from_address(address_of(out)), np.uint8)


def _load_bytes_api():
    try:
        api = ctypes.pythonapi
        new, address_of = api.PyBytes_FromStringAndSize, api.PyBytes_AsString
    except (AttributeError, OSError):
        return None
    new.restype, new.argtypes = ctypes.py_object, (ctypes.c_char_p, ctypes.c_ssize_t)
    address_of.restype, address_of.argtypes = ctypes.c_void_p, (ctypes.py_object,)
    return new, address_of


_bytes_api = _load_bytes_api() if sys.implementation.name == "cpython" else None


def dumps(obj, *, allow_pickle=False):
    """Encode ``obj`` into one message and return it as ``bytes``.

    A message of at least 64 KiB is allocated at its final size and filled before it is
    returned, so each array's bytes are copied exactly once, straight into it (a
    non-contiguous array is gathered by that same copy); a smaller one is joined from its
    parts. :func:`loads` of it gives read-only arrays (``loads(bytearray(msg))`` writable
    ones).  Raises ``TypeError`` for unsupported values.
    """
    allow_pickle = check_flag("allow_pickle", allow_pickle)
    arrays = []
    header = _encode(obj, arrays, 0, True, allow_pickle)
    start = _PREFIX.size + 8 * len(arrays)
    offsets = []
    end = start + len(header)
    for a in arrays:
        offset = -(-end // ALIGNMENT) * ALIGNMENT
        offsets.append(offset)
        end = offset + a.nbytes
    head = b"".join((_PREFIX.pack(_MAGIC, _VERSION, len(arrays), len(header)),
                     struct.pack(f"<{len(arrays)}Q", *offsets), header))
    if end < _FILLED_IN_PLACE:
        parts, pos = [head], len(head)
        for a, offset in zip(arrays, offsets):
            parts += (bytes(offset - pos), a.tobytes("F" if _is_fortran(a) else "C"))
            pos = offset + a.nbytes
        return b"".join(parts)
    out, flat = _new_bytes(end)
    flat[:len(head)] = np.frombuffer(head, np.uint8)
    pos = len(head)
    for a, offset in zip(arrays, offsets):
        flat[pos:offset] = 0    # the alignment gap: not what the allocator left there
        np.copyto(_shape(flat[offset:], a.dtype, a.shape, _is_fortran(a)), a)
        pos = offset + a.nbytes
    return out


def loads(buf, *, allow_pickle=False):
    """Decode a message made by :func:`dumps` from any buffer (bytes, bytearray, mmap, ...).

    Arrays are not copied: they are views into ``buf`` and keep it alive.  They are read-only
    when ``buf`` is (``bytes``, as ``dumps`` returns, a read-only mmap) and writable, sharing
    memory with ``buf``, when it is writable (a ``bytearray``).  Raises ``ValueError`` if
    ``buf`` is not a complete, well-formed message.
    """
    allow_pickle = check_flag("allow_pickle", allow_pickle)
    flat = np.frombuffer(buf, np.uint8)
    if flat.size < _PREFIX.size:
        raise ValueError(f"truncated dataflow.serialize message ({flat.size} bytes)")
    magic, version, count, length = _PREFIX.unpack_from(flat)
    if magic != _MAGIC:
        raise ValueError("not a dataflow.serialize message (bad magic bytes)")
    if version != _VERSION:
        raise ValueError(f"unsupported dataflow.serialize format version {version}")
    start = _PREFIX.size + 8 * count
    if start + length > flat.size:
        raise ValueError(f"truncated dataflow.serialize message ({flat.size} bytes)")
    offsets = struct.unpack_from(f"<{count}Q", flat, _PREFIX.size)
    return _Decoder(lambda i: flat[offsets[i]:], allow_pickle).decode(flat[start:start + length])


def dumps_oob(obj, buffers, threshold=DEFAULT_OOB_THRESHOLD, *, allow_pickle=False,
              to_pickle=None):
    """Encode ``obj`` into a msgpack header, keeping large arrays out of band.

    Every array of at least ``threshold`` bytes is not copied into the header: a 1-D uint8
    ndarray viewing its bytes is appended to the list ``buffers`` and the header records its
    index there.  The view shares memory with the array when that is C- or F-contiguous;
    other arrays are made contiguous by one copy.  Smaller arrays are copied into the header.
    Indices are positions in ``buffers``, so several calls may append to one list; on error
    nothing is appended.  Raises ``TypeError`` for unsupported values.

    ``to_pickle`` (a list; needs ``allow_pickle``) defers the pickling: each object that needs
    pickle is appended to it and the header records only its turn. Several headers may share
    one list; :func:`pickle_objects` then pickles them all at once (pickle's own cost per call is
    then paid once, not per object, and an object that does not pickle shows only there), and
    ``loads_oob``/``loader_oob`` take that record as ``pickled``, decoding those headers in the
    order they were made.
    """
    allow_pickle = check_flag("allow_pickle", allow_pickle)
    if to_pickle is not None and not allow_pickle:
        raise ValueError("to_pickle needs allow_pickle=True")
    return _encode(obj, buffers, threshold, False, allow_pickle, to_pickle)


def pickle_objects(objects, buffers, threshold=DEFAULT_OOB_THRESHOLD):
    """The record that carries ``objects`` (a list :func:`dumps_oob` filled as ``to_pickle``):
    ``[pickle bytes, [[buffer index, nbytes], ...]]``, one pickle (protocol 5; cloudpickle where
    pickle cannot, see the module's docstring) of them all, their buffers of at least
    ``threshold`` bytes appended to ``buffers`` like arrays. Raises ``TypeError`` when they do
    not pickle, appending nothing; encoding the headers again without ``to_pickle`` then names
    the object at fault and where it is."""
    enc = _Encoder(buffers, threshold, allow_pickle=True)
    first = len(buffers)
    try:
        data = enc.dumps(objects)
    except Exception as e:
        raise TypeError(f"the objects to pickle do not pickle: {type(e).__name__}: {e}") \
            from None
    return [data, [[i, buffers[i].nbytes] for i in range(first, len(buffers))]]


def loads_oob(header, buffers, *, allow_pickle=False, pickled=None):
    """Decode a header made by :func:`dumps_oob`; ``buffers[i]`` holds out-of-band buffer ``i``.

    A buffer may be any buffer-protocol object with at least the recorded number of bytes.
    Out-of-band arrays are exact ``np.ndarray`` views of the buffer, writable if it is.  When
    ``buffers[i]`` is a contiguous ``np.ndarray`` (of any subclass) the array is made from
    that very object by numpy view operations, so the ``.base`` chain of the array, and of any
    view of it, keeps that object alive; other buffers are wrapped with ``np.frombuffer``.
    Arrays stored in the header come back as owned, writable copies.  ``pickled`` is the
    record of :func:`pickle_objects` for a header made with ``to_pickle``.  Raises
    ``ValueError`` if the header is malformed or a buffer is missing or too short.
    """
    return loader_oob(buffers, allow_pickle=allow_pickle, pickled=pickled)(header)


def loader_oob(buffers, *, allow_pickle=False, pickled=None):  # for the process transport
    """A function ``header -> object`` that is ``loads_oob(header, buffers, allow_pickle=...)``
    for every header whose out-of-band buffers are in ``buffers`` (the datapoints of one
    message share them): the set-up is paid once, not per header. With ``pickled`` (the
    record of :func:`pickle_objects`), the headers made with that ``to_pickle`` list must be
    decoded in the order they were made. Raises ``ValueError`` for a malformed record."""
    allow_pickle = check_flag("allow_pickle", allow_pickle)
    def resolve(i):
        b = buffers[i]
        if not isinstance(b, np.ndarray):
            return np.frombuffer(b, np.uint8)
        if not b.flags.c_contiguous:
            raise ValueError(f"out-of-band buffer {i} is not contiguous")
        flat = b.view(_Anchor)
        if flat.dtype != np.uint8 or flat.ndim != 1:
            flat = flat.reshape(-1).view(np.uint8)
        return flat

    decoder = _Decoder(resolve, allow_pickle)
    if pickled is not None:
        try:
            objects = decoder.unpickle(pickled)
        except MemoryError:
            raise
        except Exception as exc:
            raise ValueError(f"malformed dataflow.serialize pickle record: {exc}") from exc
        if type(objects) is not list:
            raise ValueError("malformed dataflow.serialize pickle record: not a list")
        decoder.pickled = iter(objects)
    return decoder.decode


# -- tensorpack's serializers, under its module path ---------------------------------------------
# tensorpack's ``tensorpack.dataflow.serialize`` holds its serializers: code ported by changing the
# import (``from dataflow.serialize import LMDBSerializer``) finds them here. They live in
# dataflow.formats, above this module, so they are looked up when first asked for (a module
# ``__getattr__``, PEP 562), and they stay out of ``__all__``: ``dumps``/``loads`` here are
# dataflow's codec, not tensorpack's (that is ``dataflow.formats.codec``).
_TENSORPACK_SERIALIZERS = {"LMDBSerializer": "lmdb", "NumpySerializer": "npz",
                           "TFRecordSerializer": "tfrecord", "HDF5Serializer": "hdf5"}


def __getattr__(name):
    module = _TENSORPACK_SERIALIZERS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f".formats.{module}", __package__), name)
