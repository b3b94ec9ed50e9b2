"""The node cache's folder: its lock, its entries listed, made and dropped, and their totals.

See fastload.storage.cache for the layout and the rules they keep."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import stat
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from fastload.format.files import create_new, kind_of, read_regular
from fastload.storage.cache_entry_files import BLOCK, _check_file, _map_len, _read_meta, _reserve

TOTALS = ".totals.json"
"""Bytes reserved per dataset, so that most admissions read one small file instead of every entry.
It exists only while it agrees with the entries: removed before any entry is made or dropped, written
after, so a holder killed in between leaves the entries to be counted again."""

_ENTRY = re.compile(r"[0-9a-f]{32}")


class _Found(NamedTuple):
    used_ns: int
    name: str
    dataset: str
    size: int


@contextlib.contextmanager
def locked(directory: str) -> Iterator[None]:
    """Hold the cache folder's ``.lock`` (while entries are admitted, evicted or listed; never for data)."""
    fd = _open_lock(os.path.join(directory, ".lock"))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process is killed
        try:
            yield
        finally:
            # Unlocked before the close: a process forked while the lock was held has a copy of
            # this descriptor, and a flock lasts until every copy is closed (a DataLoader
            # worker forked during a fill would hold it for its whole life).
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def read_totals(directory: str) -> dict[str, int]:
    """Bytes reserved per dataset: from TOTALS (one small read) while it is there, else counted
    from the entries and written back."""
    try:
        totals = json.loads(read_regular(os.path.join(directory, TOTALS), 1 << 24, follow_links=False))
        if isinstance(totals, dict) and all(type(v) is int and v > 0 for v in totals.values()):
            return totals
    except (OSError, ValueError):
        pass
    totals = by_dataset(scan_entries(directory))
    write_totals(directory, totals)
    return totals


def write_totals(directory: str, totals: dict[str, int]) -> None:
    tmp = os.path.join(directory, f".tmp-totals-{os.getpid()}")
    try:
        _write_new(tmp, json.dumps({k: v for k, v in totals.items() if v}).encode())
        os.rename(tmp, os.path.join(directory, TOTALS))
    except OSError:  # a full disk: left absent, the totals are counted from the entries next time
        with contextlib.suppress(OSError):
            _remove(tmp)


def drop_entry(directory: str, name: str) -> None:
    """Evict one entry. TOTALS goes first: a holder killed midway leaves the entries to be counted."""
    _remove(os.path.join(directory, TOTALS))
    _remove(os.path.join(directory, name))


def scan_entries(directory: str) -> list[_Found]:
    """The whole entries, least recently used first. Under the lock: a temporary seen now was
    left by a holder that died (one hold makes and renames it), whatever its pid; a damaged
    entry is dropped."""
    found = []
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if name.startswith(".tmp-"):
            _remove(path)
        elif _ENTRY.fullmatch(name):
            try:
                meta = _read_meta(path)
                _check_file(os.path.join(path, "data"), meta["size"])
                _check_file(os.path.join(path, "map"), _map_len(meta["size"]))
                used_ns = os.stat(os.path.join(path, "meta.json")).st_mtime_ns
            except (OSError, ValueError):
                drop_entry(directory, name)
                continue
            found.append(_Found(used_ns, name, meta["dataset"], meta["size"]))
    return sorted(found)


def create_entry(directory: str, name: str, key: str, size: int, dataset: str) -> None:
    _remove(os.path.join(directory, TOTALS))  # until this entry is counted in it
    for stale in os.listdir(directory):
        if stale.startswith(".tmp-"):
            _remove(os.path.join(directory, stale))  # left by a holder that died (see scan_entries)
    room = os.statvfs(directory)
    if room.f_bavail * room.f_frsize < size + _map_len(size):  # refused at once, nothing reserved
        raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} for a {size}-byte shard")
    tmp = os.path.join(directory, f".tmp-{name}-{os.getpid()}")
    os.mkdir(tmp)
    try:
        for file, length in (("data", size), ("map", _map_len(size))):
            fd = create_new(os.path.join(tmp, file))
            try:
                _reserve(fd, length, emulated=file == "map")  # zeros: an all-absent map
            finally:
                os.close(fd)
        meta = {"key": key, "dataset": dataset, "size": size, "block": BLOCK}
        _write_new(os.path.join(tmp, "meta.json"), json.dumps(meta).encode())
        os.rename(tmp, os.path.join(directory, name))
    except BaseException:
        with contextlib.suppress(OSError):
            _remove(tmp)  # now: what it reserved is freed at once
        raise


def _open_lock(path: str) -> int:
    """A descriptor of the cache's lock file: a regular file of this user's, created if missing;
    a link there is never followed, nor a FIFO waited on (OSError saying what is there)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENXIO):  # a link, a folder, a socket
            raise
        found = os.lstat(path)
    else:
        found = os.fstat(fd)
        if stat.S_ISREG(found.st_mode) and found.st_uid == os.geteuid():
            return fd
        os.close(fd)
    raise OSError(errno.EPERM, f"{path} is {kind_of(found.st_mode)} owned by uid {found.st_uid}, not a lock "
                               f"file of this user's (uid {os.geteuid()}); fastload never follows links "
                               "or uses others' files in its cache folder: remove it")


def by_dataset(found: Iterable[_Found]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for entry in found:
        totals[entry.dataset] = totals.get(entry.dataset, 0) + entry.size
    return totals


def _write_new(path: str, data: bytes) -> None:
    fd = create_new(path)
    try:
        os.write(fd, data)  # a few hundred bytes: one write (a short one is refused when read back)
    finally:
        os.close(fd)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)  # never follows a link inside
        else:
            os.unlink(path)
