"""LMDB page walk: find where every record of a shard lies in its file, checking the B-tree.

fastload reads LMDB shards without liblmdb: the file is an ordinary LMDB environment (any LMDB
tool opens it), but a record's bytes are contiguous in the file (inline in a leaf page, or on the
overflow pages after a 16-byte header), so once their offsets are known a read is one ``pread``
that releases the GIL and maps nothing. liblmdb would instead walk the B-tree under the GIL for
every record (py-lmdb holds it) and map the pages it touches, which then count as the reading
process's memory (the classic "LMDB leaks in my DataLoader workers" report).

So when a process opens a shard, its meta page and every branch and leaf page reachable from the
root are read and checked, up to ``PAGES_AT_ONCE`` pages in one call of ``read_many`` (a
shard in an object store pays one round of requests per tree level, not one per page): node offsets inside their page, keys and inline values
inside their node's page, child and overflow pages inside the file. Record bytes themselves are
not read: their checksums catch damage there. A shard of ~100 KB records has a few dozen such
pages per 256 MB; one of tiny records has one per ~4 KB of records.

Layout (LMDB 0.9, 64-bit): a 16-byte page header (pgno u64, pad u16, flags u16, lower u16,
upper u16); the meta page holds the two databases' records and the transaction id; a node is
(lo u16, hi u16, flags u16, key size u16, key, data).
"""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np

_HEADER = 16
_BRANCH, _LEAF, _OVERFLOW, _LEAF2, _SUBPAGE = 0x01, 0x02, 0x04, 0x20, 0x40
_BIGDATA = 0x01
_MAGIC = 0xBEEFC0DE
_INVALID = 2**64 - 1
# meta after the page header: magic, version, address, mapsize, then free and main db records
# (pad u32, flags u16, depth u16, 4 page/entry counts, root), then last page and txn id.
_META = struct.Struct("<IIQQ" + "IHHQQQQQ" * 2 + "QQ")
_NODE = struct.Struct("<HHHH")


class DamagedShard(Exception):
    """The shard's structure points outside itself; the message says where."""


class RecordPlaces:
    """Where each record of one shard lies: ``offset[position]`` (-1: no such key in the B-tree)
    and ``size[position]``, as the B-tree says."""

    def __init__(self, num_records: int) -> None:
        self.offset = np.full(num_records, -1, dtype=np.int64)
        self.size = np.zeros(num_records, dtype=np.uint32)  # LMDB's node size field is 32 bits

    def add(self, key: bytes, offset: int, size: int, pgno: int) -> None:
        position = int.from_bytes(key, "big")
        if len(key) != 8 or position >= len(self.offset):
            raise DamagedShard(f"page {pgno} holds key {key.hex()}, not the position of one of "
                               f"this shard's {len(self.offset)} records")
        self.offset[position] = offset
        self.size[position] = size


ReadAt = Callable[[int, int], bytes]  # read_at(offset, size): a local pread, or a ranged GET
ReadMany = Callable[[list[tuple[int, int]]], list[bytes]]  # read_many([(offset, size), ...])

PAGES_AT_ONCE = 256
"""Tree pages read in one call (1 MiB of 4 KiB pages in memory at most)."""


def locate_records(read_at: ReadAt, file_size: int, num_records: int,
                   read_many: ReadMany | None = None) -> RecordPlaces:
    """Walk the main database's B-tree of the LMDB file read through ``read_at`` (and
    ``read_many``, for many pages at once) and find its records, keyed by 8-byte big-endian
    positions below ``num_records``; raise DamagedShard."""
    places = RecordPlaces(num_records)
    many = read_many or (lambda ranges: [read_at(offset, size) for offset, size in ranges])
    page_size, root, last_page, flags = _meta(read_at, many, file_size)
    if flags:
        raise DamagedShard(f"the main database has flags {flags:#x}; fastload writes plain keys only")
    if root == _INVALID:
        return places  # an empty database
    pages = file_size // page_size
    if last_page >= pages:
        raise DamagedShard(f"the meta page says the file has {last_page + 1} pages, it has {pages}")
    todo, seen = [root], set()
    while todo:
        batch = todo[-PAGES_AT_ONCE:]
        del todo[-PAGES_AT_ONCE:]
        for pgno in batch:
            if not 2 <= pgno <= last_page or pgno in seen:
                raise DamagedShard(f"a page points to page {pgno} (file pages 2..{last_page}, or a loop)")
            seen.add(pgno)
        for pgno, page in zip(batch, many([(pgno * page_size, page_size) for pgno in batch])):
            _walk_page(page, pgno, last_page, page_size, todo, places)
    return places


def _walk_page(page: bytes, pgno: int, last_page: int, page_size: int, todo: list[int],
               places: RecordPlaces) -> None:
    """Check one branch or leaf page; its children go to ``todo``, its records to ``places``."""
    if len(page) < page_size:
        raise DamagedShard(f"the file ends inside page {pgno}")
    _, _, flags, lower, upper = struct.unpack_from("<QHHHH", page)
    if flags & (_LEAF2 | _SUBPAGE) or not flags & (_BRANCH | _LEAF):
        raise DamagedShard(f"page {pgno} has flags {flags:#x}, not a branch or leaf page")
    if not _HEADER <= lower <= upper <= page_size:
        raise DamagedShard(f"page {pgno} has bounds lower={lower} upper={upper}")
    for k in range((lower - _HEADER) // 2):
        (at,) = struct.unpack_from("<H", page, _HEADER + 2 * k)
        _walk_node(page, pgno, at, upper, bool(flags & _BRANCH), last_page, page_size, todo, places)


def _meta(read_at: ReadAt, read_many: ReadMany, file_size: int) -> tuple[int, int, int, int]:
    """(page size, main root, last page, main flags) from the meta page with the newer
    transaction, as liblmdb picks it (both read at once when the pages are 4 KiB, the usual)."""
    size = _HEADER + _META.size
    raw = read_many([(0, size), (4096, size)]) if file_size >= 2 * 4096 else [read_at(0, size)]
    first = _parse_meta(raw[0], 0)
    page_size = first[0] or 4096
    if page_size not in (4096, 8192, 16384, 32768, 65536) or file_size % page_size or file_size < 2 * page_size:
        raise DamagedShard(f"page size {page_size} does not fit a {file_size}-byte file")
    second = _parse_meta(raw[1] if page_size == 4096 else read_at(page_size, size), page_size)
    _, root, last_page, _, flags = max(first, second, key=lambda meta: meta[3])
    return page_size, root, last_page, flags


def _parse_meta(raw: bytes, offset: int) -> tuple[int, int, int, int, int]:
    """(page size, main root, last page, transaction id, main flags) of the meta page at ``offset``."""
    if len(raw) < _HEADER + _META.size:
        raise DamagedShard(f"the file ends inside the meta page at byte {offset}")
    fields = _META.unpack_from(raw, _HEADER)
    if fields[0] != _MAGIC:
        raise DamagedShard(f"the meta page at byte {offset} has lost its magic number")
    return fields[4], fields[19], fields[20], fields[21], fields[13]


def _walk_node(page: bytes, pgno: int, at: int, upper: int, branch: bool, last_page: int,
               page_size: int, todo: list[int], places: RecordPlaces) -> None:
    if not upper <= at <= page_size - _NODE.size:
        raise DamagedShard(f"page {pgno} has a node at offset {at}, outside its node area")
    lo, hi, flags, key_size = _NODE.unpack_from(page, at)
    end = at + _NODE.size + key_size
    if branch:
        if end > page_size:
            raise DamagedShard(f"page {pgno}: a key at offset {at} runs past the page")
        todo.append(lo | hi << 16 | flags << 32)
        return
    size = lo | hi << 16
    if flags not in (0, _BIGDATA):  # a sub-database or duplicate set liblmdb would descend into
        raise DamagedShard(f"page {pgno}: a node at offset {at} has flags {flags:#x}")
    if flags & _BIGDATA:
        if end + 8 > page_size:
            raise DamagedShard(f"page {pgno}: a node at offset {at} runs past the page")
        (first,) = struct.unpack_from("<Q", page, end)
        if not 2 <= first <= last_page or first * page_size + _HEADER + size > (last_page + 1) * page_size:
            raise DamagedShard(f"page {pgno}: a record of {size} bytes at page {first} runs past the file")
        offset = first * page_size + _HEADER  # the overflow pages' header, then the bytes
    elif end + size > page_size:
        raise DamagedShard(f"page {pgno}: a node at offset {at} runs past the page")
    else:
        offset = pgno * page_size + end
    places.add(page[at + _NODE.size:end], offset, size, pgno)
