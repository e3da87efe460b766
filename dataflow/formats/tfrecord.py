"""TFRecord files as tensorpack writes them: ``TFRecordSerializer``, without TensorFlow.

Framing (TensorFlow's, little-endian), per record::

    uint64 length | uint32 masked_crc32c(length bytes) | data[length] | uint32 masked_crc32c(data)

with ``masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2**32)`` and CRC32C the
Castagnoli CRC. No compression. Each record's data is one encoded datapoint
(:mod:`dataflow.formats.codec`; no ``tf.train.Example``), as tensorpack 0.11 writes it.

Reading checks both CRCs of every record; a mismatch or a truncated record raises
:class:`TFRecordError` naming the file, the record's index and its byte offset. Large msgpack
arrays are read-only views of a read-only ``mmap`` of the file (kept alive by the arrays).

Needs crc32c (``pip install 'dataflow-rt[formats]'``), imported on first use.
"""
import mmap
import os
import struct

from .. import checkpoint as _ckpt
from .._helpers import check_flag, check_int
from ..base import DataFlow, UnknownLengthError, as_dataflow
from ..common import FixedSizeData
from ..raw import _guard_of
from . import codec
from ._files import as_path, require, write_aside

__all__ = ["TFRecordSerializer", "TFRecordError"]

_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8


class TFRecordError(ValueError):
    """A TFRecord file that is truncated or fails a CRC check."""


def _crc32c(user):
    return require("crc32c", user, "formats").crc32c


def masked_crc32c(data, crc32c=None):
    """TFRecord's masked CRC32C of ``data`` (bytes-like)."""
    crc = (crc32c or _crc32c("TFRecordSerializer"))(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


class TFRecordData(_ckpt.PassPosition, DataFlow):
    """The decoded datapoints of a TFRecord file, read from the start on every pass.
    ``len()`` is unknown (``NotImplementedError``): a TFRecord file does not record its count.
    Its position (``state_dict``) is the pass, the records returned and the byte offset of the
    next one, so a resumed pass seeks straight there."""

    _offset = 0              # byte offset of the next record of the running pass

    def __init__(self, path, *, allow_pickle=True):
        self.path = as_path("TFRecordData", path)
        self.allow_pickle = check_flag("TFRecordSerializer: allow_pickle", allow_pickle)
        if os.path.isdir(self.path):
            raise IsADirectoryError(f"TFRecord file {self.path!r} is a directory")
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"TFRecord file {self.path!r} does not exist")
        _crc32c("TFRecordSerializer")

    def __len__(self):
        # also a TypeError, so that list() of this finite dataflow works
        raise UnknownLengthError(f"the TFRecord file {self.path} does not record how many "
                                 "datapoints it holds: pass size= to TFRecordSerializer.load")

    def reset_state(self):
        self._reset_position()

    def _get_position(self):
        s = _ckpt.PassPosition._get_position(self)
        if self._resume is None:
            s["offset"] = self._offset if self._in_pass else 0
        return s

    def _set_position(self, position):
        _ckpt.PassPosition._set_position(self, position)
        self._resume["offset"] = int(position.get("offset", 0))

    def __iter__(self):
        # the pass begins at iter(), not at the first next() (see checkpoint.PassPosition)
        r = self._resume
        offset = r["offset"] if r is not None else 0
        _, index = self._begin_pass()
        self._offset = offset = offset if index else 0
        return self._records(index, offset)

    def _records(self, index, pos):
        crc32c = _crc32c("TFRecordSerializer")
        loads, allow_pickle = codec.loads, self.allow_pickle
        with _guard_of(self):
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    self._end_pass()
                    return
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            buf = memoryview(mm)
            while pos < size:
                where = f"TFRecord {self.path}, record {index} (byte offset {pos})"
                if pos + 12 > size:
                    raise TFRecordError(f"{where}: truncated header ({size - pos} of 12 bytes)")
                head = buf[pos:pos + 8]
                if _CRC.unpack_from(buf, pos + 8)[0] != masked_crc32c(head, crc32c):
                    raise TFRecordError(f"{where}: the CRC of the length does not match "
                                        "(corrupted file, or not a TFRecord file)")
                n = _LEN.unpack(head)[0]
                start, end = pos + 12, pos + 12 + n
                if end + 4 > size:
                    raise TFRecordError(f"{where}: truncated record ({size - start} of {n + 4} "
                                        "bytes after the header)")
                data = buf[start:end]
                if _CRC.unpack_from(buf, end)[0] != masked_crc32c(data, crc32c):
                    raise TFRecordError(f"{where}: the CRC of the data does not match "
                                        "(corrupted file)")
                try:
                    dp = loads(data, allow_pickle=allow_pickle)
                except (codec.DecodeError, codec.PickleRefusedError) as e:
                    raise type(e)(f"{where}: {e}") from None
                pos, index = end + 4, index + 1
                self._pos, self._offset = index, pos
                if dp is not None:      # tensorpack's MapData(loads) drops a None datapoint
                    yield dp
            self._end_pass()


class TFRecordSerializer:
    """Write a dataflow to a TFRecord file and read it back (see the module doc)."""

    @staticmethod
    def save(df, path, *, format="msgpack"):
        """Write every datapoint of one pass of ``df`` to ``path``, one record each.

        Written under a temporary name beside ``path`` and renamed when complete, so an error or
        a crash never leaves a partial file at ``path`` (an existing file is replaced).

        Args:
            df (DataFlow): the datapoints (``reset_state()`` is called here, as in tensorpack).
            path (str): the file to write.
            format (str): "msgpack" (default; tensorpack reads it with
                ``TENSORPACK_SERIALIZE=msgpack``) or "pickle" (tensorpack's default).
        """
        crc32c = _crc32c("TFRecordSerializer")
        df = as_dataflow(df)          # tensorpack's, say
        if not isinstance(df, DataFlow):
            raise TypeError(f"TFRecordSerializer.save: df must be a DataFlow, got "
                            f"{type(df).__name__}")
        if format not in codec.FORMATS:
            raise ValueError(f"TFRecordSerializer.save: unknown format {format!r}: expected one "
                             f"of {codec.FORMATS}")
        path = as_path("TFRecordSerializer.save", path)
        df.reset_state()
        dumps = codec.dumps
        with write_aside(path) as tmp, open(tmp, "wb") as f:
            for i, dp in enumerate(df):
                try:
                    data = dumps(dp, format)
                except Exception as e:
                    raise TypeError(f"TFRecordSerializer.save({path!r}): datapoint {i} (a "
                                    f"{type(dp).__name__}) cannot be encoded as {format}: {e}"
                                    f"{codec.pickle_hint(format)}") \
                        from e
                head = _LEN.pack(len(data))
                f.write(head + _CRC.pack(masked_crc32c(head, crc32c)))
                f.write(data)
                f.write(_CRC.pack(masked_crc32c(data, crc32c)))
            f.flush()
            os.fsync(f.fileno())

    @staticmethod
    def load(path, size=None, *, allow_pickle=True):
        """The datapoints of a TFRecord file written by :meth:`save` or by tensorpack 0.11
        (either encoding, told from the bytes). Every pass reads the file from the start. A
        record that decodes to ``None`` is dropped, as in tensorpack.

        Args:
            path (str): the file.
            size (int): if given, each pass yields exactly ``size`` datapoints
                (``FixedSizeData``: a pass continues where the last one stopped, starting the
                file again at its end) and ``len()`` is ``size``; without it ``len()`` raises
                ``NotImplementedError``.
            allow_pickle (bool): accept pickled datapoints (with False they raise
                ``codec.PickleRefusedError``: unpickling runs whatever code the file names).
        """
        ds = TFRecordData(path, allow_pickle=allow_pickle)
        if size is not None:
            ds = FixedSizeData(ds, check_int("TFRecordSerializer.load: size", size, 0,
                                             whole_floats=True))
        return ds
