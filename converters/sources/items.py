"""Source listing's records: the items to pack, their other files, what was left out and why.

Only what can be packed is listed: a regular file (not a FIFO or a device, which would block or read
without end) within ``max_file_size``, under a UTF-8 name (the index stores names as UTF-8). Anything
else is a bad entry: an error under ``on_error="raise"``, a reported skip under ``"skip"``.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from fastload.converters.sources.confine import ListRoot

from fastload.errors import SourceError
from fastload.format.files import kernel_refusal, kind_of
from fastload.format.layout import IMAGE_EXTENSIONS, field_name_problem

Layout = Literal["auto", "imagefolder", "flat", "list", "webdataset", "table"]
LIST_SUFFIXES = (".csv", ".jsonl")
SOURCE_KINDS = ("a folder of images (ImageFolder or flat), a .csv/.jsonl file list, WebDataset tars (.tar, "
                ".tar.gz, .tar.xz or .tar.zst, a folder of them, or a quoted brace list 'data-{000..009}.tar'), "
                "tables (.parquet, .arrow or .feather, a folder of them, or a Hugging Face save_to_disk "
                "folder), or a store URL of images, tars or Parquet files (s3://bucket/images/)")
"""Every kind of SRC a pack reads, as errors name them."""


@dataclass(frozen=True)
class SourceFile:
    """One more file of a record (a mask, a depth map): where it is, its path as listed, its size."""

    path: Path
    rel: str
    size: int  # -1: could not be examined (reported, naming its record, when read)
    mtime_ns: int
    stamp: tuple[int, int] = (-1, -1)  # (ctime_ns, inode): what a rewrite cannot keep (see converters.packing.plan)
    offset: int = -1  # -1: the whole file at ``path``; else ``size`` bytes at this offset of it (a tar member)


@dataclass(frozen=True)
class SourceItem:
    """One file to pack: where it is, its path relative to SRC, its label and its size; ``files``:
    its record's other files, one per file field (``SourceListing.file_fields``), in that order."""

    path: Path
    rel: str
    label: int
    size: int
    mtime_ns: int
    files: tuple[SourceFile, ...] = ()
    stamp: tuple[int, int] = (-1, -1)  # (ctime_ns, inode): what a rewrite cannot keep (see converters.packing.plan)
    offset: int = -1  # -1: the whole file at ``path``; else ``size`` bytes at this offset of it (a tar member)

    @property
    def total_size(self) -> int:
        """Bytes of the record's files together (what the shard plan counts)."""
        return max(self.size, 0) + sum(max(f.size, 0) for f in self.files)


@dataclass(frozen=True)
class Skip:
    """A file left out, and why (every skip is counted and reported)."""

    rel: str
    reason: str


class MemberReader(Protocol):
    """How a source whose records live inside other files (tar members) is read at pack time."""

    def read(self, path: Path, offset: int, size: int) -> bytes: ...

    def contents(self, items: Sequence[SourceItem]) -> Iterator[bytes | OSError]:
        """Each item's payload, then its files', in order (an OSError in a payload's place)."""
        ...


@dataclass
class SourceListing:
    """Everything found in SRC, in record order."""

    root: Path
    layout: str
    items: list[SourceItem]
    classes: list[str] | None
    fields: dict[str, str] = field(default_factory=dict)  # extra field → dtype
    field_values: dict[str, list[Any]] = field(default_factory=dict)  # extra field → one value per item
    file_fields: dict[str, str] = field(default_factory=dict)  # file field → type (items' ``files``, in order)
    skipped: list[Skip] = field(default_factory=list)  # bad entries, and links to folders listed already
    ignored: Counter[str] = field(default_factory=Counter)  # extension → count, not selected
    list_root: ListRoot | None = None  # a file list's: where the paths it gives may point
    images: bool | None = None  # True: every item is an image, whatever its name; None: by its extension
    reader: MemberReader | None = None  # records inside other files: how they are read (else whole files)
    source: str | None = None  # SRC as named (a tar, a table file, a brace list), where ``root`` is its folder

    def is_image(self, item: SourceItem) -> bool:
        return self.images if self.images is not None else item.rel.lower().endswith(IMAGE_EXTENSIONS)


def normalize_extensions(extensions: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    if not extensions:
        return IMAGE_EXTENSIONS
    return tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)


def check_field_names(where: object, names: Iterable[str], what: str) -> None:
    """Refuse, before anything is packed, a name that could land on another field's index columns
    or on no file at all (see fastload.format.layout); ``what`` says where the name comes from."""
    for name in names:
        problem = field_name_problem(name)
        if problem is not None:
            raise SourceError(f"{where}: field name {name!r} ({what}) {problem}")


def escaped(text: str) -> str:
    """``text`` printable and UTF-8: undecodable bytes written as ``\\xe9``."""
    return os.fsencode(text).decode("utf-8", "backslashreplace")


def file_refusal(st: os.stat_result, max_file_size: int | None) -> tuple[str, str | None] | None:
    """Why a file with this stat cannot be packed (the reason, and what to do), or None."""
    if not stat.S_ISREG(st.st_mode):
        return f"not a regular file ({kind_of(st.st_mode)})", "remove it"
    kernel = kernel_refusal(st)  # /proc/self/environ is a regular file
    if kernel is not None:
        return kernel, "remove it"
    if max_file_size is not None and st.st_size > max_file_size:
        return f"{st.st_size} bytes is over --max-file-size {max_file_size}; raise the limit or remove it", None
    return None


def bad_entry(listing: SourceListing, on_error: str, path: Path | str, rel: str, reason: str,
              fix: str | None = "fix or remove it") -> None:
    """A bad entry: raise under 'raise', else count it as skipped. ``fix`` None: ``reason`` says it."""
    if on_error != "skip":
        what = f"{reason}; {fix}" if fix else reason
        raise SourceError(f"{escaped(str(path))}: {what}, or pass --on-error skip")
    listing.skipped.append(Skip(escaped(rel), reason))

