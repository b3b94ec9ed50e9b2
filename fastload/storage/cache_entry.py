"""One cache entry: a remote file's bytes in a local file and a shared map of which blocks
are present (see fastload.storage.cache for the folder they live in and the rules they keep)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import mmap
import os
import re
import stat
import struct
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from fastload.errors import FastloadError
from fastload.format.files import kind_of, read_regular

BLOCK = 64 * 1024
"""The unit of presence: bytes are kept, marked and evicted whole blocks at a time (one map byte each)."""

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

    def claim(self, piece: int) -> Claim | None:
        """Claim piece number ``piece`` (any fixed unit of the caller's) for fetching: None when
        another process or thread holds it (it is fetching it: wait(), then read the cache).

        The claim is an open-file-description lock on one byte of the entry's data file: it ends
        with ``Claim.release()``, or with the process, so a killed fetcher blocks no one."""
        fd = self._lock_fd()
        if fd < 0:
            return Claim(-1)  # no such locks here, or the file is gone: every fetcher on its own
        try:
            fcntl.fcntl(fd, _F_OFD_SETLK, _flock(fcntl.F_WRLCK, piece))
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return None
            return Claim(-1)
        return Claim(fd, piece)

    def wait(self, piece: int) -> None:
        """Return once no one holds a claim on ``piece`` (its fetcher wrote it, or gave up)."""
        fd = self._lock_fd()
        if fd < 0:
            return
        try:
            fcntl.fcntl(fd, _F_OFD_SETLKW, _flock(fcntl.F_RDLCK, piece))
        except OSError:
            return
        finally:
            _unlock_and_close(fd, piece)

    def _lock_fd(self) -> int:
        """A descriptor of its own (an OFD lock belongs to one open file description, so the
        threads of one process exclude each other too); -1 when that cannot be had."""
        if _F_OFD_SETLK is None:
            return -1
        try:
            return os.open(os.path.join(self.path, "data"), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return -1

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


class Claim:
    """A piece being fetched by this thread (see ``CacheEntry.claim``); ``release()`` once its
    bytes are written (or the fetch failed)."""

    __slots__ = ("fd", "piece")

    def __init__(self, fd: int, piece: int = 0) -> None:
        self.fd, self.piece = fd, piece

    def release(self) -> None:
        if self.fd >= 0:
            _unlock_and_close(self.fd, self.piece)
            self.fd = -1


def _unlock_and_close(fd: int, piece: int) -> None:
    """Unlock, then close: a DataLoader worker forked meanwhile holds a copy of the descriptor,
    and the lock would last until that copy closed too (close alone releases nothing then)."""
    try:
        fcntl.fcntl(fd, _F_OFD_SETLK, _flock(fcntl.F_UNLCK, piece))
    except OSError:
        pass
    finally:
        os.close(fd)


_F_OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)  # Linux 3.15+
_F_OFD_SETLKW: int | None = getattr(fcntl, "F_OFD_SETLKW", None)


def _flock(kind: int, byte: int) -> bytes:
    """A ``struct flock`` for one byte at ``byte`` (l_pid 0, as OFD locks require)."""
    return struct.pack("hhqqixxxx", kind, os.SEEK_SET, byte, 1, 0)


class _Files:
    """One process's descriptor of an entry's data and its shared map; closed when dropped, so a
    thread still reading keeps them open. A descriptor of -1 (and a private map): not admitted."""

    __slots__ = ("fd", "map")

    def __init__(self, fd: int, present: mmap.mmap | bytearray) -> None:
        self.fd, self.map = fd, present

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


def _open(path: str, key: str, size: int) -> _Files | None:
    """The entry's files at ``path``, or None when there is none or it is damaged."""
    if not os.path.lexists(path):
        return None
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        meta = _read_meta(path)
        if meta["key"] != key or meta["size"] != size:
            raise ValueError("another file's entry")  # a hash collision, or a key of another size
        _check_file(os.path.join(path, "data"), size)  # under the lock: nothing changes them meanwhile
        _check_file(os.path.join(path, "map"), _map_len(size))
        files = _Files(os.open(os.path.join(path, "data"), flags), bytearray())  # closed when dropped
        map_fd = os.open(os.path.join(path, "map"), flags)
        try:
            # Every page of the map on disk before it is mapped (entries made before this was
            # done are sparse): touching a hole on a full disk is SIGBUS, not an error to catch.
            _reserve(map_fd, _map_len(size))
            files.map = mmap.mmap(map_fd, _map_len(size), mmap.MAP_SHARED)  # every process sees every mark
        finally:
            os.close(map_fd)  # the mapping stays
        if files.map[:].translate(None, b"\x00\x01"):
            raise ValueError("map holds bytes other than 0 and 1")
        return files
    except (OSError, ValueError):
        return None


def _read_meta(path: str) -> dict:
    if not stat.S_ISDIR(os.lstat(path).st_mode):  # a link to a folder elsewhere is never followed
        raise ValueError(f"{path}: not a folder")
    meta = json.loads(read_regular(os.path.join(path, "meta.json"), 1 << 16, follow_links=False))
    if not (isinstance(meta, dict) and isinstance(meta.get("key"), str) and isinstance(meta.get("dataset"), str)
            and type(meta.get("size")) is int and meta["size"] >= 0 and meta.get("block") == BLOCK):
        raise ValueError(f"{path}/meta.json: not an entry's sidecar")
    return meta


def _check_file(path: str, size: int) -> None:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        raise ValueError(f"{path}: {kind_of(st.st_mode)} of {st.st_size} bytes, expected {size}")


def _reserve(fd: int, length: int, *, emulated: bool = True) -> None:
    """Allocate the file's first ``length`` bytes on disk (zeros where there were none); OSError
    (ENOSPC) when the disk has no room for them. Where the file system cannot allocate without
    writing (NFS v3), glibc writes a byte into every block: fine for a map, too slow for a large
    data file, which is then only extended (``emulated=False``: sparse, its writes may still fail)."""
    if not length:
        return
    if _fallocate is not None:
        if _fallocate(fd, 0, 0, length) == 0:
            return
        failed = ctypes.get_errno()
        if failed not in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise OSError(failed, os.strerror(failed))
    if emulated and hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, length)
    elif os.fstat(fd).st_size < length:
        os.ftruncate(fd, length)


def _load_fallocate() -> Any:
    """Linux's fallocate(2), which never writes to emulate itself; None where there is none."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = getattr(libc, "fallocate64", None) or libc.fallocate
    except (OSError, AttributeError):
        return None
    call.argtypes, call.restype = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64], ctypes.c_int
    return call


_fallocate = _load_fallocate()


def _pread_all(fd: int, start: int, end: int, path: str) -> bytes:
    parts = []
    while start < end:
        part = os.pread(fd, end - start, start)
        if not part:
            raise OSError(errno.EIO, f"{path}/data ends before byte {start} (cut short by hand?)")
        parts.append(part)
        start += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _present(present: mmap.mmap | bytearray | bytes, size: int) -> int:
    count = present[:].count(1)
    blocks = -(-size // BLOCK)
    if count and blocks and present[blocks - 1] == 1:
        return count * BLOCK - (blocks * BLOCK - size)  # the last block is short
    return count * BLOCK


def _map_len(size: int) -> int:
    return max(1, -(-size // BLOCK))  # an empty file still maps one (unused) byte: mmap needs one


def _touch(path: str) -> None:
    now = time.time_ns()  # set, not taken from the file system's clock, which ticks only every few ms
    with contextlib.suppress(FileNotFoundError):
        os.utime(os.path.join(path, "meta.json"), ns=(now, now), follow_symlinks=False)


_open_lock = threading.Lock()


def _new_lock_after_fork() -> None:
    """A parent thread may have held the lock at the fork; the child's copy would stay locked."""
    global _open_lock
    _open_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)
