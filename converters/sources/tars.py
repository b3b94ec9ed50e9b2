"""Finding WebDataset tars (a file, a brace list, a folder of them) and reading their members in place."""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from fastload.converters.sources.items import SourceItem

from fastload.errors import SourceError, SourceNotFoundError
from fastload.format.files import open_regular
from fastload.format.layout import IMAGE_EXTENSIONS

TAR_SUFFIX = ".tar"
_BRACES = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def expand_braces(pattern: str) -> list[str]:
    """``data-{000..002}.tar`` → the three names, as WebDataset's brace lists: ``{a,b}`` lists and
    ``{N..M}`` ranges (zero-padded to the width written), several groups multiplied out in order."""
    parts: list[list[str]] = []
    last = 0
    for found in _BRACES.finditer(pattern):
        parts.append([pattern[last:found.start()]])
        body = found.group(1)
        span = _RANGE.match(body)
        if span:
            lo, hi = int(span.group(1)), int(span.group(2))
            width = len(span.group(1)) if span.group(1).lstrip("-").startswith("0") else 0
            step = 1 if hi >= lo else -1
            parts.append([str(n).zfill(width) for n in range(lo, hi + step, step)])
        elif "," in body:
            parts.append(body.split(","))
        else:
            raise SourceError(f"{pattern}: {{{body}}} is neither a list ({{a,b}}) nor a range ({{000..099}})")
        last = found.end()
    parts.append([pattern[last:]])
    return ["".join(p) for p in itertools.product(*parts)]


def is_tar_source(src: Path) -> bool:
    """Whether ``src`` names WebDataset tars: a ``.tar`` file, a brace list of them, or a folder
    that holds ``.tar`` files and neither images nor sub-folders."""
    text = str(src)
    if "{" in text and text.endswith(TAR_SUFFIX):
        return True
    if src.is_file():
        return src.suffix.lower() == TAR_SUFFIX
    if not src.is_dir():
        return False
    names = [e for e in os.scandir(src) if not e.name.startswith(".")]
    return (any(e.name.lower().endswith(TAR_SUFFIX) for e in names)
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
    return src, sorted(p for p in src.iterdir() if p.name.lower().endswith(TAR_SUFFIX) and p.is_file())


class TarMembers:
    """Reads members in place: ``size`` bytes at ``offset`` of their tar, each tar opened once."""

    def __init__(self) -> None:
        self.open: dict[Path, int] = {}

    def read(self, path: Path, offset: int, size: int) -> bytes:
        fd = self.open.get(path)
        if fd is None:
            fd = self.open[path] = open_regular(path)
        data = os.pread(fd, size, offset)
        if len(data) != size:
            raise OSError(f"{path} ends inside this member (read {len(data)} of {size} bytes at {offset})")
        return data

    def contents(self, items: Sequence[SourceItem]) -> Iterator[bytes | OSError]:
        """Each item's payload, then its files', in order (an OSError in a payload's place)."""
        try:
            for item in items:
                for where in (item, *item.files):
                    try:
                        yield self.read(where.path, where.offset, where.size)
                    except OSError as exc:
                        yield exc
        finally:
            self.close()

    def close(self) -> None:
        for fd in self.open.values():
            os.close(fd)
        self.open.clear()
