"""Pixel cache: one key's stored pixels as a process sees them (entries looked up, pixels mapped,
room reserved, records written and published).

Every process of the node maps the same index, so an entry one publishes is seen by all. A record
is written in this order: room reserved (a chunk at a time, under the folder lock, on the disk
with fallocate, so a full disk refuses the reservation and never a write or a mapped store), its
pixels written, then its entry published (word 0 last, pixel_native.c). A process killed at any
point leaves at most reserved bytes no entry points to. After a reboot the entries of the last
boot are each checked once against their checksum before they are read, since pages written
before a power cut may not have reached the disk in the order they were written.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from typing import Any, Protocol

import numpy as np
import xxhash

from fastload.pixels.folder import TOUCH_EVERY, locked, make_room, touch
from fastload.pixels.handles import Handles, open_handles
from fastload.pixels.layout import (
    ALIGN, CHUNK_BYTES, ENTRY_WORDS, GEN_MASK, H_RESERVED, HEADER_BYTES, SEGMENT_BYTES, Entries, entry_words,
    index_bytes, stored_bytes, with_generation,
)
from fastload.storage.cache_entry_files import _reserve

KEEP_FREE = 0.05
"""The cache never takes its disk below this fraction free: other files there (checkpoints, logs)
keep room to grow."""


class Owner(Protocol):
    def bypass(self, what: str, exc: OSError) -> None: ...


def checksum(pixels: np.ndarray) -> int:
    """What an entry keeps of its pixels' xxh3-64 (the low 32 bits)."""
    return xxhash.xxh3_64_intdigest(pixels) & 0xFFFFFFFF


_attach_lock = threading.Lock()
os.register_at_fork(after_in_child=lambda: globals().update(_attach_lock=threading.Lock()))


class PixelStore:
    """The stored pixels of one key (a dataset version and its decode settings) in the folder
    ``root/name``; opened lazily in each process that uses it (pickled or forked, it opens anew).
    Safe for the threads of a process: lookups and reads take no lock, reservations take the
    process's and, once its chunk is used up, the folder's."""

    def __init__(self, root: str, name: str, meta: dict[str, Any], records: int, limit: int,
                 owner: Owner) -> None:
        self.root, self.name, self.meta, self.records, self.limit = root, name, meta, records, limit
        self.path = os.path.join(root, name)
        self.owner = owner
        self._handles: Handles | None = None
        self._pid = -1  # the process that opened _handles (None there: no cache in it)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_handles": None, "_pid": -1}

    def entries(self, records: np.ndarray) -> Entries | None:
        """The entries of ``records`` (int64); None when this process has no cache."""
        handles = self.opened()
        if handles is None:
            return None
        from fastload.decode._jpeg_region import pixel_entries

        records = np.ascontiguousarray(records, dtype=np.int64)
        words = np.empty((len(records), ENTRY_WORDS), dtype=np.uint64)
        pixel_entries(handles.index, HEADER_BYTES, records, words)
        return Entries(words, records, handles)

    def pixels(self, entries: Entries, k: int) -> np.ndarray | None:
        """The stored planes of the ``k``-th of ``entries`` (a view of the mapped data file: only
        the pages a crop reads are touched), or None when they cannot be trusted or read."""
        handles = entries.handles  # the folder they were read from, whatever was opened since
        if not entries.present[k]:
            return None
        offset, width, height = int(entries.offset[k]), int(entries.width[k]), int(entries.height[k])
        size, start = stored_bytes(width, height), offset % SEGMENT_BYTES
        if size == 0 or offset + size > int(handles.header[H_RESERVED]) or start + size > SEGMENT_BYTES:
            return None  # an entry that cannot be ours: a damaged index
        data = handles.data(offset // SEGMENT_BYTES)
        if data is None:
            return None
        pixels = np.frombuffer(data, dtype=np.uint8, count=size, offset=start)
        if int(entries.generation[k]) != handles.generation & GEN_MASK:
            # written in an earlier boot: trusted once its checksum agrees, and marked so
            if checksum(pixels) != int(entries.checksum[k]):
                return None
            if handles.writable:
                word0 = with_generation(int(entries.words[k, 0]), handles.generation)
                _publish(handles, int(entries.records[k]), word0, *(int(w) for w in entries.words[k, 1:]))
        return pixels

    def usage(self) -> int:
        """Bytes this key's folder takes (its index and the data reserved), as this process sees it."""
        handles = self.opened()
        return 0 if handles is None else index_bytes(self.records) + int(handles.header[H_RESERVED])

    def reserve(self, size: int) -> int | None:
        """An offset with ``size`` bytes of room for one record's planes; None when the cache keeps
        no more (its limit, its disk, or it is read-only here)."""
        handles = self.opened()
        if handles is None:
            return None
        size = -(-size // ALIGN) * ALIGN
        with handles.lock:
            if handles.full:
                return None
            if handles.position + size > handles.end and not self._new_chunk(handles, size):
                handles.full = True
                return None
            handles.position += size
            return handles.position - size

    def give_back(self, offset: int, size: int) -> None:
        """Return a reservation not written (its record failed to decode), if nothing came after it."""
        handles = self._handles
        size = -(-size // ALIGN) * ALIGN
        if handles is not None:
            with handles.lock:
                if handles.position == offset + size:
                    handles.position = offset

    def write(self, offset: int, pixels: np.ndarray, stored: tuple[int, int], record: int,
              image_size: tuple[int, int]) -> bool:
        """Write ``pixels`` (the planes of ``stored`` ``(width, height)``, C-contiguous) at ``offset``
        and publish them as ``record``'s, made from an image of ``image_size``; False (and a
        warning) when the disk failed the write."""
        handles = self._handles
        if handles is None or not handles.writable:
            return False
        view, position = memoryview(pixels).cast("B"), offset % SEGMENT_BYTES
        try:
            with handles.lock:
                fd = handles.file(offset // SEGMENT_BYTES)
            while view:
                done = os.pwrite(fd, view, position)
                view, position = view[done:], position + done
        except OSError as exc:
            self.owner.bypass("write pixels", exc)
            handles.full = True
            return False
        _publish(handles, record, *entry_words(offset, handles.generation, *stored, checksum(pixels), *image_size))
        return True

    def opened(self) -> Handles | None:
        """This process's handles, opened on first use (again after a fork, or once another
        process evicted the folder); None when the cache cannot be used here."""
        handles = self._handles
        if self._pid != os.getpid():
            return self._reopen(None)
        if handles is None or time.monotonic() - handles.checked < TOUCH_EVERY:
            return handles
        handles.checked = time.monotonic()
        if not handles.evicted():
            touch(self.path)  # in use: not evicted for another key's room
            return handles
        return self._reopen(handles)  # let go of its files, so that their disk is freed

    def _reopen(self, old: Handles | None) -> Handles | None:
        with _attach_lock:
            if self._pid == os.getpid() and self._handles is not old:
                return self._handles  # another thread did it meanwhile
            if old is not None:
                old.close()
            self._handles = open_handles(self.root, self.name, self.meta, self.records, self.limit,
                                         self.owner.bypass)
            self._pid = os.getpid()
            return self._handles

    def _new_chunk(self, handles: Handles, size: int) -> bool:
        """Reserve a chunk of at least ``size`` bytes for this process's fills (under its lock,
        and the folder's); False when the limit or the disk has no room for it."""
        if size > SEGMENT_BYTES:
            return False
        try:
            with locked(self.root):
                if handles.evicted():
                    return False  # by another process: this one lets it go at its next look
                tail = int(handles.header[H_RESERVED])
                start = tail if tail % SEGMENT_BYTES + size <= SEGMENT_BYTES else -(-tail // SEGMENT_BYTES) * SEGMENT_BYTES
                chunk = min(max(size, CHUNK_BYTES), SEGMENT_BYTES - start % SEGMENT_BYTES)
                while not make_room(self.root, self.limit, start - tail + chunk, keep=self.name):
                    if chunk == size:
                        return False  # the limit: what is stored stays, the rest decodes as without
                    chunk = max(size, chunk // 4)
                disk = os.statvfs(self.root)
                room = int((disk.f_bavail - KEEP_FREE * disk.f_blocks) * disk.f_frsize) // ALIGN * ALIGN
                if room < size:
                    raise OSError(errno.ENOSPC, f"under {KEEP_FREE:.0%} of its disk would be left free")
                chunk = min(chunk, room)  # what the disk has room for, while it has room for this one
                _reserve(handles.file(start // SEGMENT_BYTES), chunk, emulated=False, offset=start % SEGMENT_BYTES)
                handles.header[H_RESERVED] = start + chunk
        except OSError as exc:
            self.owner.bypass("keep more pixels", exc)
            return False
        handles.position, handles.end = start, start + chunk
        return True


def _publish(handles: Handles, record: int, *words: int) -> None:
    from fastload.decode._jpeg_region import pixel_publish

    pixel_publish(handles.index, HEADER_BYTES, record, *words)
