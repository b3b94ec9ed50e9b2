"""glibc malloc settings fastload makes for the process it runs in (or for the worker processes it
starts), each for a measured cause (with another C library nothing changes). A setting stays for
the process's life: glibc has no per-thread ones.

* ``give_back_large_blocks``: a pack that decodes (Pillow's 16 MB blocks; converters.packing).
* ``keep_freed_heap``: a ``pack --ray`` worker, between its parts (converters.cluster.ray_tasks).
* ``bound_malloc_arenas``: reading an object store (the client's threads; fastload.storage.client_obstore).
* ``give_back_freed_memory``: once a store client's burst of reads is over (the same).
* ``bounded_arenas_env``: the environment a ``pack --ray`` task's worker process starts with.
* ``malloc_arenas``: how many arenas a process has (what the tests count).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from fastload.config import available_cpus

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters


def _glibc(name: str) -> Any:
    """glibc's function ``name`` (``mallopt``, ``malloc_trim``, ...), or None under another C library."""
    return getattr(ctypes.CDLL(None), name, None)


def give_back_large_blocks(threshold: int = 4 * 2**20) -> None:
    """Make freed blocks of ``threshold`` bytes or more go back to the system at once.

    Pillow holds a decoded image in 16 MB blocks. glibc raises its mmap threshold to the largest
    block freed (up to 32 MB), so after the first image such blocks come from, and stay in, the
    arena of the thread that decoded it: 8 decode threads kept 8 images' worth of memory (8 PNGs
    of 48 Mpx: 1,147 MB peak, 410 MB with this). Setting the threshold fixes it for the process.
    """
    mallopt = _glibc("mallopt")
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, threshold)


def keep_freed_heap(top: int) -> None:
    """Keep up to ``top`` bytes of freed heap for the next allocations instead of handing them back
    (``M_TRIM_THRESHOLD``), blocks of 4 MB or more still going back at once (give_back_large_blocks)."""
    mallopt = _glibc("mallopt")
    if mallopt is not None:
        give_back_large_blocks()  # a fixed mmap threshold: smaller blocks come from the heap kept below
        mallopt(M_TRIM_THRESHOLD, top)


def bound_malloc_arenas() -> None:
    """Let the process's threads share at most one malloc arena per core (at least 2), unless
    ``MALLOC_ARENA_MAX`` says otherwise (the user's choice wins).

    glibc gives threads up to 8 arenas per core, and each arena keeps the top of the memory its
    threads freed. A store client runs ``max_in_flight`` (64) threads of GETs whose buffers come and
    go: training from the store (bench/remote_bench.py, 2 cores, moto behind a 20 ms proxy) peaked
    at 1.28x the local run's memory, about 40 MB of it freed buffers kept in 16 arenas; with 2
    arenas 1.14-1.17x, and the training process used no more CPU (9.4-9.9 CPU-s for epoch 1,
    against 10.0). Arenas already made stay; later threads share the bounded set.
    """
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    mallopt = _glibc("mallopt")
    if mallopt is not None:
        mallopt(M_ARENA_MAX, max(2, available_cpus()))


def give_back_freed_memory() -> None:
    """Hand the pages of every freed block back to the system now (``malloc_trim``): after a
    burst whose buffers are gone, the heap keeps them otherwise."""
    trim = _glibc("malloc_trim")
    if trim is not None:
        trim(0)


def bounded_arenas_env(arenas: int) -> dict[str, str]:
    """The environment that bounds a process started with it to ``arenas`` malloc arenas, unless
    this process's ``MALLOC_ARENA_MAX`` says otherwise (the user's choice wins). Only a new process
    can be bounded from its start: arenas already made stay, and later threads share them all."""
    return {"MALLOC_ARENA_MAX": os.environ.get("MALLOC_ARENA_MAX", str(arenas))}


def malloc_arenas() -> int | None:
    """The malloc arenas this process has now (glibc's ``malloc_info``), or None under another C library."""
    import tempfile

    if _glibc("malloc_info") is None:
        return None
    libc = ctypes.CDLL(None)
    libc.fopen.restype = ctypes.c_void_p
    with tempfile.NamedTemporaryFile(suffix=".xml") as info:
        stream = libc.fopen(info.name.encode(), b"w")
        libc.malloc_info(0, ctypes.c_void_p(stream))
        libc.fclose(ctypes.c_void_p(stream))
        return Path(info.name).read_text().count("<heap nr=")
