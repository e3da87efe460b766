"""LMDB files as tensorpack writes and reads them: ``LMDBSerializer``, ``LMDBData``,
``LMDBDataDecoder``, ``CaffeLMDB``.

Layout (tensorpack 0.11's): datapoint ``i`` is stored under the key ``b'%08d' % i`` as the value
``codec.dumps(dp)``; after the data, the record ``b'__keys__'`` holds the encoded list of every
key (bytes). No other record (the length is the number of entries minus one). The path is
either a file (LMDB's ``subdir=False``: the files ``path`` and ``path + '-lock'``) or an existing
directory (``path/data.mdb`` and ``path/lock.mdb``).

Environments: py-lmdb refuses to open one environment twice in a process, and an environment
must not be used across ``fork``. So every reader of a path in a process shares one read-only
environment (:class:`_Env`), opened on first use and closed when the last reader closes; a
process that finds an environment inherited from its parent closes that copy and opens its own.
Readers take their environment again in ``reset_state()`` (and, if that was not called in this
process, when iterated), so an LMDB dataflow works upstream of ``MultiProcessRunnerZMQ`` and
inside process workers, forked or spawned.

Zero copy: ``LMDBSerializer.load`` decodes large values (``codec.ZERO_COPY_MIN`` bytes and more)
from a read-only ``mmap`` of the data file that this module holds beside LMDB's own map, so the
arrays of a msgpack datapoint are read-only views of the page cache. The arrays keep that mmap
alive: they stay valid after the dataflow is closed, in a forked child, and after the file is
deleted. A sequential pass over a file of mostly large values finds the records by reading
LMDB's pages from that mmap (:mod:`._lmdbscan`); otherwise py-lmdb finds them, and a large
value's offset in the file is its address in LMDB's map minus the address of that map (found
once per environment from the page number LMDB writes at the start of every page, and checked
against the file).

Needs lmdb (``pip install 'dataflow-rt[formats]'``), imported on first use.
"""
import contextlib
import ctypes
import itertools
import logging
import mmap
import os
import secrets
import sys
import threading

import numpy as np

from .. import checkpoint as _ckpt
from .._helpers import check_flag, check_int
from ..base import DataFlow, DataFlowReentrantGuard, ProxyDataFlow, RNGDataFlow, as_dataflow
from ..common import MapData
from ..raw import _guard_of
from . import _lmdbscan, codec
from ._files import as_path, aside_prefix, check_target, remove_stale, require

__all__ = ["LMDBSerializer", "LMDBData", "LMDBDataDecoder", "CaffeLMDB"]

logger = logging.getLogger(__name__)

_KEYS = b"__keys__"
# tensorpack's map size: 2 TiB where the address space allows it. A read-only map beyond the end
# of the file costs nothing.
_MAP_SIZE = 1099511627776 * 2 if sys.maxsize > 2**32 else 128 * 1024 * 1024
# The writer's map (MDB_WRITEMAP) is the size of the file while it is written (sparse), so it
# starts smaller, and is doubled on MapFullError.
_WRITE_MAP_SIZE = 1 << 30 if sys.maxsize > 2**32 else 128 * 1024 * 1024
_PENDING_BYTES = 64 * 1024 * 1024     # save: commit at least this often, to bound memory


def _lmdb(user):
    return require("lmdb", user, "formats")


def _layout(path):
    """(data file, lock file, subdir) of an LMDB path as tensorpack reads it."""
    if os.path.isdir(path):
        return os.path.join(path, "data.mdb"), os.path.join(path, "lock.mdb"), True
    return path, path + "-lock", False


class LMDBFormatError(ValueError):
    """An LMDB file that is not one, is truncated, or lacks what tensorpack's layout needs."""


# -- one read-only environment per data file and process ---------------------------------------
class _Env:
    """A read-only LMDB environment shared by every reader of one path in this process.

    ``acquire(path)`` returns it (opening it when needed) and counts a user; ``release()``
    uncounts one and closes the environment when none is left. An entry made in another process
    (inherited through ``fork``) is closed here and replaced, as is one whose file was replaced.
    """

    _registry = {}
    _lock = threading.Lock()

    def __init__(self, path, real, data_file, subdir, ident):
        lmdb = _lmdb("LMDBData")
        self.path, self.real, self.data_file, self.ident = path, real, data_file, ident
        self.pid = os.getpid()
        self.users = 0
        self._filemap = None       # np.uint8 view of our mmap of the data file
        self._base = None          # address of LMDB's map (int), or False when unknown
        self._scan = None          # _lmdbscan.Scan, or False when the file needs the cursor
        self._tree_checked = False
        try:
            self.env = lmdb.open(real, subdir=subdir, readonly=True, lock=False,
                                 readahead=True, map_size=_MAP_SIZE, max_readers=100)
        except lmdb.Error as e:
            raise LMDBFormatError(f"{path}: not a readable LMDB environment "
                                  f"({type(e).__name__}: {e})") from e
        try:
            info, stat = self.env.info(), self.env.stat()
            self.psize = stat["psize"]
            need = (info["last_pgno"] + 1) * self.psize
            have = os.stat(data_file).st_size
            if have < need:
                raise LMDBFormatError(
                    f"{path}: the LMDB file is truncated ({have} bytes; its pages need {need})")
        except BaseException:
            self.env.close()
            raise

    @classmethod
    def acquire(cls, path):
        path = os.fspath(path)
        real = os.path.realpath(path)
        data_file, _, subdir = _layout(real)
        try:
            st = os.stat(data_file)
        except FileNotFoundError:
            raise FileNotFoundError(f"LMDB {path!r} does not exist (looked for {data_file})") \
                from None
        ident = (st.st_dev, st.st_ino)
        with cls._lock:
            env = cls._registry.get(real)
            if env is not None and (env.pid != os.getpid() or env.ident != ident):
                env._close()            # a parent's copy, or the file was replaced
                env = None
            if env is None:
                env = cls._registry[real] = cls(path, real, data_file, subdir, ident)
            env.users += 1
            return env

    def release(self):
        with self._lock:
            if self.pid != os.getpid() or self.users <= 0:
                return
            self.users -= 1
            if self.users == 0:
                self._close()
                if self._registry.get(self.real) is self:
                    del self._registry[self.real]

    def _close(self):
        self.env.close()
        self._filemap = self._scan = None    # the mmap itself lives on while arrays use it

    # -- values as views of the file ---------------------------------------------------------
    def _map(self):
        """A read-only mmap of the data file (np.uint8 view), made on first use."""
        if self._filemap is None:
            with open(self.data_file, "rb") as f:
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            self._filemap = np.frombuffer(mm, np.uint8)
        return self._filemap

    def scan(self):
        """A :class:`_lmdbscan.Scan` of the file (records in key order as slices of the mmap)
        when most of the file is large values (on overflow pages), where it is the faster way
        and keeps their arrays alive; None for files of small records (py-lmdb's cursor walks
        those faster) or files it does not read."""
        if self._scan is None:
            stat = self.env.stat()
            self._scan = stat["overflow_pages"] > stat["leaf_pages"] and self._open_scan()
        return self._scan or None

    def _open_scan(self):
        try:
            return _lmdbscan.open_scan(memoryview(self._map().base), self.env.stat(),
                                       self.env.info()) or False
        except (OSError, ValueError):
            return False

    def check_tree(self):
        """Before py-lmdb's cursor walks the file in key order: walk its tree's pages once
        (:meth:`_lmdbscan.Scan.check`, bounds-checked), raising :class:`_lmdbscan.ScanError`
        on a damaged one. liblmdb's cursor meets such a page with a failed assertion, which
        aborts the process (a page of zeros among the leaves), or quietly yields fewer records
        (a damaged record count). Once per environment; a file :mod:`._lmdbscan` does not read
        is not checked."""
        if not self._tree_checked:
            scan = self._scan or self._open_scan()      # the sequential scan's, if made
            if scan:
                scan.check()
            self._tree_checked = True

    def view(self, value):
        """``value`` (a memoryview into LMDB's map, from a ``buffers=True`` transaction) as a
        memoryview of this module's mmap of the file, or ``None`` when that is not possible."""
        if self._base is None:
            self._base = self._find_base(value)
        if self._base is False:
            return None
        off = np.frombuffer(value, np.uint8).ctypes.data - self._base
        end = off + len(value)
        fm = self._filemap
        if off < 0 or end > len(fm):
            return None
        return memoryview(fm.base)[off:end]

    def _find_base(self, value):
        """Where LMDB mapped the file: the page holding ``value`` starts with its page number."""
        try:
            fm = self._map()
            addr = np.frombuffer(value, np.uint8).ctypes.data
            page = addr - addr % self.psize
            pgno = int.from_bytes(ctypes.string_at(page, 8), "little")
            base = page - pgno * self.psize
            off = addr - base
            if off < 0 or off + len(value) > len(fm) or \
                    fm[off:off + len(value)].tobytes() != bytes(value):
                return False
            return base
        except (OSError, ValueError):
            return False


# -- readers -------------------------------------------------------------------------------------
class LMDBData(_ckpt.IndexedSource, RNGDataFlow):
    """The records of an LMDB as ``[key, value]`` pairs of bytes (values not decoded).

    With ``shuffle=False`` a pass walks the keys in LMDB's order (byte order), skipping
    ``__keys__``. With ``shuffle=True`` (the default) a pass visits ``keys`` in a fresh random
    order from ``self.rng`` (call ``reset_state()`` first); a key that is not in the LMDB gives
    ``[key, None]``, as in tensorpack. ``keys`` (used only with ``shuffle=True``, as in
    tensorpack): ``None`` for the ``__keys__`` record (or, without one, every key in the LMDB),
    a list of keys (bytes; str is encoded as ASCII), or a format string such as ``'{:0>8d}'``
    formatted with ``0 .. len-1``. ``len()`` is the number of keys a pass visits.

    The environment is shared with every other reader of the path in this process (see the
    module doc); ``close()`` releases this reader's use of it.

    Checkpoint (``state_dict``): the position is the pass and the number of records returned in
    it. A shuffled pass's order is a permutation keyed by a seed drawn once from ``self.rng``
    and the pass number, so a resumed pass recomputes it and continues at once; a resumed
    sequential pass skips the records already returned by walking keys only (no value is read
    or decoded).
    """

    def __init__(self, lmdb_path, shuffle=True, keys=None, *, allow_pickle=True):
        """
        Args:
            lmdb_path (str): an LMDB file, or a directory holding ``data.mdb``.
            shuffle (bool): visit the records in random order (see the class doc).
            keys (None | list | str): the keys a shuffled pass visits (see the class doc).
            allow_pickle (bool): decode a pickled ``__keys__`` record (tensorpack's default
                encoding); with False, the keys are read from the LMDB instead.
        """
        _lmdb("LMDBData")
        self.lmdb_path = as_path("LMDBData", lmdb_path, "lmdb_path")
        self.shuffle = shuffle = check_flag("LMDBData: shuffle", shuffle)
        allow_pickle = check_flag("LMDBData: allow_pickle", allow_pickle)
        self._env = None
        env = _Env.acquire(self.lmdb_path)
        try:
            with self._reading(), env.env.begin() as txn:
                entries = txn.stat()["entries"]
                raw_keys = txn.get(_KEYS)
                self.has_keys_record = raw_keys is not None
                self._size = entries - 1 if self.has_keys_record else entries
                self.keys = None
                if shuffle:
                    self.keys = self._keys(keys, raw_keys, txn, allow_pickle)
                    self._size = len(self.keys)
        finally:
            env.release()
        logger.info("Found %d entries in %s", self._size, self.lmdb_path)

    def _keys(self, keys, raw_keys, txn, allow_pickle):
        if isinstance(keys, str):
            try:
                return [keys.format(i).encode("ascii") for i in range(self._size)]
            except (IndexError, KeyError, ValueError) as e:    # "{}{}", "{name}", "{:q}"
                raise ValueError(f"LMDBData({self.lmdb_path!r}): keys {keys!r} is no format "
                                 f"string of one number, such as '{{:08d}}' ({type(e).__name__}: "
                                 f"{e})") from None
        if keys is not None:
            # bytes(1) would be b'\x00': an int key is a mistake, not a key
            seq = list(keys) if hasattr(keys, "__iter__") and not isinstance(keys, bytes) \
                else [keys]
            if not all(isinstance(k, (str, bytes, bytearray, memoryview, np.bytes_))
                       for k in seq):
                raise TypeError(f"LMDBData({self.lmdb_path!r}): keys must be a list of keys "
                                f"(bytes or str) or a format string such as '{{:08d}}', got "
                                f"{keys!r:.80}")
            return [k.encode("ascii") if isinstance(k, str) else bytes(k) for k in seq]
        if raw_keys is not None and (allow_pickle or codec.sniff(raw_keys) == "msgpack"):
            where = f"LMDB {self.lmdb_path}, record {_KEYS!r}"
            found = codec.loads(raw_keys, allow_pickle=allow_pickle, where=where)
            if not isinstance(found, list) or \
                    not all(isinstance(k, (bytes, str)) for k in found):
                raise LMDBFormatError(f"{where}: expected a list of keys, found "
                                      f"{type(found).__name__}")
            return [k.encode("ascii") if isinstance(k, str) else k for k in found]
        return [k for k in txn.cursor().iternext(values=False) if k != _KEYS]

    def __len__(self):
        return self._size

    def reset_state(self):
        super().reset_state()
        self._guard = DataFlowReentrantGuard()
        self._take_env()
        self._reset_indexed()

    def _take_env(self):
        env = _Env.acquire(self.lmdb_path)
        old, self._env = self._env, env
        if old is not None:
            old.release()
        return env

    def _env_here(self):
        env = self._env
        if env is None or env.pid != os.getpid():
            env = self._take_env()
        return env

    def close(self):
        """Release this reader's use of the shared environment (``reset_state()`` takes it
        again)."""
        env, self._env = self._env, None
        if env is not None:
            env.release()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_env"] = None
        state.pop("_guard", None)
        return state

    def _where(self, key):
        return f"LMDB {self.lmdb_path}, record {bytes(key)!r}"

    def _pairs(self, txn, indices, start):
        """(key, value) of a pass in ``txn`` from its ``start``-th record (values as the
        transaction gives them); a shuffled pass visits ``self.keys[i]`` for ``i`` in
        ``indices``."""
        if self.shuffle:
            keys = self.keys
            get = txn.get
            for i in indices:
                k = keys[i]
                yield k, get(k)
        else:
            cursor = txn.cursor()
            if start:
                skip = start             # walk keys only up to the resumed position
                more = cursor.first()
                while more and skip:
                    if cursor.key() != _KEYS:
                        skip -= 1
                    more = cursor.next()
                if not more:
                    return
                pairs = cursor.iternext()
            else:
                pairs = cursor
            for k, v in pairs:
                if k != _KEYS:
                    yield k, v

    @contextlib.contextmanager
    def _reading(self):
        """Errors of LMDB or of the page scan, as LMDBFormatError naming the file."""
        lmdb = _lmdb("LMDBData")
        try:
            yield
        except (lmdb.Error, _lmdbscan.ScanError) as e:
            raise LMDBFormatError(f"LMDB {self.lmdb_path}: {type(e).__name__}: {e}") from None

    def __iter__(self):
        # the pass begins at iter(), not at the first next() (see checkpoint.PassPosition)
        indices, start = self._pass_indices()
        return self._counted_items(self._raw_pass(indices, start), start)

    def _raw_pass(self, indices, start):
        with _guard_of(self):
            env = self._env_here()
            with self._reading(), env.env.begin() as txn:
                if not self.shuffle:
                    env.check_tree()        # before py-lmdb's cursor walks the pages
                for k, v in self._pairs(txn, indices, start):
                    yield [k, v]

    def _decoded(self, allow_pickle):
        """The decoded values of one pass (what ``LMDBSerializer.load`` yields)."""
        indices, start = self._pass_indices()
        return self._counted_items(self._decoded_pass(allow_pickle, indices, start), start)

    def _decoded_pass(self, allow_pickle, indices, start):
        with _guard_of(self):
            env = self._env_here()
            with self._reading():
                if not self.shuffle:
                    env.check_tree()        # before py-lmdb's cursor walks the pages
                scan = None if self.shuffle or start else env.scan()
                if scan is not None:        # sequential: the pages, read from our own map
                    yield from self._decode(scan, allow_pickle, None)
                    return
                with env.env.begin(buffers=True) as txn:
                    if self.shuffle or start:
                        pairs = self._pairs(txn, indices, start)
                        yield from self._decode(pairs, allow_pickle, env)
                    else:
                        yield from self._decode_sequential(txn, allow_pickle, env)

    def _decode_sequential(self, txn, allow_pickle, env):
        """A whole pass in key order, through py-lmdb's cursor: runs of ``SmallBatch.size``
        values are taken without their keys, as bytes (copies, made faster than py-lmdb makes
        buffers), and a run of one layout is decoded column by column
        (:func:`codec.same_layout`: a file of small records). A run that is not one layout (or
        holds ``__keys__``) is read again as ``(key, buffer)`` pairs of ``txn`` (a ``buffers=True``
        transaction) and decoded value by value; after a run with a large value, or two such
        runs in a row, the rest of the pass is read that way (the file is not one of small
        records of one layout)."""
        size = codec.SmallBatch(allow_pickle).size
        same_layout, islice = codec.same_layout, itertools.islice
        failed = False
        with env.env.begin(buffers=False) as plain:
            cursor = plain.cursor()
            values = cursor.iternext(keys=False)
            while True:
                run = list(islice(values, size))
                if not run:
                    return
                try:
                    dps = same_layout(run)
                except Exception:       # not what it looked like: the slow path names errors
                    dps = None
                if dps is not None:
                    failed = False
                    yield from dps
                    continue
                ended = len(run) < size
                give_up = failed or max(map(len, run)) >= codec.ZERO_COPY_MIN
                pairs = _pairs_before(txn, None if ended else cursor.key(), len(run))
                del run
                yield from self._decode((kv for kv in pairs if kv[0] != _KEYS), allow_pickle,
                                        env)
                if ended:
                    return
                if give_up:
                    rest = txn.cursor()
                    if rest.set_key(cursor.key()) and rest.next():
                        yield from self._decode((kv for kv in rest.iternext() if kv[0] != _KEYS),
                                                allow_pickle, env)
                    return
                failed = True

    def _decode(self, pairs, allow_pickle, env):
        """Decoded values of ``(key, value)`` pairs; with ``env``, values are buffers into
        LMDB's map and large ones are first turned into views of our map of the file. Small
        msgpack values (the common case of files of small records) are decoded in batches."""
        loads, zero_copy_min, flat = codec.loads, codec.ZERO_COPY_MIN, codec.flat_list
        batch = codec.SmallBatch(allow_pickle)
        size = batch.size
        bufs, keys = [], []         # the small values queued for the batch, and their keys
        for k, v in pairs:
            if env is None and k == _KEYS:      # a scan sees every record
                continue
            if v is not None:
                n = len(v)
                if 0 < n < zero_copy_min and v[0] != 0x80:   # small, and not a pickle
                    bufs.append(v)
                    keys.append(k)
                    if len(bufs) >= size:
                        yield from self._flush(batch, bufs, keys)
                        bufs, keys = [], []
                    continue
                if n >= zero_copy_min and env is None and not bufs and v[0] != 0x80:
                    dp = flat(v)                # a scan's value: already a view of our map
                    if dp is not None:
                        yield dp
                        continue
            if bufs:
                yield from self._flush(batch, bufs, keys)
                bufs, keys = [], []
            if v is None:
                raise LMDBFormatError(f"{self._where(k)}: no such record")
            if len(v) >= zero_copy_min and env is not None:
                v = env.view(v) or bytes(v)
            try:
                dp = loads(v, allow_pickle=allow_pickle)
            except (codec.DecodeError, codec.PickleRefusedError) as e:
                raise type(e)(f"{self._where(k)}: {e}") from None
            yield dp
        if bufs:
            yield from self._flush(batch, bufs, keys)

    def _flush(self, batch, bufs, keys):
        try:
            dps = batch.decode_list(bufs)
        except codec.BatchError as b:
            yield from b.done
            e, where = b.error, self._where(keys[b.index])
            if isinstance(e, codec.PickleRefusedError):
                raise codec.PickleRefusedError(f"{where}: {e}") from None
            raise codec.DecodeError(f"{where}: the value is neither a pickle nor valid "
                                    f"msgpack(-numpy): {type(e).__name__}: {e}") from None
        yield from dps


def _pairs_before(txn, key, n):
    """The ``n`` records of ``txn`` that end with ``key`` (None: with the last record), as
    ``(key, value)`` pairs in key order."""
    back = txn.cursor()
    if key is None:
        back.last()
    else:
        back.set_key(key)
    pairs = [back.item()]
    for _ in range(n - 1):
        back.prev()
        pairs.append(back.item())
    pairs.reverse()
    return pairs


class _DecodedLMDBData(ProxyDataFlow):
    """What ``LMDBSerializer.load`` returns: the decoded datapoints of an :class:`LMDBData`
    (``self.ds``), in its order; its position is its reader's. A record that decodes to
    ``None`` is dropped, as tensorpack's ``MapData(LMDBData, loads)`` drops it."""

    def __init__(self, ds, allow_pickle):
        super().__init__(ds)
        self.allow_pickle = allow_pickle

    def __iter__(self):
        return (dp for dp in self.ds._decoded(self.allow_pickle) if dp is not None)


class LMDBDataDecoder(MapData):
    """``decoder(key, value)`` applied to every ``[key, value]`` of ``lmdb_data`` (an
    :class:`LMDBData`); a ``None`` result drops the record, as in tensorpack."""

    def __init__(self, lmdb_data, decoder):
        if not callable(decoder):
            raise TypeError(f"LMDBDataDecoder: decoder must be callable as decoder(key, value), "
                            f"got {decoder!r:.80}")
        self.decoder = decoder
        super().__init__(lmdb_data, self._decode)

    def _decode(self, dp):
        return self.decoder(dp[0], dp[1])


def CaffeLMDB(lmdb_path, shuffle=True, keys=None):
    """An LMDB written by Caffe: datapoints ``[image, label]``, the image an HWC array (a
    transposed view of a writable copy of the record's CHW data, as tensorpack's
    ``np.fromstring`` gives it: uint8 from ``data``, float32 from ``float_data``).

    The ``caffe.Datum`` protobuf is parsed here (no Caffe, protoc or download). A record that is
    not a Datum, or holds an encoded (JPEG/PNG) image, raises an error naming the file and key.
    """
    _lmdb("CaffeLMDB")
    return LMDBDataDecoder(LMDBData(lmdb_path, shuffle=shuffle, keys=keys),
                           _CaffeDecoder(as_path("CaffeLMDB", lmdb_path, "lmdb_path")))


class _CaffeDecoder:
    def __init__(self, path):
        self.path = path

    def __call__(self, key, value):
        where = f"LMDB {self.path}, record {bytes(key)!r}"
        if value is None:
            raise LMDBFormatError(f"{where}: no such record")
        try:
            datum = _parse_datum(value)
        except ValueError as e:
            raise LMDBFormatError(f"{where}: not a caffe.Datum protobuf ({e})") from None
        c, h, w = datum.get(1, 0), datum.get(2, 0), datum.get(3, 0)
        if datum.get(7):
            raise LMDBFormatError(f"{where}: the Datum holds an encoded image (encoded=true); "
                                  "decode its data bytes with an image library instead")
        if 4 in datum and len(datum[4]):
            img = np.frombuffer(datum[4], np.uint8)     # a bytearray: writable, as in tensorpack
        elif 6 in datum:
            img = np.asarray(datum[6], np.float32)
        else:
            raise LMDBFormatError(f"{where}: the Datum has neither data nor float_data")
        if img.size != c * h * w:
            raise LMDBFormatError(f"{where}: the Datum holds {img.size} values for "
                                  f"channels x height x width = {c}x{h}x{w}")
        return [img.reshape(c, h, w).transpose(1, 2, 0), datum.get(5, 0)]


def _varint(buf, pos):
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _parse_datum(buf):
    """The fields of a ``caffe.Datum`` message: {1: channels, 2: height, 3: width, 4: data
    (a bytearray, the one copy of the image bytes), 5: label (int32), 6: float_data (list of
    float), 7: encoded (bool)}. Unknown fields are skipped."""
    buf = memoryview(buf).cast("B")
    out = {}
    pos, n = 0, len(buf)
    while pos < n:
        tag, pos = _varint(buf, pos)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            v, pos = _varint(buf, pos)
            if field == 5 and v >= 1 << 63:        # int32 negative: 10-byte two's complement
                v -= 1 << 64
            out[field] = v
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > n:
                raise ValueError(f"field {field} runs past the end of the record")
            chunk = buf[pos:pos + size]
            pos += size
            if field == 6:                          # packed repeated float
                if size % 4:
                    raise ValueError("packed float_data length is not a multiple of 4")
                out.setdefault(6, []).extend(np.frombuffer(chunk, "<f4").tolist())
            else:
                out[field] = bytearray(chunk) if field == 4 else chunk
        elif wire == 5:
            if pos + 4 > n:
                raise ValueError("truncated fixed32 field")
            if field == 6:
                out.setdefault(6, []).append(float(np.frombuffer(buf, "<f4", 1, pos)[0]))
            pos += 4
        elif wire == 1:
            pos += 8
        else:
            raise ValueError(f"unsupported wire type {wire} of field {field}")
        if pos > n:
            raise ValueError("truncated record")
    for f in (1, 2, 3):
        if f in out and not isinstance(out[f], int):
            raise ValueError(f"field {f} is not an integer")
    return out


# -- the serializer ------------------------------------------------------------------------------
class LMDBSerializer:
    """Write a dataflow to an LMDB and read it back, in tensorpack's layout (see the module doc).
    """

    @staticmethod
    def save(df, path, write_frequency=5000, *, format="msgpack"):
        """Write every datapoint of one pass of ``df`` to the LMDB ``path`` (a file that must not
        exist, or an existing directory without ``data.mdb``).

        The file is written under a temporary name beside the target and renamed when complete
        and flushed to disk, so an error or a crash never leaves a partial LMDB at ``path``.

        Args:
            df (DataFlow): the datapoints (``reset_state()`` is called here, as in tensorpack).
            path (str): the LMDB file or directory.
            write_frequency (int): commit a transaction every this many datapoints (also every
                64 MiB of values, to bound the memory held).
            format (str): "msgpack" (default; tensorpack reads it with
                ``TENSORPACK_SERIALIZE=msgpack``) or "pickle" (tensorpack's default).
        """
        lmdb = _lmdb("LMDBSerializer")
        df = as_dataflow(df)          # tensorpack's, say
        if not isinstance(df, DataFlow):
            raise TypeError(f"LMDBSerializer.save: df must be a DataFlow, got {type(df).__name__}")
        if format not in codec.FORMATS:
            raise ValueError(f"LMDBSerializer.save: unknown format {format!r}: expected one of "
                             f"{codec.FORMATS}")
        write_frequency = check_int("LMDBSerializer.save: write_frequency", write_frequency, 1,
                                    whole_floats=True)
        path = as_path("LMDBSerializer.save", path)
        data_file, lock_file, _ = _layout(path)
        if os.path.exists(data_file):
            raise FileExistsError(f"LMDB file {data_file} exists!")
        check_target(data_file)
        df.reset_state()
        remove_stale(data_file)         # what writers killed before left (see _files)
        tmp = f"{aside_prefix(data_file)}{secrets.token_hex(4)}.tmp"
        tmp_lock = tmp + "-lock"
        # A write map: LMDB writes pages straight into a shared map of the file, not into
        # malloc'd pages it then pwrite()s: for 150 KB values about half the system time (the
        # file is sized to the map while it is written, and cut to its pages at the end). No
        # sync per commit: a thread flushes what the commits wrote while the next values are
        # encoded (_writeback), and one flush at the end, before the rename, waits for the rest.
        env = lmdb.open(tmp, subdir=False, map_size=_WRITE_MAP_SIZE, readonly=False,
                        meminit=False, map_async=True, sync=False, writemap=True)
        try:
            with _writeback(tmp) as kick:
                _write(env, df, path, write_frequency, format, lmdb, kick)
            used = _used_bytes(env)
            env.sync(True)
            env.close()
            os.truncate(tmp, used)
            os.replace(tmp, data_file)
            os.replace(tmp_lock, lock_file)
        except BaseException:
            env.close()
            for f in (tmp, tmp_lock):
                with contextlib.suppress(OSError):
                    os.unlink(f)
            raise

    @staticmethod
    def load(path, shuffle=True, *, allow_pickle=True):
        """The datapoints of an LMDB written by :meth:`save` (or by tensorpack 0.11 with either
        encoding; the encoding is told from the bytes).

        Call ``reset_state()`` before iterating. With ``shuffle=True`` (the default, as in
        tensorpack) each pass reads in random order; ``shuffle=False`` reads sequentially, which
        is much faster on disk (combine it with ``LocallyShuffleData``). Arrays of msgpack
        datapoints are read-only (see the module doc about views). A record that decodes to
        ``None`` is dropped, as in tensorpack (``len()`` counts it).

        Args:
            path (str): the LMDB file or directory.
            shuffle (bool): random order per pass.
            allow_pickle (bool): accept pickled datapoints. With False a pickle LMDB raises
                ``codec.PickleRefusedError`` here: unpickling runs whatever code the file names.
        """
        _lmdb("LMDBSerializer")
        ds = LMDBData(path, shuffle=shuffle, allow_pickle=allow_pickle)
        _check_layout(ds, allow_pickle)
        return _DecodedLMDBData(ds, allow_pickle)

    @staticmethod
    def _deserialize_lmdb(dp):
        """The datapoint of one ``[key, value]`` pair of :class:`LMDBData` (tensorpack 0.11's
        private decoder, which code written for tensorpack calls to decode ``LMDBData`` records
        in its own map function): ``dp[1]`` decoded with either encoding (told from the bytes),
        pickle included, as tensorpack's ``loads``."""
        return codec.loads(dp[1])


def _check_layout(ds, allow_pickle):
    """Refuse, when loading, an LMDB that ``save`` cannot have written or that ``allow_pickle``
    forbids, naming the file and the record."""
    path = ds.lmdb_path
    if not ds.has_keys_record:
        raise LMDBFormatError(f"LMDB {path}: no {_KEYS!r} record, so it was not written by "
                              "LMDBSerializer.save (read other LMDBs with LMDBData)")
    if allow_pickle:
        return
    env = _Env.acquire(path)
    try:
        with env.env.begin() as txn:
            for key, value in ((_KEYS, txn.get(_KEYS)), (b"%08d" % 0, txn.get(b"%08d" % 0))):
                if value is not None and codec.sniff(value) == "pickle":
                    raise codec.PickleRefusedError(
                        f"LMDB {path}, record {key!r}: the file holds pickles (tensorpack's "
                        "default encoding), and loading a pickle runs whatever code its bytes "
                        "name; refused because allow_pickle=False. Pass allow_pickle=True only "
                        "for a file you trust, or rewrite it with format='msgpack'.")
    finally:
        env.release()


def _write(env, df, path, write_frequency, format, lmdb, kick=lambda: None):
    """Put every datapoint of ``df``, then the ``__keys__`` record, committing every
    ``write_frequency`` datapoints or ``_PENDING_BYTES`` of values.

    The map grows before a transaction could fill it: when the uncommitted values and the next
    one might not fit (a generous bound: each value's bytes and ``_PAGES_PER_VALUE`` pages, plus
    ``_MARGIN_PAGES``), the transaction is committed first and the map enlarged. A full map
    aborts the whole transaction, and putting its datapoints again would mean encoding them
    again, after the source may have changed them in place (a reused buffer). That remains only
    the fallback for a bound that falls short."""
    dumps = codec.Encoder(format)
    psize = env.stat()["psize"]
    per_value, margin = _PAGES_PER_VALUE * psize, _MARGIN_PAGES * psize
    keys = []
    # The uncommitted datapoints, for the fallback. Keeping the datapoints, not their
    # encodings, lets each encoding's memory be reused by the next one: fresh memory for every
    # 150 KB value cost more than the write. (The encoder packs every value into one buffer.)
    pending, pending_bytes = [], 0
    room = env.info()["map_size"] - _used_bytes(env) - margin    # for this transaction
    taken = 0                                                     # of room, by the bound
    txn = env.begin(write=True)
    try:
        for i, dp in enumerate(df):
            key = b"%08d" % i
            try:
                value = dumps(dp)
            except Exception as e:
                raise TypeError(f"LMDBSerializer.save({path!r}): datapoint {i} (a "
                                f"{type(dp).__name__}) cannot be encoded as {format}: {e}"
                                f"{codec.pickle_hint(format)}") \
                    from e
            need = len(value) + per_value
            if taken + need > room:
                _commit(env, txn, pending, lmdb, format)
                pending, pending_bytes, taken = [], 0, 0
                room = _grow(env, need + _PENDING_BYTES + per_value, margin)
                txn = env.begin(write=True)
            taken += need
            keys.append(key)
            pending.append((key, dp))
            pending_bytes += len(value)
            try:
                txn.put(key, value, append=i < 10**8)
            except lmdb.MapFullError:
                txn = _grow_and_replay(env, txn, pending, lmdb, format)
                room = env.info()["map_size"] - _used_bytes(env) - margin
            del value
            if len(pending) >= write_frequency or pending_bytes >= _PENDING_BYTES:
                _commit(env, txn, pending, lmdb, format)
                kick()
                txn = env.begin(write=True)
                pending, pending_bytes, taken = [], 0, 0
                room = env.info()["map_size"] - _used_bytes(env) - margin
        value = dumps(keys)
        if taken + len(value) + per_value > room:
            _commit(env, txn, pending, lmdb, format)
            pending = []
            _grow(env, len(value) + per_value, margin)
            txn = env.begin(write=True)
        pending.append((_KEYS, keys))
        try:
            txn.put(_KEYS, value)
        except lmdb.MapFullError:
            txn = _grow_and_replay(env, txn, pending, lmdb, format)
        _commit(env, txn, pending, lmdb, format)
    except BaseException:
        txn.abort()
        raise


# The bound on what a transaction takes of the map (see _write): a leaf page and a page of the
# tree's copy-on-write per value, and a margin for the free list.
_PAGES_PER_VALUE = 2
_MARGIN_PAGES = 16


@contextlib.contextmanager
def _writeback(path):
    """A function that has a thread flush the file's pages to disk (``fdatasync``), so that the
    disk writes what the last transactions wrote while this thread encodes the next ones, and
    the flush before the rename finds little left (4,000 values of 150 KB: 3,379 and 3,570
    datapoints/s against 2,375 and 3,327 with the one flush at the end, and a lowest run of
    3,112 against 1,867; the page cache otherwise holds it all until that flush). A call while
    a flush runs asks for one more after it. The thread ends, its flush done, when the block
    does."""
    fd = os.open(path, os.O_RDONLY)
    wanted, stop = threading.Event(), threading.Event()

    def flush():
        while True:
            wanted.wait()
            wanted.clear()
            if stop.is_set():
                return
            try:
                os.fdatasync(fd)
            except OSError:
                return              # the final sync reports what is wrong
    t = threading.Thread(target=flush, name="dataflow-lmdb-writeback", daemon=True)
    t.start()
    try:
        yield wanted.set
    finally:
        stop.set()
        wanted.set()
        t.join()
        os.close(fd)


def _used_bytes(env):
    return (env.info()["last_pgno"] + 1) * env.stat()["psize"]


def _grow(env, needed, margin):
    """Double the map until ``needed`` bytes fit beyond its used pages and ``margin`` (no
    transaction may be open); return the room left for a transaction."""
    size, used = env.info()["map_size"], _used_bytes(env)
    while size - used - margin < needed:
        size *= 2
    env.set_mapsize(size)
    return size - used - margin


def _commit(env, txn, pending, lmdb, format):
    """Commit ``txn``; a full map at the commit (the free list needs pages too) is the
    fallback's case: grow and put ``pending`` again, then commit that."""
    while True:
        try:
            txn.commit()
            return
        except lmdb.MapFullError:
            txn = _grow_and_replay(env, txn, pending, lmdb, format)


def _grow_and_replay(env, txn, pending, lmdb, format):
    """After MapFullError: abort, double the map, and put the uncommitted datapoints again."""
    while True:
        txn.abort()
        env.set_mapsize(env.info()["map_size"] * 2)
        txn = env.begin(write=True)
        try:
            for k, dp in pending:
                txn.put(k, codec.dumps(dp, format))
            return txn
        except lmdb.MapFullError:
            continue
