"""LMDB reader, memory: drop the process's mappings of shard pages once their records are copied.

liblmdb maps each shard file and every page a read touches stays mapped: a process that has
read a whole dataset shows the dataset's size in its RSS (page cache, but counted as the
process's own by RSS, PSS, ``top`` and out-of-memory heuristics), the classic "LMDB leaks in my
DataLoader workers" report. fastload copies every record out of the map (``buffers=False``), so
after a batch it tells the kernel the process no longer needs those page mappings
(``MADV_DONTNEED`` on a shared, read-only file mapping): the pages stay in the page cache, a
later read maps them again with a minor fault, and RSS stays at what the process itself holds.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from pathlib import Path
from typing import Any

_MADV_DONTNEED = 4  # Linux

# Environment → (start, length) of its data file mapping. Weak keys: an entry lives exactly as
# long as its environment, so an address is never advised after liblmdb has unmapped it (the
# range could by then hold other memory, which MADV_DONTNEED would zero).
_ranges: weakref.WeakKeyDictionary[Any, tuple[int, int]] = weakref.WeakKeyDictionary()


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


def track(env: Any, path: Path) -> None:
    """Remember where ``env`` (just opened on ``path``) mapped its file."""
    mapping = find_mapping(path)
    if mapping is not None and _advise is not None:
        _ranges[env] = mapping


def release(env: Any) -> None:
    """Unmap, from this process only, the pages of ``env`` that reads have mapped so far.

    Safe while other threads read through ``env``: a page they touch next faults back in from
    the page cache with the same bytes (a shared file mapping is never zero-filled).
    """
    mapping = _ranges.get(env)
    if mapping is not None:
        _advise(mapping[0], mapping[1], _MADV_DONTNEED)
