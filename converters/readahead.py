"""Reading source files in order with many reads in flight: kernel read-ahead, or a thread pool.

Measured on the 2-core machine with 10,000 ~105 KB JPEGs: one thread reading in order takes
0.28 s from a warm page cache, while a pool of 8 threads takes 1.07 s (a future and two GIL
hand-offs per file cost more than the read). From a cold cache one thread stalls on every file;
asking the kernel to fetch the next files (``posix_fadvise(WILLNEED)`` on files opened ahead)
keeps the disk busy without threads: 0.3–0.5 s cold against 0.7 s serial and 0.5 s with 8 threads.
So plain copies read on the packing thread with kernel read-ahead; a pool is used only when each
file needs real CPU work (full decode, re-encode), where Pillow releases the GIL.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def read_in_order(paths: Sequence[str], depth: int) -> Iterator[bytes | OSError]:
    """Each file's bytes (or the OSError that stopped it), in order, with ``depth`` files prefetched."""
    opened: deque[int | OSError] = deque()
    upcoming = iter(paths)

    def open_next() -> None:
        path = next(upcoming, None)
        if path is None:
            return
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            opened.append(exc)
            return
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)  # starts the read, returns at once
        except OSError:
            pass  # a file system without fadvise reads on demand
        opened.append(fd)

    try:
        for _ in range(max(depth, 1)):
            open_next()
        while opened:
            fd = opened.popleft()
            open_next()
            if isinstance(fd, OSError):
                yield fd
                continue
            try:
                yield _read_all(fd)
            except OSError as exc:
                yield exc
            finally:
                os.close(fd)
    finally:
        for fd in opened:
            if isinstance(fd, int):
                os.close(fd)


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    data = os.read(fd, size + 1)  # one byte more: a file that grew (or a short read) reads on
    return data if len(data) == size else data + _rest(fd)


def _rest(fd: int) -> bytes:
    parts = []
    while chunk := os.read(fd, 1 << 20):
        parts.append(chunk)
    return b"".join(parts)


def map_in_order(pool: ThreadPoolExecutor, fn: Callable[[int], T], indices: Iterable[int],
                 weight: Callable[[int], int], max_items: int, max_weight: int) -> Iterator[T]:
    """``fn(i)`` for each index on ``pool``, results in order, with what is in flight bounded
    by count and by total ``weight`` (source bytes)."""
    window: deque[tuple[int, Future[T]]] = deque()
    inflight = 0
    try:
        for i in indices:
            window.append((i, pool.submit(fn, i)))
            inflight += weight(i)
            while window and (len(window) >= max_items or inflight > max_weight):
                done, future = window.popleft()
                inflight -= weight(done)
                yield future.result()
        while window:
            yield window.popleft()[1].result()
    finally:
        for _, future in window:
            future.cancel()
