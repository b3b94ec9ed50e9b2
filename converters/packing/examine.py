"""Pack stage, read side: each item's files read in order, then examined (checked, re-encoded or
rewritten with restart markers) into the bytes a shard gets, or the reason it cannot be packed."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastload.converters.packing.checks import InvalidFile, check_image
from fastload.converters.packing.readahead import (
    PixelBudget,
    fetch_in_order,
    map_in_order,
    read_in_order,
)
from fastload.converters.packing.reencode import reencode_jpeg
from fastload.converters.packing.restarts import with_restart_markers
from fastload.converters.sources.file_fields import FileFacts, check_record_files
from fastload.converters.sources.items import MemberReader, SourceItem

from fastload.format import record_checksum
from fastload.format.files import read_regular
from fastload.format.layout import IMAGE_EXTENSIONS
from fastload.storage.allocator import give_back_large_blocks
from fastload.storage.remote import RemoteStore

# Source bytes read ahead of the writer when files are decoded on a thread pool.
_READ_AHEAD_BYTES = 64 * 2**20
# Decoded pixels in flight on that pool (~400 MB as RGB); a larger image is decoded alone.
_PIXELS_IN_FLIGHT = 128 * 2**20


@dataclass
class Loaded:
    """One source file read and checked by a worker thread."""

    index: int
    data: bytes | None
    width: int = -1
    height: int = -1
    reason: str | None = None
    checksum: int = 0
    kept_as_is: str | None = None  # why --restart-markers left this JPEG's bytes as they were
    files: list[tuple[bytes, int, FileFacts]] | None = None  # each file field's bytes, checksum, facts


class Examiner:
    """Each item's files read (many in flight) and examined, in item order, for the shard writer."""

    def __init__(self, items: list[SourceItem], options: dict[str, Any], file_types: dict[str, str],
                 src_store: RemoteStore | None = None, reader: MemberReader | None = None,
                 images: bool | None = None) -> None:
        self.items, self.options, self.src_store, self.reader = items, options, src_store, reader
        self.images = images  # True: every item is an image; None: those named like one
        self.file_types = file_types  # file field → type, in the order of each item's ``files``
        self.pixels = PixelBudget(_PIXELS_IN_FLIGHT)
        self.decodes = bool(options["reencode"] or options["restart_markers"] or options["check"] == "decode")
        if self.decodes:
            give_back_large_blocks()
        # masks re-stored as rows are decoded too: examined on the pool, not in the reading thread
        self.on_pool = self.decodes or "mask-rows" in file_types.values()

    def loaded(self, pool: ThreadPoolExecutor, indices: list[int]) -> Iterator[Loaded]:
        """Every item read and examined, in order (see converters.packing.readahead for the two ways)."""
        workers = self.options["workers"]
        if self.reader is not None:  # records inside other files: read in order, examined on the pool
            yield from self._members(pool, indices, self.reader)
            return
        if self.on_pool:
            yield from map_in_order(pool, self._load, indices, lambda i: self.items[i].total_size,
                                    max_items=workers * 8, max_weight=_READ_AHEAD_BYTES)
            return
        if self.src_store is not None:  # small objects: batches of GETs in flight, in order
            contents = fetch_in_order(self.src_store, [(self.items[i].rel, self.items[i].size) for i in indices])
        else:  # a record's files one after the other: its image, then its file fields' files
            contents = read_in_order([path for i in indices for path in self._paths(i)], depth=workers * 8,
                                     limit=self.options["max_file_size"])
        try:
            for index in indices:
                data = next(contents)
                yield self._examine(index, data, [next(contents) for _ in self.items[index].files])
        finally:
            contents.close()  # the files opened ahead

    def _members(self, pool: ThreadPoolExecutor, indices: list[int], reader: MemberReader) -> Iterator[Loaded]:
        contents = reader.contents([self.items[i] for i in indices])
        read: dict[int, tuple[bytes | OSError, list[bytes | OSError]]] = {}

        def fetched() -> Iterator[int]:
            for index in indices:
                read[index] = (next(contents), [next(contents) for _ in self.items[index].files])
                yield index

        try:
            if not self.on_pool:
                for index in fetched():
                    yield self._examine(index, *read.pop(index))
                return
            yield from map_in_order(pool, lambda i: self._examine(i, *read.pop(i)), fetched(),
                                    lambda i: self.items[i].total_size, max_items=self.options["workers"] * 8,
                                    max_weight=_READ_AHEAD_BYTES)
        finally:
            contents.close()

    def _paths(self, index: int) -> list[Path]:
        item = self.items[index]
        return [item.path, *(file.path for file in item.files)]

    def _load(self, index: int) -> Loaded:
        item = self.items[index]
        try:
            data: bytes | OSError = (read_regular(item.path, self.options["max_file_size"])
                                     if self.src_store is None else
                                     self.src_store.read_ranges([(item.rel, 0, item.size)])[0])
        except OSError as exc:
            data = exc
        files: list[bytes | OSError] = []
        for file in item.files:
            try:
                files.append(read_regular(file.path, self.options["max_file_size"]))
            except OSError as exc:
                files.append(exc)
        return self._examine(index, data, files)

    def _examine(self, index: int, data: bytes | OSError, files: list[bytes | OSError] = ()) -> Loaded:
        """Check (and re-encode, or rewrite with restart markers) one file's bytes, then its record's
        other ``files``; a reason instead of bytes when it cannot be packed."""
        loaded = self._examine_file(index, data)
        if loaded.data is None or not self.file_types:
            return loaded
        try:
            loaded.files = check_record_files(self.file_types, self.items[index].files, files, loaded.width,
                                              loaded.height, self.options["max_pixels"],
                                              decode=self.options["check"] == "decode")
        except InvalidFile as exc:
            return Loaded(index, None, reason=exc.reason)
        return loaded

    def _examine_file(self, index: int, data: bytes | OSError) -> Loaded:
        if isinstance(data, OSError):
            return Loaded(index, None, reason=f"unreadable file ({data.strerror or data})")
        if not (self.images if self.images is not None else
                self.items[index].rel.lower().endswith(IMAGE_EXTENSIONS)):
            return Loaded(index, data, checksum=record_checksum(data))
        kept_as_is = None
        try:
            header = check_image(data, max_pixels=self.options["max_pixels"])
            width, height = header.width, header.height
            if self.decodes:
                with self.pixels.hold(width * height):  # what decoding this image will allocate
                    if self.options["check"] == "decode":
                        check_image(data, decode=True, max_pixels=self.options["max_pixels"])
                    if self.options["reencode"]:
                        data, width, height = reencode_jpeg(data, **self.options["reencode"])
                    if self.options["restart_markers"]:
                        data, kept_as_is = with_restart_markers(data)
        except InvalidFile as exc:
            return Loaded(index, None, reason=exc.reason)
        return Loaded(index, data, width, height, checksum=record_checksum(data), kept_as_is=kept_as_is)
