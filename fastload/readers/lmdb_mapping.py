"""LMDB reader, memory: read records without mapping them; unmap the B-tree pages now and then.

liblmdb maps each shard file and every page a read touches stays mapped: a process that has
read a whole dataset shows the dataset's size in its RSS (page cache, but counted as the
process's own by RSS, PSS, ``top`` and out-of-memory heuristics), the classic "LMDB leaks in my
DataLoader workers" report. So fastload lets liblmdb find a record (``buffers=True``: it walks
the B-tree and touches none of the record's pages) and reads the bytes with ``pread`` at the
same offset of the file (:func:`copy_out`). The B-tree pages the walks map are let go once a
process has read :data:`RELEASE_EVERY` bytes (``MADV_DONTNEED`` on a shared, read-only file
mapping): the pages stay in the page cache and a later walk maps them again with a minor fault.
Between releases the kernel maps the page-cache pages around each fault too, whole folios on
recent kernels. Not after every record: each release flushes the TLB of every CPU running the
process and makes the B-tree's branch pages fault in again (measured: shuffled warm reads at
0.4x with a release per 4 records).
"""

from __future__ import annotations

import ctypes
import os
import threading
import weakref
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

_MADV_DONTNEED = 4  # Linux
RELEASE_EVERY = 4 << 20
"""Bytes a process reads out of LMDB shards between two releases of their mapped pages."""

# Environment → (start, length) of its data file mapping, and a descriptor of the file for
# copy_out (-1: none could be opened). Weak keys: an entry lives exactly as long as its
# environment, so an address is never advised after liblmdb has unmapped it (the range could by
# then hold other memory, which MADV_DONTNEED would zero).
_maps: weakref.WeakKeyDictionary[Any, tuple[int, int, int]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_unreleased = 0  # bytes read since the last release


def _madvise() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


_advise = _madvise()


def find_mapping(path: Path) -> tuple[int, int] | None:
    """``(start, length)`` of this process's mapping of ``path`` (by device and inode), from
    ``/proc/self/maps``; None when there is no such file or mapping, or more than one."""
    try:
        st = os.stat(path)
        with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
            lines = maps.readlines()
    except OSError:
        return None
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    found = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) >= 5 and fields[4] == str(st.st_ino) and fields[3] == device:
            start, end = (int(v, 16) for v in fields[0].split("-"))
            found.append((start, end - start))
    return found[0] if len(found) == 1 else None


def track(env: Any, path: Path, readahead: bool = True) -> None:
    """Remember where ``env`` (just opened on ``path``) mapped its file, and open the file for
    :func:`copy_out` (closed when ``env`` goes); ``readahead=False``: tell the kernel its reads
    are random, so a cold read does not drag in the neighbouring records."""
    mapping = find_mapping(path)
    if mapping is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        fd = -1  # copy_out copies from the map instead
    else:
        weakref.finalize(env, os.close, fd)
        if not readahead:
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            except OSError:
                pass  # a hint only
    with _lock:
        _maps[env] = (mapping[0], mapping[1], fd)


def copy_out(env: Any, value: memoryview) -> bytes:
    """The bytes of ``value``, a buffer liblmdb returned into ``env``'s map, read with ``pread``.

    Copying out of the map would fault its pages in, and recent kernels map whole page-cache
    folios per fault (6.18: 38-55 MB of shard pages mapped per 6.4 MB batch of photos), all
    counted as the process's memory until the next release. liblmdb finds a record without
    touching its pages (only the B-tree's), so its address in the map is its offset in the
    file. Falls back to copying from the map for an environment :func:`track` could not locate
    or whose file it could not open.
    """
    where = _maps.get(env)
    size = len(value)
    if where is None or where[2] < 0 or size == 0:
        return bytes(value)
    start, length, fd = where
    offset = np.frombuffer(value, dtype=np.uint8).ctypes.data - start
    if not 0 <= offset <= length - size:
        return bytes(value)
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise OSError(f"read {len(data)} of {size} bytes at offset {offset}: the file is shorter")
    return data


def note_read(nbytes: int) -> None:
    """Count ``nbytes`` of records read from shards; past :data:`RELEASE_EVERY`, release every
    shard's mapped pages."""
    global _unreleased
    with _lock:
        _unreleased += nbytes
        if _unreleased < RELEASE_EVERY:
            return
        _unreleased = 0
        envs = list(_maps.keys())
    for env in envs:
        release(env)


def release(env: Any) -> None:
    """Unmap, from this process only, the pages of ``env`` that reads have mapped so far.

    Safe while other threads read through ``env``: a page they touch next faults back in from
    the page cache with the same bytes (a shared file mapping is never zero-filled).
    """
    mapping = _maps.get(env)
    if mapping is None or _advise is None:
        return
    try:
        env.info()  # closed (fastload never closes one, but a caller could): its range is gone
    except lmdb.Error:
        return
    _advise(mapping[0], mapping[1], _MADV_DONTNEED)


def _reset_after_fork() -> None:
    """A parent thread may have held the lock at the fork; the child's copy would stay locked."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)
