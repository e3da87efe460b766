"""A sequential scan of an LMDB data file that reads its B+tree pages from a memory map.

Why: ``LMDBSerializer.load(path, shuffle=False)`` reads every record in key order, and going
through py-lmdb's cursor costs more per record than the rest of the work for small records, and
gives no way to keep a large value's bytes alive (its buffers point into a map that closes with
the environment). Reading the pages from our own ``mmap`` of the file gives both: records at a
few hundred nanoseconds each, and values that are slices of a map their arrays keep alive.

The on-disk format is LMDB 0.9's (the one py-lmdb bundles), 64-bit little-endian only:

* pages of ``psize`` bytes; page ``n`` starts at byte ``n * psize``. A page header (16 bytes):
  ``pgno u64 | pad u16 | flags u16 | lower u16 | upper u16`` (flags: 1 branch, 2 leaf,
  4 overflow, 8 meta; an overflow page has ``pages u32`` in place of lower/upper); then
  ``(lower - 16) / 2`` node offsets (u16, from the page start), one per key, in key order.
* pages 0 and 1 are meta pages; the valid one with the larger ``txnid`` is current. The meta
  (at byte 16 of its page): ``magic u32 (0xBEEFC0DE) | version u32 (1) | address u64 |
  mapsize u64 | free db (48 bytes; its first u32 is psize) | main db (48 bytes) | last_pgno u64 |
  txnid u64``; a db is ``pad u32 | flags u16 | depth u16 | branch_pages u64 | leaf_pages u64 |
  overflow_pages u64 | entries u64 | root u64`` (root all ones when empty).
* a node: ``lo u16 | hi u16 | flags u16 | ksize u16 | key | data``. In a branch page the child
  page is ``lo | hi << 16 | flags << 32``; in a leaf page the value size is ``lo | hi << 16``
  and, with node flag 1 (big data), the data is the u64 number of the first overflow page and
  the value starts 16 bytes into it.

:func:`open_scan` reads the meta and checks it against what py-lmdb reports for the same file
(page size, entry count, last page); anything unexpected (another format version, duplicate
keys, big-endian) returns ``None`` and the caller uses py-lmdb's cursor instead. A scan that
meets a page that is not what the tree says raises :class:`ScanError` (never reads outside the
map: every read is a bounds-checked slice).
"""
import struct
import sys

__all__ = ["open_scan", "Scan", "ScanError"]

_HDR = 16
_P_BRANCH, _P_LEAF = 0x01, 0x02
_F_BIGDATA = 0x01
_MAGIC, _VERSION = 0xBEEFC0DE, 1
_INVALID = (1 << 64) - 1
_NODE = struct.Struct("<HHHH")
_U16, _U64 = struct.Struct("<H"), struct.Struct("<Q")
_PAGE = struct.Struct("<QHHHH")
_META = struct.Struct("<IIQQ")


class ScanError(ValueError):
    """A page of the file is not what the tree says it is."""


def _read_meta(mv, off):
    magic, version, _, _ = _META.unpack_from(mv, off + _HDR)
    if magic != _MAGIC or version != _VERSION:
        return None
    base = off + _HDR + 24
    psize = struct.unpack_from("<I", mv, base)[0]
    main = base + 48
    flags, depth = struct.unpack_from("<HH", mv, main + 4)
    entries, root = struct.unpack_from("<QQ", mv, main + 32)
    last_pgno, txnid = struct.unpack_from("<QQ", mv, base + 96)
    return {"psize": psize, "flags": flags, "depth": depth, "entries": entries, "root": root,
            "last_pgno": last_pgno, "txnid": txnid}


def open_scan(mv, stat, info):
    """A :class:`Scan` of the file mapped as ``mv`` (a byte memoryview), or ``None`` when the
    file is not one this module reads or does not match py-lmdb's ``stat``/``info``."""
    if sys.byteorder != "little" or len(mv) < 2 * _HDR + 136:
        return None
    try:
        first = _read_meta(mv, 0)
        if first is None:
            return None
        second = _read_meta(mv, first["psize"]) if len(mv) >= 2 * first["psize"] else None
    except (struct.error, ValueError):
        return None
    metas = [m for m in (first, second) if m is not None]
    meta = max(metas, key=lambda m: m["txnid"])
    if (meta["psize"] != stat["psize"] or meta["entries"] != stat["entries"]
            or meta["depth"] != stat["depth"] or meta["last_pgno"] != info["last_pgno"]
            or meta["flags"] != 0 or len(mv) < (meta["last_pgno"] + 1) * meta["psize"]):
        return None
    return Scan(mv, meta)


class Scan:
    """Iterating yields ``(key, value)`` memoryviews (slices of the map) in key order."""

    def __init__(self, mv, meta):
        self.mv = mv
        self.psize = meta["psize"]
        self.root = meta["root"]
        self.depth = meta["depth"]
        self.entries = meta["entries"]

    def _page(self, pgno, want):
        psize = self.psize
        off = pgno * psize
        if pgno > _INVALID // psize or off + psize > len(self.mv):
            raise ScanError(f"page {pgno} is outside the file")
        got, _, flags, lower, _ = _PAGE.unpack_from(self.mv, off)
        if got != pgno or not flags & want:
            raise ScanError(f"page {pgno} is not the {'branch' if want == 1 else 'leaf'} page "
                            "the tree points to")
        n = (lower - _HDR) >> 1
        if n < 0 or _HDR + 2 * n > psize:
            raise ScanError(f"page {pgno} has a corrupt header")
        return off, struct.unpack_from(f"<{n}H", self.mv, off + _HDR)

    def _leaves(self):
        """Offsets and node offsets of the leaf pages, in order (depth-first)."""
        if self.root == _INVALID:
            return
        stack = [(self.root, 1)]
        while stack:
            pgno, level = stack.pop()
            if level == self.depth:
                yield self._page(pgno, _P_LEAF)
                continue
            off, ptrs = self._page(pgno, _P_BRANCH)
            children = []
            for p in ptrs:
                lo, hi, flags, _ = _NODE.unpack_from(self.mv, off + p)
                children.append((lo | hi << 16 | flags << 32, level + 1))
            stack.extend(reversed(children))

    def check(self):
        """Walk every branch and leaf page of the tree (not the records): raise
        :class:`ScanError` where a page is not what the tree says, or the leaves hold another
        number of records than the header."""
        count = sum(len(ptrs) for _, ptrs in self._leaves())
        if count != self.entries:
            raise ScanError(f"the tree holds {count} records, its header says {self.entries}")

    def __iter__(self):
        mv, psize, unpack = self.mv, self.psize, _NODE.unpack_from
        count = 0
        for off, ptrs in self._leaves():
            count += len(ptrs)
            if count > self.entries:
                raise ScanError("the tree holds more records than its header says")
            for p in ptrs:
                node = off + p
                lo, hi, flags, ksize = unpack(mv, node)
                key_end = node + 8 + ksize
                size = lo | hi << 16
                if flags & _F_BIGDATA:
                    start = _U64.unpack_from(mv, key_end)[0] * psize + _HDR
                elif flags:
                    raise ScanError(f"a record of page {off // psize} has node flags {flags}")
                else:
                    start = key_end
                end = start + size
                if end > len(mv):
                    raise ScanError(f"a record of page {off // psize} points outside the file")
                yield mv[node + 8:key_end], mv[start:end]
        if count != self.entries:
            raise ScanError(f"the tree holds {count} records, its header says {self.entries}")
