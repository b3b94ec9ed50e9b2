"""The node cache: remote shard files' bytes kept in local files, shared by every process on a node.

Layout of the cache folder (one entry per remote file version; ``<name>`` is the xxh3-128 of its key)::

    .lock                   flock'd while entries are admitted, evicted or listed; never for data
    .totals.json            {dataset: bytes reserved}, while it agrees with the entries (TOTALS)
    <name>/data             the remote file's bytes at their own offsets: exactly its size, all reserved
    <name>/map              one byte per BLOCK of ``data``: 1 when that block's bytes are there
    <name>/meta.json        {"key", "dataset", "size", "block"}; its mtime is the entry's last use
    .tmp-<name>-<pid>/      an entry being made, renamed to ``<name>/`` once whole

An entry costs its whole size from the moment it is admitted, so concurrent writers never take the
cache past its limit, and its blocks are reserved on the disk then (``fallocate(2)``), so a full
disk refuses the admission instead of failing a write later, or killing the process with SIGBUS on a
store into a page of the mapped block map (tmpfs). Data is written first and its blocks marked present after, so a process killed
mid-write leaves blocks unmarked (fetched again), never marked but wrong; the caller still checks each
record against its checksum and calls ``invalidate()`` on a mismatch (a node that lost power may
keep a map page whose data pages were never written). An entry evicted while another process has it
open stays readable there (its files are unlinked, not gone); the disk is freed when the last process
lets it go, which an entry does on its next write or within TOUCH_EVERY seconds of reads.

The cache fails soft: its disk full, a file planted in its folder (a link, a FIFO, another user's
``.lock``), a permission or an I/O error is a CacheWarning (once per process and kind of trouble)
and a read from the store, never a crash. Nothing there is followed: a link in an entry's place is
removed and the entry made anew; a bad ``.lock`` is left for the user to remove (it may not be ours).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import stat
import warnings
from collections.abc import Iterable, Iterator
from typing import Literal, NamedTuple

import xxhash

from fastload.errors import CacheWarning
from fastload.format.files import create_new, kind_of, read_regular
from fastload.storage.cache_entry import CacheEntry
from fastload.storage.cache_entry_files import (
    BLOCK,
    _check_file,
    _Files,
    _map_len,
    _open,
    _present,
    _read_meta,
    _reserve,
    _touch,
)

TOTALS = ".totals.json"
"""Bytes reserved per dataset, so that most admissions read one small file instead of every entry.
It exists only while it agrees with the entries: removed before any entry is made or dropped, written
after, so a holder killed in between leaves the entries to be counted again."""

__all__ = ["CacheInfo", "NodeCache"]


_ENTRY = re.compile(r"[0-9a-f]{32}")


class CacheInfo(NamedTuple):
    """One entry as ``NodeCache.entries()`` reports it."""

    name: str
    dataset: str
    size: int
    present: int


class _Found(NamedTuple):
    used_ns: int
    name: str
    dataset: str
    size: int


class NodeCache:
    """The node-local cache of remote files' bytes, bounded by ``limit`` and shared by every process.

    Args:
        directory: the cache folder (created if missing; a link or a file there is refused).
        limit: bytes all entries may reserve together; 0 caches nothing.
        policy: what makes room for a new entry. ``"keep"`` evicts least recently used entries of
            other datasets only: under a global shuffle LRU evicts what the next epoch needs, so a
            cache smaller than the dataset keeps a fixed part of it, which then hits every epoch.
            ``"lru"`` evicts any dataset's (what Streaming does; kept to measure against).
    """

    def __init__(self, directory: str | os.PathLike[str], limit: int,
                 policy: Literal["keep", "lru"] = "keep") -> None:
        if policy not in ("keep", "lru"):
            raise ValueError(f"cache policy {policy!r}: must be 'keep' or 'lru'")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"cache limit {limit!r}: must be a number of bytes, 0 or more")
        self.directory, self.limit, self.policy = os.path.abspath(os.fspath(directory)), limit, policy
        self._warned: set[tuple[str, int | None]] = set()
        try:
            if not os.path.lexists(self.directory):
                os.makedirs(self.directory, exist_ok=True)
            mode = os.lstat(self.directory).st_mode
        except OSError as exc:  # a read-only home, say: the datasets are still read, from the store
            self.bypass("make its folder", exc)
            self.limit = 0  # caches nothing
            return
        if not stat.S_ISDIR(mode):
            raise ValueError(f"{self.directory}: the cache folder is {kind_of(mode)}, not a folder; fastload "
                             "never writes through links or into other files: give a real folder")

    def __str__(self) -> str:
        return self.directory

    def __repr__(self) -> str:
        return f"NodeCache({self.directory!r}, limit={self.limit}, policy={self.policy!r})"

    def entry(self, key: str, size: int, dataset: str) -> CacheEntry | None:
        """The entry of the remote file ``key`` (``size`` bytes), opened or admitted; None when it
        cannot be admitted (read through without caching)."""
        if size < 0:
            raise ValueError(f"{key}: size {size} is negative")
        name = xxhash.xxh3_128_hexdigest(key.encode())
        files = self._attach(name, key, size, dataset)
        return None if files is None else CacheEntry(self, name, key, size, dataset, files)

    def usage(self) -> int:
        """Bytes reserved by the admitted entries (each counts its whole size)."""
        with self._locked():
            return sum(self._totals().values())

    def entries(self) -> list[CacheInfo]:
        """Every entry, least recently used first, with the bytes of it present."""
        with self._locked():
            return [CacheInfo(f.name, f.dataset, f.size, _present(_read_map(self._path(f.name), f.size), f.size))
                    for f in self._scan()]

    def clear(self, dataset: str | None = None) -> None:
        """Evict every entry, or those of ``dataset``."""
        with self._locked():
            for found in self._scan():
                if dataset is None or found.dataset == dataset:
                    self._drop(found.name)

    def bypass(self, what: str, exc: OSError) -> None:
        """Warn, once per process for each kind of trouble, that the cache could not ``what``
        (the read that wanted it goes to the store)."""
        if (what, exc.errno) in self._warned:
            return
        self._warned.add((what, exc.errno))
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            advice = ("no room on its disk: free space there, or set a smaller cache_limit or another "
                      "cache_dir (FASTLOAD_CACHE_DIR)")
        else:
            advice = "check the files there and their permissions, or set another cache_dir (FASTLOAD_CACHE_DIR)"
        reason = f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else exc.strerror or exc
        warnings.warn(f"{self.directory}: the node cache could not {what} ({reason}); {advice}. "
                      "Reading from the store instead, without caching", CacheWarning, stacklevel=2)

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = _open_lock(self._path(".lock"))
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

    def _attach(self, name: str, key: str, size: int, dataset: str) -> _Files | None:
        """The entry's files, opened or admitted; None to read it through (no room, or trouble)."""
        if self.limit == 0 or size > self.limit:
            return None
        try:
            with self._locked():
                return self._attach_locked(name, key, size, dataset)
        except OSError as exc:  # a full disk, a planted file, a permission: read through, never a crash
            self.bypass("keep a shard", exc)
            return None

    def _attach_locked(self, name: str, key: str, size: int, dataset: str) -> _Files | None:
        path = self._path(name)
        files = _open(path, key, size)
        if files is None:
            if os.path.lexists(path):
                self._drop(name)  # damaged (a bad sidecar, a map of the wrong size, a link): made again
            totals = self._make_room(size, dataset)
            if totals is None:
                return None
            self._create(name, key, size, dataset)
            totals[dataset] = totals.get(dataset, 0) + size
            self._write_totals(totals)
            files = _open(path, key, size)
        _touch(path)
        return files

    def _totals(self) -> dict[str, int]:
        """Bytes reserved per dataset: from TOTALS (one small read) while it is there, else counted
        from the entries and written back."""
        try:
            totals = json.loads(read_regular(self._path(TOTALS), 1 << 24, follow_links=False))
            if isinstance(totals, dict) and all(type(v) is int and v > 0 for v in totals.values()):
                return totals
        except (OSError, ValueError):
            pass
        totals = _by_dataset(self._scan())
        self._write_totals(totals)
        return totals

    def _write_totals(self, totals: dict[str, int]) -> None:
        tmp = self._path(f".tmp-totals-{os.getpid()}")
        try:
            _write_new(tmp, json.dumps({k: v for k, v in totals.items() if v}).encode())
            os.rename(tmp, self._path(TOTALS))
        except OSError:  # a full disk: left absent, the totals are counted from the entries next time
            with contextlib.suppress(OSError):
                _remove(tmp)

    def _drop(self, name: str) -> None:
        """Evict one entry. TOTALS goes first: a holder killed midway leaves the entries to be counted."""
        _remove(self._path(TOTALS))
        _remove(self._path(name))

    def _scan(self) -> list[_Found]:
        """The whole entries, least recently used first. Under the lock: a temporary seen now was
        left by a holder that died (one hold makes and renames it), whatever its pid; a damaged
        entry is dropped."""
        found = []
        for name in os.listdir(self.directory):
            path = self._path(name)
            if name.startswith(".tmp-"):
                _remove(path)
            elif _ENTRY.fullmatch(name):
                try:
                    meta = _read_meta(path)
                    _check_file(os.path.join(path, "data"), meta["size"])
                    _check_file(os.path.join(path, "map"), _map_len(meta["size"]))
                    used_ns = os.stat(os.path.join(path, "meta.json")).st_mtime_ns
                except (OSError, ValueError):
                    self._drop(name)
                    continue
                found.append(_Found(used_ns, name, meta["dataset"], meta["size"]))
        return sorted(found)

    def _make_room(self, size: int, dataset: str) -> dict[str, int] | None:
        """The totals once ``size`` more bytes fit, evicting what the policy allows; None if they cannot."""
        totals = self._totals()
        used = sum(totals.values())
        if used + size <= self.limit:
            return totals
        if self.policy == "keep" and totals.get(dataset, 0) + size > self.limit:
            return None  # the common refusal, decided without looking at every entry
        found = self._scan()  # least recently used first
        used = sum(f.size for f in found)
        victims = [f for f in found if self.policy == "lru" or f.dataset != dataset]
        if used - sum(f.size for f in victims) + size > self.limit:
            return None  # evicting every candidate would not be enough: evict none
        evicted = set()
        for victim in victims:
            if used + size <= self.limit:
                break
            self._drop(victim.name)
            evicted.add(victim.name)
            used -= victim.size
        return _by_dataset(f for f in found if f.name not in evicted)

    def _create(self, name: str, key: str, size: int, dataset: str) -> None:
        _remove(self._path(TOTALS))  # until this entry is counted in it
        for stale in os.listdir(self.directory):
            if stale.startswith(".tmp-"):
                _remove(self._path(stale))  # left by a holder that died (see _scan)
        room = os.statvfs(self.directory)
        if room.f_bavail * room.f_frsize < size + _map_len(size):  # refused at once, nothing reserved
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} for a {size}-byte shard")
        tmp = self._path(f".tmp-{name}-{os.getpid()}")
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
            os.rename(tmp, self._path(name))
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


def _by_dataset(found: Iterable[_Found]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for entry in found:
        totals[entry.dataset] = totals.get(entry.dataset, 0) + entry.size
    return totals


def _read_map(path: str, size: int) -> bytes:
    try:
        return read_regular(os.path.join(path, "map"), _map_len(size), follow_links=False)
    except OSError:
        return b""


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


