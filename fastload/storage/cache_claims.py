"""Claims on a cache entry's pieces, so that one fetcher fetches each piece for the whole node.

A claim is an open-file-description lock on one byte of the entry's data file: it ends when its
holder releases it or dies."""

from __future__ import annotations

import errno
import fcntl
import os
import struct

_F_OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)  # Linux 3.15+
_F_OFD_SETLKW: int | None = getattr(fcntl, "F_OFD_SETLKW", None)


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


def claim_piece(path: str, piece: int) -> Claim | None:
    """Claim ``piece`` of the entry at ``path`` (see ``CacheEntry.claim``); None when another holds it."""
    fd = _lock_fd(path)
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


def wait_for_piece(path: str, piece: int) -> None:
    """Return once no one holds a claim on ``piece`` of the entry at ``path``."""
    fd = _lock_fd(path)
    if fd < 0:
        return
    try:
        fcntl.fcntl(fd, _F_OFD_SETLKW, _flock(fcntl.F_RDLCK, piece))
    except OSError:
        return
    finally:
        _unlock_and_close(fd, piece)


def _lock_fd(path: str) -> int:
    """A descriptor of its own (an OFD lock belongs to one open file description, so the
    threads of one process exclude each other too); -1 when that cannot be had."""
    if _F_OFD_SETLK is None:
        return -1
    try:
        return os.open(os.path.join(path, "data"), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return -1


def _unlock_and_close(fd: int, piece: int) -> None:
    """Unlock, then close: a DataLoader worker forked meanwhile holds a copy of the descriptor,
    and the lock would last until that copy closed too (close alone releases nothing then)."""
    try:
        fcntl.fcntl(fd, _F_OFD_SETLK, _flock(fcntl.F_UNLCK, piece))
    except OSError:
        pass
    finally:
        os.close(fd)


def _flock(kind: int, byte: int) -> bytes:
    """A ``struct flock`` for one byte at ``byte`` (l_pid 0, as OFD locks require)."""
    return struct.pack("hhqqixxxx", kind, os.SEEK_SET, byte, 1, 0)

