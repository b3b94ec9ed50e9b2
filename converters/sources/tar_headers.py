"""A tar's entries from its 512-byte headers: each name and where its data lies, nothing extracted.

``tarfile`` builds a TarInfo of every field of every header and reads each through a seek and a
buffered read: 35 us a WebDataset sample (two members) on the bench's tars, a third of packing
them. Over a memory map, with only the name, size and type parsed, a header costs a few us. It
reads what WebDataset writers emit: ustar and GNU headers, GNU long names (``L``), pax ``path``
and ``size`` records (``x``; global ``g`` ignored). A header whose checksum fails, a member that
ends past the file, or a missing end-of-archive is TarDamaged, never a quiet stop. A tar read as
a stream (an object in a store) goes through tarfile, whose quiet stop at a damaged header the
end-of-archive check catches.
"""

from __future__ import annotations

import mmap
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

# add(name, offset, size, regular, folder, text): one entry; text() reads its bytes
AddEntry = Callable[[str, int, int, bool, bool, Callable[[], bytes]], None]

BLOCK = 512
_ZEROS = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")


class TarDamaged(Exception):
    """The tar cannot be read past ``offset``: ``reason`` says why, ``name`` names the member if any."""

    def __init__(self, offset: int, reason: str, name: str | None = None) -> None:
        super().__init__(reason)
        self.offset, self.reason, self.name = offset, reason, name


class NotATar(ValueError):
    """The file does not start with a tar header (a .tar.gz, or no tar at all)."""


@dataclass(frozen=True)
class TarEntry:
    name: str  # as written, UTF-8 (undecodable bytes kept as surrogates)
    offset: int  # of its data in the file
    size: int
    regular: bool  # a file, not a folder, link or device
    folder: bool


def tar_entries(data: memoryview | bytes) -> Iterator[TarEntry]:
    """Each entry of the tar whose bytes are ``data`` (a memory map), in the order written."""
    size = len(data)
    pos, long_name, pax = 0, None, {}
    while True:
        block = bytes(data[pos:pos + BLOCK])
        if block == _ZEROS:
            if bytes(data[pos + BLOCK:pos + 2 * BLOCK]) != _ZEROS:
                raise TarDamaged(pos, f"damaged or truncated after byte {pos} (no end-of-archive blocks)")
            return
        if len(block) < BLOCK or not _checksum_ok(block):
            if pos == 0:
                raise NotATar("a gzip file (.tar.gz)" if block[:2] == b"\x1f\x8b" else "no tar header at its start")
            reason = "truncated" if len(block) < BLOCK else "a damaged header"
            raise TarDamaged(pos, f"{reason} at byte {pos} (no end-of-archive blocks after it)")
        kind = block[156:157]
        length = int(pax["size"]) if "size" in pax and kind not in b"xXgL" else _number(block[124:136])
        start = pos + BLOCK
        name = long_name or pax.get("path") or _name(block)
        if start + length > size:
            raise TarDamaged(pos, f"member {name} is truncated (its {length} bytes end past the file's {size})", name)
        if kind == b"L":
            long_name = bytes(data[start:start + length]).split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        elif kind in (b"x", b"X"):
            pax = _pax(bytes(data[start:start + length]))
        elif kind != b"g":
            yield TarEntry(name, start, length, kind in _REGULAR, kind == b"5")
            long_name, pax = None, {}
        pos = start + (length + BLOCK - 1) // BLOCK * BLOCK


def _checksum_ok(block: bytes) -> bool:
    try:
        stored = _number(block[148:156])
    except ValueError:
        return False
    unsigned = sum(block) - sum(block[148:156]) + 8 * ord(" ")  # the field itself counts as spaces
    if stored == unsigned:
        return True
    return stored == unsigned - 256 * sum(1 for b in block[:148] + block[156:] if b > 127)  # old signed sums


def _number(field: bytes) -> int:
    if field[0] & 0x80:  # GNU base-256, for sizes past 8 GB
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _name(block: bytes) -> str:
    name = block[:100].split(b"\0", 1)[0]
    if block[257:263] == b"ustar\0":  # POSIX: a prefix folds long paths
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def _pax(data: bytes) -> dict[str, str]:
    """The ``path`` and ``size`` of pax records (``"%d %s=%s\\n"``), the ones a member's extent needs."""
    out, pos = {}, 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, _, value = data[space + 1:pos + length - 1].partition(b"=")
        if key in (b"path", b"size"):
            out[key.decode()] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out


def walk_mapped(path: Path, add: AddEntry) -> None:
    """``add`` each entry of the local tar at ``path``, its headers read through a memory map."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            for e in tar_entries(view):
                add(e.name, e.offset, e.size, e.regular, e.folder, lambda e=e: bytes(view[e.offset:e.offset + e.size]))
        finally:
            view.release()


def walk_stream(f: IO[bytes], size: int, add: AddEntry) -> None:
    """``add`` each entry of the tar ``f`` (``size`` bytes), read through tarfile."""
    try:
        archive = tarfile.open(fileobj=f, mode="r:")  # noqa: SIM115 - closed by the with below
    except tarfile.ReadError as exc:
        raise NotATar(str(exc)) from None
    with archive:
        for info in archive:
            if info.isreg() and info.offset_data + info.size > size:
                raise TarDamaged(info.offset, f"member {info.name} is truncated (its {info.size} bytes end past "
                                 f"the file's {size})", info.name)

            def text(info: tarfile.TarInfo = info) -> bytes:
                f.seek(info.offset_data)
                return f.read(info.size)

            add(info.name, info.offset_data, info.size, info.isreg(), info.isdir(), text)
        end = archive.offset
    f.seek(end)  # tarfile stops quietly at a damaged header: a tar ends in zero blocks
    tail = f.read(1024)
    if len(tail) < 1024 or tail.strip(b"\0"):
        raise TarDamaged(end, f"damaged or truncated after byte {end} (no end-of-archive blocks)")

