"""The node cache: remote shard files' bytes kept in sparse local files, shared by every process on a node.

Layout of the cache folder (one entry per remote file version; ``<name>`` is the xxh3-128 of its key)::

    .lock                   flock'd while entries are admitted, evicted or listed; never for data
    .totals.json            {dataset: bytes reserved}, while it agrees with the entries (TOTALS)
    <name>/data             the remote file's bytes at their own offsets: sparse, exactly its size
    <name>/map              one byte per BLOCK of ``data``: 1 when that block's bytes are there
    <name>/meta.json        {"key", "dataset", "size", "block"}; its mtime is the entry's last use
    .tmp-<name>-<pid>/      an entry being made, renamed to ``<name>/`` once whole

An entry costs its whole size from the moment it is admitted, so concurrent writers never take the
cache past its limit. Data is written first and its blocks marked present after, so a process killed
mid-write leaves blocks unmarked (fetched again), never marked but wrong; the caller still checks each
record against its checksum and calls ``invalidate()`` on a mismatch (a node that lost power may
keep a map page whose data pages were never written). An entry evicted while another process has it
open stays readable there (its files are unlinked, not gone); the disk is freed when the last process
lets it go, which an entry does on its next write or within TOUCH_EVERY seconds of reads.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import mmap
import os
import re
import shutil
import stat
import threading
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Literal, NamedTuple

import xxhash

from fastload.errors import FastloadError
from fastload.format.files import create_new, kind_of, read_regular

BLOCK = 64 * 1024
"""The unit of presence: bytes are kept, marked and evicted whole blocks at a time (one map byte each)."""

TOUCH_EVERY = 60.0
"""Seconds between two checks by one process's reads that an entry is still the cache's (and is used)."""

TOTALS = ".totals.json"
"""Bytes reserved per dataset, so that most admissions read one small file instead of every entry.
It exists only while it agrees with the entries: removed before any entry is made or dropped, written
after, so a holder killed in between leaves the entries to be counted again."""

_ENTRY = re.compile(r"[0-9a-f]{32}")
_ABSENT = re.compile(rb"\x00+")


class BlocksMissing(FastloadError, LookupError):
    """A read asked for bytes whose cache blocks are not present: fetch what ``missing()`` names first."""


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
        if not os.path.lexists(self.directory):
            os.makedirs(self.directory, exist_ok=True)
        mode = os.lstat(self.directory).st_mode
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

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self._path(".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released by the kernel if this process is killed
            yield
        finally:
            os.close(fd)

    def _attach(self, name: str, key: str, size: int, dataset: str) -> _Files | None:
        if self.limit == 0 or size > self.limit:
            return None
        path = self._path(name)
        with self._locked():
            files = _open(path, key, size)
            if files is None:
                if os.path.lexists(path):
                    self._drop(name)  # damaged (a bad sidecar, a map of the wrong size): made again
                totals = self._make_room(size, dataset)
                if totals is None:
                    return None
                try:
                    self._create(name, key, size, dataset)
                except OSError as exc:  # a full disk must not stop training: read through
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    warnings.warn(f"{self.directory}: no room on its disk for a {size}-byte entry "
                                  f"({exc.strerror}); reading {key} without caching", stacklevel=3)
                    return None
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
        _write_new(tmp, json.dumps({k: v for k, v in totals.items() if v}).encode())
        os.rename(tmp, self._path(TOTALS))

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
        tmp = self._path(f".tmp-{name}-{os.getpid()}")
        os.mkdir(tmp)
        for file, length in (("data", size), ("map", _map_len(size))):
            fd = create_new(os.path.join(tmp, file))
            try:
                os.ftruncate(fd, length)  # sparse data, an all-absent map
            finally:
                os.close(fd)
        meta = {"key": key, "dataset": dataset, "size": size, "block": BLOCK}
        _write_new(os.path.join(tmp, "meta.json"), json.dumps(meta).encode())
        os.rename(tmp, self._path(name))


class CacheEntry:
    """One remote file's bytes in the node cache: read where present, written whole blocks at a time.

    Safe for concurrent use by threads (``pread``/``pwrite`` and single-byte map stores need no lock).
    Pickled or inherited through fork, an entry opens its files again in the new process.
    """

    def __init__(self, cache: NodeCache, name: str, key: str, size: int, dataset: str, files: _Files) -> None:
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
            raise BlocksMissing(f"{self.path}: bytes {start}..{end} of {self.key} are not all cached; "
                                "fetch and write the spans missing() names, then read")
        parts = []
        while start < end:
            part = os.pread(files.fd, end - start, start)
            if not part:
                raise OSError(f"{self.path}/data: ends before byte {start} (truncated by hand?); "
                              "clear the cache")
            parts.append(part)
            start += len(part)
        if time.monotonic() - self._checked > TOUCH_EVERY:
            self._checked = time.monotonic()
            if os.fstat(files.fd).st_nlink == 0:
                self._reattach(files)  # evicted elsewhere: let go of its unlinked file
            else:
                _touch(self.path)
        return parts[0] if len(parts) == 1 else b"".join(parts)

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
        if files.fd >= 0 and os.fstat(files.fd).st_nlink == 0:
            files = self._reattach(files)  # evicted by another process: writing there would leak disk
        if files.fd < 0 or not view:
            return files.fd >= 0
        position = offset
        while view:
            written = os.pwrite(files.fd, view, position)
            view, position = view[written:], position + written
        first = offset // BLOCK
        files.map[first:-(-end // BLOCK)] = b"\x01" * (-(-end // BLOCK) - first)  # only now: data is there
        return True

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
        return files if files is not None else _Files(-1, bytearray(_map_len(self.size)))


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
            files.map = mmap.mmap(map_fd, _map_len(size), mmap.MAP_SHARED)  # every process sees every mark
        finally:
            os.close(map_fd)  # the mapping stays
        if files.map[:].translate(None, b"\x00\x01"):
            raise ValueError("map holds bytes other than 0 and 1")
        return files
    except (OSError, ValueError):
        return None


def _read_meta(path: str) -> dict:
    meta = json.loads(read_regular(os.path.join(path, "meta.json"), 1 << 16, follow_links=False))
    if not (isinstance(meta, dict) and isinstance(meta.get("key"), str) and isinstance(meta.get("dataset"), str)
            and type(meta.get("size")) is int and meta["size"] >= 0 and meta.get("block") == BLOCK):
        raise ValueError(f"{path}/meta.json: not an entry's sidecar")
    return meta


def _by_dataset(found: Iterable[_Found]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for entry in found:
        totals[entry.dataset] = totals.get(entry.dataset, 0) + entry.size
    return totals


def _check_file(path: str, size: int) -> None:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size != size:
        raise ValueError(f"{path}: {kind_of(st.st_mode)} of {st.st_size} bytes, expected {size}")


def _read_map(path: str, size: int) -> bytes:
    try:
        return read_regular(os.path.join(path, "map"), _map_len(size), follow_links=False)
    except OSError:
        return b""


def _present(present: mmap.mmap | bytearray | bytes, size: int) -> int:
    count = present[:].count(1)
    blocks = -(-size // BLOCK)
    if count and blocks and present[blocks - 1] == 1:
        return count * BLOCK - (blocks * BLOCK - size)  # the last block is short
    return count * BLOCK


def _map_len(size: int) -> int:
    return max(1, -(-size // BLOCK))  # an empty file still maps one (unused) byte: mmap needs one


def _write_new(path: str, data: bytes) -> None:
    fd = create_new(path)
    try:
        os.write(fd, data)  # a few hundred bytes: one write (a short one is refused when read back)
    finally:
        os.close(fd)


def _touch(path: str) -> None:
    now = time.time_ns()  # set, not taken from the file system's clock, which ticks only every few ms
    with contextlib.suppress(FileNotFoundError):
        os.utime(os.path.join(path, "meta.json"), ns=(now, now), follow_symlinks=False)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path)  # never follows a link inside
        else:
            os.unlink(path)


_open_lock = threading.Lock()


def _new_lock_after_fork() -> None:
    """A parent thread may have held the lock at the fork; the child's copy would stay locked."""
    global _open_lock
    _open_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)
