"""The node cache: remote shard files' bytes kept in local files, shared by every process on a node.

Layout of the cache folder (one entry per remote file version; ``<name>`` is the xxh3-128 of its key)::

    .lock                   flock'd while entries are admitted, evicted or listed; never for data
    .totals.json            {dataset: bytes reserved}, while it agrees with the entries (cache_folder.TOTALS)
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

import errno
import os
import stat
import warnings
from typing import Literal, NamedTuple

import xxhash

from fastload.errors import CacheWarning
from fastload.format.files import kind_of, read_regular
from fastload.storage.cache_entry import CacheEntry
from fastload.storage.cache_entry_files import _Files, _map_len, _open, _present, _touch
from fastload.storage.cache_folder import (
    by_dataset,
    create_entry,
    drop_entry,
    locked,
    read_totals,
    scan_entries,
    write_totals,
)

__all__ = ["CacheInfo", "NodeCache"]


class CacheInfo(NamedTuple):
    """One entry as ``NodeCache.entries()`` reports it."""

    name: str
    dataset: str
    size: int
    present: int


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
        with locked(self.directory):
            return sum(read_totals(self.directory).values())

    def entries(self) -> list[CacheInfo]:
        """Every entry, least recently used first, with the bytes of it present."""
        with locked(self.directory):
            return [CacheInfo(f.name, f.dataset, f.size, _present(_read_map(self._path(f.name), f.size), f.size))
                    for f in scan_entries(self.directory)]

    def clear(self, dataset: str | None = None) -> None:
        """Evict every entry, or those of ``dataset``."""
        with locked(self.directory):
            for found in scan_entries(self.directory):
                if dataset is None or found.dataset == dataset:
                    drop_entry(self.directory, found.name)

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

    def _attach(self, name: str, key: str, size: int, dataset: str) -> _Files | None:
        """The entry's files, opened or admitted; None to read it through (no room, or trouble)."""
        if self.limit == 0 or size > self.limit:
            return None
        try:
            with locked(self.directory):
                return self._attach_locked(name, key, size, dataset)
        except OSError as exc:  # a full disk, a planted file, a permission: read through, never a crash
            self.bypass("keep a shard", exc)
            return None

    def _attach_locked(self, name: str, key: str, size: int, dataset: str) -> _Files | None:
        path = self._path(name)
        files = _open(path, key, size)
        if files is None:
            if os.path.lexists(path):  # damaged (a bad sidecar, a map of the wrong size, a link): made again
                drop_entry(self.directory, name)
            totals = self._make_room(size, dataset)
            if totals is None:
                return None
            create_entry(self.directory, name, key, size, dataset)
            totals[dataset] = totals.get(dataset, 0) + size
            write_totals(self.directory, totals)
            files = _open(path, key, size)
        _touch(path)
        return files

    def _make_room(self, size: int, dataset: str) -> dict[str, int] | None:
        """The totals once ``size`` more bytes fit, evicting what the policy allows; None if they cannot."""
        totals = read_totals(self.directory)
        used = sum(totals.values())
        if used + size <= self.limit:
            return totals
        if self.policy == "keep" and totals.get(dataset, 0) + size > self.limit:
            return None  # the common refusal, decided without looking at every entry
        found = scan_entries(self.directory)  # least recently used first
        used = sum(f.size for f in found)
        victims = [f for f in found if self.policy == "lru" or f.dataset != dataset]
        if used - sum(f.size for f in victims) + size > self.limit:
            return None  # evicting every candidate would not be enough: evict none
        evicted = set()
        for victim in victims:
            if used + size <= self.limit:
                break
            drop_entry(self.directory, victim.name)
            evicted.add(victim.name)
            used -= victim.size
        return by_dataset(f for f in found if f.name not in evicted)


def _read_map(path: str, size: int) -> bytes:
    try:
        return read_regular(os.path.join(path, "map"), _map_len(size), follow_links=False)
    except OSError:
        return b""
