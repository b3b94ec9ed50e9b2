"""The node cache's on-disk entry: its data file, block map and sidecar, opened, checked, reserved.

See fastload.storage.cache for the folder they live in and the rules they keep."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import mmap
import os
import stat
import time
from typing import Any

from fastload.format.files import kind_of, read_regular

BLOCK = 64 * 1024
"""The unit of presence: bytes are kept, marked and evicted whole blocks at a time (one map byte each)."""


class _Files:
    """One process's descriptor of an entry's data and its shared map; closed when dropped, so a
    thread still reading keeps them open. A descriptor of -1 (and a private map): not admitted."""

    __slots__ = ("fd", "map")
    _close = staticmethod(os.close)  # held here: at interpreter exit the module's ``os`` may be gone

    def __init__(self, fd: int, present: mmap.mmap | bytearray) -> None:
        self.fd, self.map = fd, present

    def __del__(self) -> None:
        if self.fd >= 0:
            self._close(self.fd)


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


def _reserve(fd: int, length: int, *, emulated: bool = True, offset: int = 0) -> None:
    """Allocate ``length`` bytes of the file from ``offset`` on disk (zeros where there were none);
    OSError (ENOSPC) when the disk has no room for them. Where the file system cannot allocate without
    writing (NFS v3), glibc writes a byte into every block: fine for a map, too slow for a large
    data file, which is then only extended (``emulated=False``: sparse, its writes may still fail)."""
    if not length:
        return
    if _fallocate is not None:
        if _fallocate(fd, 0, offset, length) == 0:
            return
        failed = ctypes.get_errno()
        if failed not in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise OSError(failed, os.strerror(failed))
    if emulated and hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, offset, length)
    elif os.fstat(fd).st_size < offset + length:
        os.ftruncate(fd, offset + length)


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

