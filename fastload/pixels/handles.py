"""Pixel cache: one process's handles on a key's folder (its index mapped, its data files mapped or
opened, the chunk it fills), opened writable under the folder lock, or read-only where it must."""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash

from fastload.pixels.folder import create_folder, locked, make_room, read_header, touch
from fastload.pixels.layout import H_BOOT, H_GENERATION, HEADER_BYTES, SEGMENT_BYTES, index_bytes
from fastload.storage.cache_folder import _remove


def boot_id() -> int:
    """This boot of the machine as a number (0 where the system does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            return xxhash.xxh64_intdigest(f.read().strip()) >> 1 or 1
    except OSError:
        return 0


class Handles:
    """A process's handles on the folder ``path`` (``records`` entries), opened ``writable`` or
    not. ``generation``: this boot's; an entry of another one is checked before it is trusted.
    ``lock`` guards the chunk (``position`` up to ``end``) and the files opened."""

    def __init__(self, path: str, records: int, *, writable: bool, boot: int) -> None:
        self.path, self.writable = path, writable
        self.fd = os.open(os.path.join(path, "index"),
                          (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self.index = mmap.mmap(self.fd, index_bytes(records),
                                   access=mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ)
        except (OSError, ValueError):
            os.close(self.fd)
            raise
        self.header = np.frombuffer(self.index, dtype=np.uint64, count=HEADER_BYTES // 8)
        self.generation = int(self.header[H_GENERATION])
        if int(self.header[H_BOOT]) != boot:  # booted since: what was written before is checked once
            self.generation += 1
            if writable:  # opened under the folder lock
                self.header[H_GENERATION], self.header[H_BOOT] = self.generation, boot
        self.maps: dict[int, mmap.mmap | None] = {}
        self.files: dict[int, int] = {}
        self.position = self.end = 0
        self.full = not writable
        self.checked = time.monotonic()
        self.lock = threading.Lock()

    def data(self, segment: int) -> mmap.mmap | None:
        """Data file ``segment`` mapped for reading (once per process), or None when it is missing
        or not whole (cut short by hand: mapping it would be SIGBUS at the first read past its end)."""
        if segment in self.maps:
            return self.maps[segment]
        with self.lock:
            if segment not in self.maps:
                try:
                    fd = os.open(os.path.join(self.path, f"data-{segment:05d}"),
                                 os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                    try:
                        whole = os.fstat(fd).st_size == SEGMENT_BYTES
                        self.maps[segment] = mmap.mmap(fd, SEGMENT_BYTES, access=mmap.ACCESS_READ) if whole else None
                    finally:
                        os.close(fd)
                except OSError:
                    self.maps[segment] = None
        return self.maps[segment]

    def file(self, segment: int) -> int:
        """A descriptor for writing data file ``segment``, made (sparse, its full size) if missing;
        under ``lock``."""
        fd = self.files.get(segment)
        if fd is None:
            fd = os.open(os.path.join(self.path, f"data-{segment:05d}"),
                         os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            if os.fstat(fd).st_size < SEGMENT_BYTES:
                os.ftruncate(fd, SEGMENT_BYTES)
            self.files[segment] = fd
        return fd

    def evicted(self) -> bool:
        """Whether another process removed the folder (its files live on while this one holds them)."""
        return os.fstat(self.fd).st_nlink == 0

    def close(self) -> None:
        """Let go of the files (the mappings go with their last view)."""
        for fd in (self.fd, *self.files.values()):
            os.close(fd)
        self.fd, self.files = -1, {}


def open_handles(root: str, name: str, meta: dict[str, Any], records: int, limit: int,
                 bypass: Callable[[str, OSError], None]) -> Handles | None:
    """This process's handles on the folder ``root/name``: writable (made first if missing, when
    the limit leaves room for its index), else read-only where the folder or its disk is (what
    is stored there is still read; a warning says so), else None: nothing to read or keep."""
    path = os.path.join(root, name)
    try:
        os.makedirs(root, exist_ok=True)
        with locked(root):
            try:
                read_header(path)
            except (OSError, ValueError):
                if os.path.lexists(path):
                    _remove(path)  # damaged, or from a machine of the other byte order
                if not make_room(root, limit, index_bytes(records), keep=name):
                    return None
                create_folder(root, name, meta, records, boot_id())
            touch(path)
            return Handles(path, records, writable=True, boot=boot_id())
    except OSError as exc:  # a read-only folder or disk, a planted file, no room for the index
        bypass("keep pixels there", exc)
    try:
        read_header(path)
        return Handles(path, records, writable=False, boot=boot_id())
    except (OSError, ValueError):
        return None  # nothing stored there: every record decodes as it would without
