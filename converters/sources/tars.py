"""Finding WebDataset tars (a file, a brace list, a folder of them) and reading their members: in
place, or by streaming a compressed tar (converters.sources.tar_streams)."""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from fastload.converters.sources.items import SourceItem
from fastload.converters.sources.tar_streams import TarStream, compression_of

from fastload.errors import SourceError, SourceNotFoundError
from fastload.format.files import open_regular
from fastload.format.layout import IMAGE_EXTENSIONS

TAR_SUFFIX = ".tar"
TAR_SUFFIXES = (TAR_SUFFIX, ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2", ".tar.zst", ".tar.zstd",
                ".tzst")
"""Names of tars, plain or compressed (read by streaming them)."""
_BRACES = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")
MAX_BRACE_NAMES = 10**6
"""Most names a brace list may stand for (counted before any is made): a million shards is a
petabyte-sized source, and a million names already take some 100 MB to list."""


def expand_braces(pattern: str) -> list[str]:
    """``data-{000..002}.tar`` → the three names, as WebDataset's brace lists: ``{a,b}`` lists and
    ``{N..M}`` ranges (zero-padded to the width written), several groups multiplied out in order;
    at most MAX_BRACE_NAMES of them, counted before any is made."""
    groups: list[range | list[str]] = []  # each group's values (a range's numbers, before padding)
    widths: list[int] = []
    fixed: list[str] = []  # the text before each group, then after the last
    last = 0
    for found in _BRACES.finditer(pattern):
        fixed.append(pattern[last:found.start()])
        body = found.group(1)
        span = _RANGE.match(body)
        if span:
            lo, hi = int(span.group(1)), int(span.group(2))
            widths.append(len(span.group(1)) if span.group(1).lstrip("-").startswith("0") else 0)
            step = 1 if hi >= lo else -1
            groups.append(range(lo, hi + step, step))
        elif "," in body:
            groups.append(body.split(","))
            widths.append(0)
        else:
            raise SourceError(f"{pattern}: {{{body}}} is neither a list ({{a,b}}) nor a range ({{000..099}})")
        last = found.end()
    fixed.append(pattern[last:])
    count = math.prod(len(g) for g in groups)
    if count > MAX_BRACE_NAMES:
        raise SourceError(f"{pattern}: names {count} files, over the {MAX_BRACE_NAMES} a brace list may name; "
                          "give a smaller range, or pack the shards in parts")
    parts = [[fixed[0]]]
    for group, width, text in zip(groups, widths, fixed[1:]):
        parts += [[str(v).zfill(width) for v in group] if isinstance(group, range) else group, [text]]
    return ["".join(p) for p in itertools.product(*parts)]


def is_tar_name(name: str) -> bool:
    """Whether ``name`` is a tar's: ``.tar``, or a compressed one (``.tar.gz``, ``.tgz``, ``.tar.zst``, ...)."""
    return name.lower().endswith(TAR_SUFFIXES)


def is_tar_source(src: Path) -> bool:
    """Whether ``src`` names WebDataset tars: a tar file (plain or compressed), a brace list of
    them, or a folder that holds tars and neither images nor sub-folders."""
    text = str(src)
    if "{" in text and is_tar_name(text):
        return True
    if src.is_file():
        return is_tar_name(src.name)
    if not src.is_dir():
        return False
    names = [e for e in os.scandir(src) if not e.name.startswith(".")]
    return (any(is_tar_name(e.name) for e in names)
            and not any(e.is_dir() or e.name.lower().endswith(IMAGE_EXTENSIONS) for e in names))


def tar_paths(src: Path) -> tuple[Path, list[Path]]:
    """The listing's root and its tars, in order; each must exist."""
    text = str(src)
    if "{" in text:
        paths = [Path(p) for p in expand_braces(text)]
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise SourceNotFoundError(f"{missing[0]}: no such tar ({len(missing)} of the {len(paths)} that "
                                      f"{src.name} names are missing)")
        return paths[0].parent, paths
    if src.is_file():
        return src.parent, [src]
    return src, sorted(p for p in src.iterdir() if is_tar_name(p.name) and p.is_file())


class TarMembers:
    """Reads members: ``size`` bytes at ``offset`` of their tar, each tar opened once; a compressed
    tar's offsets are in its decompressed stream, read forward (in order, each tar streams once)."""

    def __init__(self) -> None:
        self.open: dict[Path, int] = {}
        self.streams: dict[Path, TarStream | None] = {}  # None: a plain tar, read in place

    def read(self, path: Path, offset: int, size: int) -> bytes:
        if path not in self.streams:
            kind = compression_of(path)
            self.streams[path] = TarStream(path, kind) if kind else None
        stream = self.streams[path]
        if stream is not None:
            return stream.read(offset, size)
        fd = self.open.get(path)
        if fd is None:
            fd = self.open[path] = open_regular(path)
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise OSError(f"{path} ends inside this member (read {len(data)} of {size} bytes at {offset})")
        return data

    def contents(self, items: Sequence[SourceItem]) -> Iterator[bytes | OSError]:
        """Each item's payload, then its files', in order (an OSError in a payload's place); a
        sample's members read in the tar's order (a compressed tar is streamed forward)."""
        try:
            for item in items:
                parts: list[SourceItem | Any] = [item, *item.files]
                read: dict[int, bytes | OSError] = {}
                for k in sorted(range(len(parts)), key=lambda k: parts[k].offset):
                    try:
                        read[k] = self.read(parts[k].path, parts[k].offset, parts[k].size)
                    except OSError as exc:
                        read[k] = exc
                yield from (read[k] for k in range(len(parts)))
        finally:
            self.close()

    def close(self) -> None:
        for fd in self.open.values():
            os.close(fd)
        self.open.clear()
        for stream in self.streams.values():
            if stream is not None:
                stream.close()
