"""A span of a cache entry filled as a body arrives: buffers written at their place in the entry's
data file as they come, the span's blocks marked present only once all of it is there."""

from __future__ import annotations

import os
from typing import Any, Protocol

from fastload.storage.cache_entry_files import BLOCK, _Files


class SpanOwner(Protocol):
    """What a span asks of its entry (fastload.storage.cache_entry.CacheEntry)."""

    path: str

    def _lose(self, files: _Files, what: str, exc: OSError) -> None: ...


class SpanWriter:
    """Bytes ``offset .. offset + length`` of an entry (whole blocks), written buffer by buffer.

    A failed write (a failing disk) is said once through the entry, which then reads through, and
    the rest of the body is dropped: ``commit`` says False and the caller reads the bytes from the
    store. A retried GET ``restart``s the span (its blocks are not marked until ``commit``)."""

    def __init__(self, entry: SpanOwner, files: _Files, offset: int, length: int) -> None:
        if offset % BLOCK:
            raise ValueError(f"{entry.path}: a span at {offset} is not block-aligned; fill spans as missing() "
                             "returns them")
        self.entry, self.files, self.offset, self.length = entry, files, offset, length
        self.position, self.failed = offset, False

    def write(self, buffer: Any) -> None:
        view = memoryview(buffer).cast("B")
        if self.failed:
            return
        if self.position + len(view) > self.offset + self.length:
            raise ValueError(f"{self.entry.path}: {len(view)} bytes at {self.position} run past the span "
                             f"{self.offset}+{self.length}")
        try:
            while view:
                written = os.pwrite(self.files.fd, view, self.position)
                view, self.position = view[written:], self.position + written
        except OSError as exc:  # its blocks are reserved, so an I/O error, not a full disk
            self.failed = True
            self.entry._lose(self.files, "write to a cached shard", exc)

    def restart(self) -> None:
        self.position = self.offset

    def commit(self) -> bool:
        """Mark the span's blocks present; False when its bytes were not all kept."""
        if self.failed or self.position != self.offset + self.length:
            return False
        first, end = self.offset // BLOCK, -(-(self.offset + self.length) // BLOCK)
        self.files.map[first:end] = b"\x01" * (end - first)
        return True
