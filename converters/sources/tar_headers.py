"""A tar's entries from its 512-byte headers: each name and where its data lies, nothing extracted.

``tarfile`` builds a TarInfo of every field of every header and reads each through a seek and a
buffered read: 35 us a WebDataset sample (two members) on the bench's tars, a third of packing
them. A memory map did better (22 us a sample in all) but paid a page fault to map each header's
page and the unmapping after; the pages are in the cache already, so copying a few KB at each
header (one ``pread`` serves a sample's headers and its ``.cls`` member, which lie side by side)
costs less. Only the name, size and type are parsed, inline for the common spelling, and the
checksum is summed by zlib (two halves' Adler-32 first sums, exact below 65521) instead of a
Python loop over 512 bytes: 5 us a sample (6.5x tarfile), on disk or over an object store's
ranged GETs (``StoreFile``, which reads ahead in blocks).

It reads what WebDataset writers emit: ustar and GNU headers, GNU long names (``L``), pax
``path`` and ``size`` records (``x``; global ``g`` ignored). A header whose checksum fails, a
member that ends past the file, or a missing end-of-archive is TarDamaged, never a quiet stop.
So is a long name or pax member over MAX_HEADER_MEMBER (checked before a byte of it is read: its
header may declare gigabytes) and a pax record whose length, spelling or size is not one a writer
makes (a length of 0 would never move the parse on).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, NamedTuple

from fastload.converters.sources.items import escaped

from fastload.format.files import open_regular

ReadAt = Callable[[int, int], bytes]  # (offset, count) → up to ``count`` bytes of the tar from ``offset``

BLOCK = 512
CHUNK = 8192  # read at a header: a sample's small members and the next header usually come with it
_ZEROS = bytes(BLOCK)
REGULAR_KINDS = (b"0", b"\0", b"7")  # type flags of a file (not a folder, link or device)
FOLDER_KIND = b"5"
_SPACES_SUM = 8 * ord(" ")  # the checksum field itself counts as spaces
MAX_HEADER_MEMBER = 2**20
"""Largest GNU long name (``L``) or pax member (``x``, ``g``) read: a path is at most 4 KB on any file
system, and GNU tar's and Python's writers make these members a few hundred bytes."""


class TarDamaged(Exception):
    """The tar cannot be read past ``offset``: ``reason`` says why (naming the byte, and the member
    the damage is in or comes after), ``name`` names the member the damage is in, if any."""

    def __init__(self, offset: int, reason: str, name: str | None = None) -> None:
        super().__init__(reason)
        self.offset, self.reason, self.name = offset, reason, name


class NotATar(ValueError):
    """The file does not start with a tar header (a .tar.gz, or no tar at all)."""


class TarEntry(NamedTuple):
    name: str  # as written, UTF-8 (undecodable bytes kept as surrogates)
    offset: int  # of its data in the file
    size: int
    kind: bytes  # the header's type flag (b"0": a file, b"5": a folder, ...)


class TarWalk:
    """The entries of the tar of ``size`` bytes that ``read_at`` reads, in the order written
    (iterate once); ``read`` gives a member's bytes, from the bytes read with its header when there."""

    def __init__(self, read_at: ReadAt, size: int, chunk: int = CHUNK) -> None:
        self.read_at, self.size, self.chunk = read_at, size, chunk
        self.buf, self.base = b"", 0  # the bytes read last, and where they start in the tar

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` (fewer where the tar ends first)."""
        at = offset - self.base
        if 0 <= at and at + size <= len(self.buf):
            return self.buf[at:at + size]
        return self.read_at(offset, size)

    def __iter__(self) -> Iterator[tuple[str, int, int, bytes]]:
        """``(name, offset, size, kind)`` of each entry (TarEntry's fields): the loop every header
        of every tar goes through, so the common case (tarfile's and GNU tar's spelling of the
        size and checksum, a name without a ustar prefix) is parsed inline."""
        size, read_at, chunk, adler32 = self.size, self.read_at, self.chunk, zlib.adler32
        buf, base = self.buf, self.base
        pos, long_name, pax = 0, None, None
        last = None  # the last member given: a damaged header's message says it comes after it
        while True:
            at = pos - base
            if at < 0 or at + BLOCK > len(buf):
                buf = self.buf = read_at(pos, chunk)
                base = self.base = pos
                at = 0
            block = buf[at:at + BLOCK]
            if block == _ZEROS:
                if self.read(pos + BLOCK, BLOCK) != _ZEROS:
                    raise TarDamaged(pos, f"damaged or truncated after byte {pos}{_after(last)} (no end-of-archive blocks)")
                return
            field = block[148:156]
            # Adler-32's first sum is 1 + the bytes' sum, mod 65521: exact for 256 bytes (at most 65280)
            unsigned = ((adler32(block[:256]) & 0xFFFF) + (adler32(block[256:]) & 0xFFFF) - 2
                        - sum(field) + _SPACES_SUM)
            # spelled as tarfile, GNU tar and Go write it, or else parsed
            if len(block) < BLOCK or field != b"%06o\0 " % unsigned and not _checksum_ok(block, unsigned):
                if pos == 0:
                    raise NotATar("a gzip file (.tar.gz)" if block[:2] == b"\x1f\x8b" else "no tar header at its start")
                reason = "truncated" if len(block) < BLOCK else "a damaged header"
                raise TarDamaged(pos, f"{reason} at byte {pos}{_after(last)} (no end-of-archive blocks after it)")
            kind = block[156:157]
            try:
                length = int(block[124:135], 8) if block[135] == 0 else -1  # 11 digits and a NUL, as tarfile writes
            except ValueError:
                length = -1
            if length < 0:  # NUL- or space-padded, 12 digits, base-256
                try:
                    length = _number(block[124:136])
                except ValueError:  # a size that is no number, under a checksum that holds
                    raise TarDamaged(pos, f"a damaged header at byte {pos} (its size is not a number)") from None
            if long_name is not None:
                name = long_name
            else:
                raw = block[:100].split(b"\0", 1)[0]
                if block[345] and block[257:263] == b"ustar\0":  # POSIX: a prefix folds long paths
                    raw = block[345:500].split(b"\0", 1)[0] + b"/" + raw
                name = raw.decode("utf-8", "surrogateescape")
            if pax is not None and kind not in b"xXgL":
                length = int(pax.get("size", length))  # digits only: _pax checked them
                name = long_name or pax.get("path") or name
            start = pos + BLOCK
            if length < 0 or start + length > size:
                raise TarDamaged(pos, f"member {name} is truncated (its {length} bytes end past the file's {size})",
                                 name)
            if kind in b"LxXg" and length > MAX_HEADER_MEMBER:
                what = "long name" if kind == b"L" else "pax header"
                raise TarDamaged(pos, f"the {what} member at byte {pos} declares {length} bytes, over the "
                                 f"{MAX_HEADER_MEMBER} a {what} may hold (not read)", name)
            if kind == b"L":
                long_name = self.read(start, length).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            elif kind == b"x" or kind == b"X":
                try:
                    pax = _pax(self.read(start, length))
                except ValueError as exc:
                    raise TarDamaged(pos, f"a damaged pax header at byte {pos} ({exc})", name) from None
            elif kind != b"g":
                yield name, start, length, kind
                long_name, pax = None, None
                last = name
            pos = start + (length + BLOCK - 1) // BLOCK * BLOCK


@contextmanager
def walk_file(path: Path) -> Iterator[TarWalk]:
    """A walk of the local tar at ``path``, its headers read with ``pread``."""
    fd = open_regular(path)
    try:
        yield TarWalk(lambda offset, count: os.pread(fd, count, offset), os.fstat(fd).st_size)
    finally:
        os.close(fd)


def walk_stream(f: IO[bytes], size: int) -> TarWalk:
    """A walk of the seekable tar ``f`` of ``size`` bytes (an object in a store, read ahead in blocks)."""

    def read_at(offset: int, count: int) -> bytes:
        f.seek(offset)
        return f.read(count)

    return TarWalk(read_at, size)


def tar_entries(data: bytes) -> Iterator[TarEntry]:
    """Each entry of the tar whose bytes are ``data``, in the order written."""
    return (TarEntry(*entry) for entry in TarWalk(lambda offset, count: data[offset:offset + count], len(data)))


def _after(last: str | None) -> str:
    return f", after member {escaped(last)}" if last is not None else ""


def _checksum_ok(block: bytes, unsigned: int) -> bool:
    """Whether the checksum field holds ``unsigned`` (the header's sum) however it is spelled, or
    the sum of its bytes taken as signed (old writers)."""
    try:
        stored = _number(block[148:156])
    except ValueError:
        return False
    if stored == unsigned:
        return True
    return stored == unsigned - 256 * sum(1 for b in block[:148] + block[156:] if b > 127)  # old signed sums


def _number(field: bytes) -> int:
    if field[0] & 0x80:  # GNU base-256, for sizes past 8 GB
        return int.from_bytes(field[1:], "big")
    try:
        return int(field.rstrip(b"\0 ") or b"0", 8)
    except ValueError:  # digits, a NUL, then more bytes
        text = field.split(b"\0", 1)[0].strip()
        return int(text, 8) if text else 0


def _pax(data: bytes) -> dict[str, str]:
    """The ``path`` and ``size`` of pax records (``"%d %s=%s\\n"``), the ones a member's extent needs;
    ValueError saying which record is not spelled so (each record's length counts itself, so every
    record moves the parse on by at least one more byte than its length's digits)."""
    out, pos = {}, 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.find(b" ", pos, pos + 21)
        digits = data[pos:space]
        if space < 0 or not digits.isdigit():
            raise ValueError(f"its record at byte {pos} does not start with a length and a space")
        length = int(digits)
        end = pos + length
        if length <= space + 1 - pos or end > len(data) or data[end - 1:end] != b"\n":
            raise ValueError(f"its record at byte {pos} declares a length of {length}, which does not end "
                             f"at a newline within its {len(data)} bytes")
        key, _, value = data[space + 1:end - 1].partition(b"=")
        # 20 digits hold any size a tar can carry; int() refuses over 4,300 digits with a bare error
        if key == b"size" and (not value.isdigit() or len(value) > 20):
            raise ValueError(f"its size record holds {value[:40]!r}, not a number of bytes")
        if key in (b"path", b"size"):
            out[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos = end
    return out
