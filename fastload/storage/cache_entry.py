"""One cache entry: a remote file's bytes in a local file and a shared map of which blocks
are present (see fastload.storage.cache for the folder they live in and the rules they keep)."""

from __future__ import annotations

import errno
import os
import re
import threading
import time
from collections.abc import Sequence
from typing import Protocol

from fastload.errors import FastloadError
from fastload.storage.cache_claims import Claim, claim_piece, wait_for_piece
from fastload.storage.cache_entry_files import BLOCK, _Files, _map_len, _present, _touch
from fastload.storage.cache_span import SpanWriter

TOUCH_EVERY = 60.0
"""Seconds between two checks by one process's reads that an entry is still the cache's (and is used)."""

_ABSENT = re.compile(rb"\x00+")


class EntryOwner(Protocol):
    """What an entry asks of the cache that made it (``fastload.storage.cache.NodeCache``)."""

    directory: str

    def _attach(self, name: str, key: str, size: int, dataset: str) -> _Files | None: ...

    def bypass(self, what: str, exc: OSError) -> None: ...


class BlocksMissing(FastloadError, LookupError):
    """A read asked for bytes whose cache blocks are not present: fetch what ``missing()`` names first."""


class CacheEntry:
    """One remote file's bytes in the node cache: read where present, written whole blocks at a time.

    Safe for concurrent use by threads (``pread``/``pwrite`` and single-byte map stores need no lock).
    Pickled or inherited through fork, an entry opens its files again in the new process.
    """

    def __init__(self, cache: EntryOwner, name: str, key: str, size: int, dataset: str, files: _Files) -> None:
        self.cache, self.name, self.key, self.size, self.dataset = cache, name, key, size, dataset
        self.path = os.path.join(cache.directory, name)
        self._files: _Files | None = files
        self._pid = os.getpid()
        self._checked = time.monotonic()

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_files"], state["_pid"] = None, -1
        return state

    def missing(self, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """The ``(offset, length)`` spans, whole blocks clipped to the file, of ``ranges`` not yet
        present, merged where adjacent (what to fetch and ``write``)."""
        present = self._current().map
        runs: list[tuple[int, int]] = []
        for offset, length in ranges:
            start, end = self._span(offset, length)
            if start < end:
                first = start // BLOCK
                blocks = present[first:(end - 1) // BLOCK + 1]
                if 0 in blocks:
                    runs += [(first + m.start(), first + m.end()) for m in _ABSENT.finditer(blocks)]
        merged: list[list[int]] = []
        for first, last in sorted(runs):
            if merged and first <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], last)
            else:
                merged.append([first, last])
        return [(first * BLOCK, min(last * BLOCK, self.size) - first * BLOCK) for first, last in merged]

    def read(self, offset: int, length: int) -> bytes:
        """The cached bytes at ``offset``; BlocksMissing if any of their blocks is absent."""
        start, end = self._span(offset, length)
        if end - start != length:
            raise ValueError(f"{self.path}: read of {length} bytes at {offset} runs past the end of "
                             f"{self.key} ({self.size} bytes)")
        files = self._current()  # held while reading: its descriptor stays open until we are done
        if length and 0 in files.map[start // BLOCK:(end - 1) // BLOCK + 1]:
            raise self._missing(start, end)
        try:
            data = _pread_all(files.fd, start, end, self.path)
            if time.monotonic() - self._checked > TOUCH_EVERY:
                self._checked = time.monotonic()
                if os.fstat(files.fd).st_nlink == 0:
                    self._reattach(files)  # evicted elsewhere: let go of its unlinked file
                else:
                    _touch(self.path)
        except OSError as exc:  # a failing disk, a file cut short by hand: not cached, from now on
            self._lose(files, "read a cached shard", exc)
            raise self._missing(start, end) from None
        return data

    def _missing(self, start: int, end: int) -> BlocksMissing:
        return BlocksMissing(f"{self.path}: bytes {start}..{end} of {self.key} are not all cached; "
                             "fetch and write the spans missing() names, then read")

    def write(self, offset: int, data: bytes | memoryview) -> bool:
        """Keep ``data`` (whole blocks from ``offset``; the last may end at the end of the file) and
        mark its blocks present; False when it was not kept (the entry lost its place in the cache)."""
        view = memoryview(data).cast("B")
        end = offset + len(view)
        if offset < 0 or offset % BLOCK or end > self.size or (end % BLOCK and end != self.size):
            raise ValueError(f"{self.path}: write of {len(view)} bytes at {offset} is not whole {BLOCK}-byte "
                             f"blocks of {self.key} ({self.size} bytes); write block-aligned spans as "
                             "missing() returns them")
        files = self._current()
        try:
            if files.fd >= 0 and os.fstat(files.fd).st_nlink == 0:
                files = self._reattach(files)  # evicted by another process: writing there would leak disk
            if files.fd < 0 or not view:
                return files.fd >= 0
            position = offset
            while view:
                written = os.pwrite(files.fd, view, position)
                view, position = view[written:], position + written
        except OSError as exc:  # its blocks are reserved, so an I/O error, not a full disk
            self._lose(files, "write to a cached shard", exc)
            return False
        first = offset // BLOCK
        files.map[first:-(-end // BLOCK)] = b"\x01" * (-(-end // BLOCK) - first)  # only now: data is there
        return True

    def span_writer(self, offset: int, length: int) -> SpanWriter | None:
        """A writer that fills ``offset .. offset + length`` (a span ``missing()`` returned) as a body
        arrives; None when the entry cannot keep bytes (not admitted, or evicted with no room back)."""
        files = self._current()
        try:
            if files.fd >= 0 and os.fstat(files.fd).st_nlink == 0:
                files = self._reattach(files)  # evicted by another process: writing there would leak disk
        except OSError as exc:
            self._lose(files, "write to a cached shard", exc)
            return None
        return SpanWriter(self, files, offset, length) if files.fd >= 0 else None

    def claim(self, piece: int) -> Claim | None:
        """Claim piece number ``piece`` (any fixed unit of the caller's) for fetching: None when
        another process or thread holds it (it is fetching it: wait(), then read the cache).

        The claim is an open-file-description lock on one byte of the entry's data file: it ends
        with ``Claim.release()``, or with the process, so a killed fetcher blocks no one."""
        return claim_piece(self.path, piece)

    def wait(self, piece: int) -> None:
        """Return once no one holds a claim on ``piece`` (its fetcher wrote it, or gave up)."""
        wait_for_piece(self.path, piece)

    def invalidate(self, offset: int, length: int) -> None:
        """Mark the blocks covering these bytes absent (their copy failed its checksum)."""
        start, end = self._span(offset, length)
        if start < end:
            first, last = start // BLOCK, (end - 1) // BLOCK + 1
            self._current().map[first:last] = bytes(last - first)

    def present_bytes(self) -> int:
        """How many of the file's bytes are present."""
        return _present(self._current().map, self.size)

    def close(self) -> None:
        """Let go of the files (closed once no thread still reads them); a later use opens them again."""
        with _open_lock:
            self._files = None

    def _span(self, offset: int, length: int) -> tuple[int, int]:
        if offset < 0 or length < 0:
            raise ValueError(f"{self.path}: range ({offset}, {length}) of {self.key} is negative")
        return min(offset, self.size), min(offset + length, self.size)

    def _current(self) -> _Files:
        files = self._files
        if files is None or self._pid != os.getpid():
            with _open_lock:  # forked, unpickled or closed: open once here, never reuse a descriptor
                if self._files is None or self._pid != os.getpid():
                    self._files = self._admit()
                    self._pid = os.getpid()
                files = self._files
        return files

    def _reattach(self, old: _Files) -> _Files:
        with _open_lock:
            if self._files is old:
                self._files = self._admit()
            return self._files  # type: ignore[return-value]

    def _admit(self) -> _Files:
        files = self.cache._attach(self.name, self.key, self.size, self.dataset)
        return files if files is not None else self._through()

    def _through(self) -> _Files:
        """Files of an entry that is not cached: no descriptor, a private all-absent map."""
        return _Files(-1, bytearray(_map_len(self.size)))

    def _lose(self, files: _Files, what: str, exc: OSError) -> None:
        """Stop using the cache for this file in this process (its reads go to the store), and say why."""
        self.cache.bypass(what, exc)
        with _open_lock:
            if self._files is files:
                self._files = self._through()


def _pread_all(fd: int, start: int, end: int, path: str) -> bytes:
    parts = []
    while start < end:
        part = os.pread(fd, end - start, start)
        if not part:
            raise OSError(errno.EIO, f"{path}/data ends before byte {start} (cut short by hand?)")
        parts.append(part)
        start += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


_open_lock = threading.Lock()


def _new_lock_after_fork() -> None:
    """A parent thread may have held the lock at the fork; the child's copy would stay locked."""
    global _open_lock
    _open_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)
