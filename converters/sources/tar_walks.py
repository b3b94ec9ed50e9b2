"""Each tar of a source walked once: its file members (name, key, where their data lies, a small
text member's bytes), what is left out and why, and the damage that ends the walk, if any.

A plain tar on disk is walked with ``pread``, one in a store through ranged GETs, a compressed one
forward through its decompressed stream (converters.sources.tar_streams): the same header walk
(converters.sources.tar_headers) for all three. Members are split as WebDataset splits them: a
member's key is its path up to the first dot of its file name (``a/0001.seg.png``: key ``a/0001``,
extension ``seg.png``, lower-cased).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NamedTuple

from fastload.converters.sources.items import Skip, SourceListing, escaped
from fastload.converters.sources.tar_headers import (
    FOLDER_KIND,
    REGULAR_KINDS,
    NotATar,
    TarDamaged,
    TarWalk,
    walk_file,
    walk_stream,
)
from fastload.converters.sources.tar_streams import StreamCheckFailed, StreamWalk, open_decompressed

from fastload.errors import SourceError

_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # WebDataset's own rule (webdataset.tariterators)
TEXT_EXTS = ("cls", "txt", "json")  # read with the headers into the index; the rest are payloads
MAX_TEXT_BYTES = 16 * 2**20


@dataclass(frozen=True)
class TarObject:
    """One tar: where it is (a path, or an object's URL: what its items name), its name, size and
    version (mtime, or the store's ETag), what a rewrite cannot keep, and how to open it."""

    path: Path
    name: str
    size: int
    mtime_ns: int
    stamp: tuple[int, int]
    open: Callable[[], IO[bytes]]
    local: bool = False  # a file on this machine: its headers are read with pread (tar_headers.walk_file)
    compression: str | None = None  # a compressed tar's ("gzip", "zstd", ...): walked as a stream


class Member(NamedTuple):
    name: str
    key: str
    ext: str  # lower-cased
    offset: int
    size: int
    text: bytes | None  # a text member's bytes (within MAX_TEXT_BYTES), read with the headers


@dataclass(frozen=True)
class Damage:
    """What ended a tar's walk: ``rel`` names it as a skip does (``tar/member`` or ``tar@byte``);
    ``whole``: the tar's compressed stream fails its own check, so none of its members is kept."""

    rel: str
    reason: str
    offset: int  # in the tar (a compressed one's: in its decompressed stream)
    whole: bool = False


class Walked(NamedTuple):
    members: list[Member]  # its file members with an extension, in the tar's order
    folders: list[str]  # its folder entries' names
    ignored: Counter[str]  # the entries left out, by why
    damage: Damage | None


def walk_tar(tar: TarObject) -> Walked:
    """Every file member of ``tar`` up to its end or its damage (the members before the damage are
    kept, unless the damage is a failed stream check)."""
    members: list[Member] = []
    folders: list[str] = []
    ignored: Counter[str] = Counter()
    try:
        with _walk_of(tar) as walk:
            for name, offset, size, kind in walk:
                if kind not in REGULAR_KINDS:
                    if kind == FOLDER_KIND:
                        folders.append(name)
                    else:
                        ignored["(link or device in a tar)"] += 1
                    continue
                found = _KEY.match(name)
                if found is None:
                    ignored["(tar member without an extension)"] += 1
                    continue
                key, ext = found.group(1), found.group(2).lower()
                # a text member is read with the headers, from the bytes read with its header
                text = walk.read(offset, size) if ext in TEXT_EXTS and size <= MAX_TEXT_BYTES else None
                members.append(Member(name, key, ext, offset, size, text))
    except NotATar as exc:
        raise SourceError(f"{tar.path}: not a tar file ({exc}); a WebDataset shard is a tar, plain or "
                          "compressed with gzip, xz, bzip2 or zstd") from None
    except StreamCheckFailed as exc:
        return Walked([], folders, ignored, Damage(tar.name, f"{exc.reason}; none of its members is packed "
                                                            f"({len(members)} read before the check failed)",
                                                   exc.offset, whole=True))
    except TarDamaged as exc:
        while members and members[-1].offset + members[-1].size > exc.offset:  # its data goes on past the damage
            members.pop()
        where = f"{tar.name}/{exc.name}" if exc.name else f"{tar.name}@{exc.offset}"
        return Walked(members, folders, ignored, Damage(where, f"{exc.reason}; nothing after it can be read", exc.offset))
    return Walked(members, folders, ignored, None)


def report_damage(listing: SourceListing, tar: TarObject, damage: Damage | None, on_error: str,
                  lost: str = "") -> None:
    """The damage that ended a tar's walk: an error, or under ``--on-error skip`` one skipped entry
    naming it (``lost``: what else it took with it, said in its reason)."""
    if damage is None:
        return
    if on_error != "skip":
        raise SourceError(f"{tar.path}: {damage.reason}; re-copy or re-write the tar, or pass --on-error skip")
    listing.skipped.append(Skip(escaped(damage.rel), damage.reason + lost))


@contextmanager
def _walk_of(tar: TarObject) -> Iterator[TarWalk | StreamWalk]:
    if tar.compression is not None:
        with open_decompressed(tar.path, tar.compression) as stream:
            yield StreamWalk(stream, tar.name, tar.compression)
    elif tar.local:
        with walk_file(tar.path) as walk:
            yield walk
    else:
        with tar.open() as f:
            yield walk_stream(f, tar.size)
