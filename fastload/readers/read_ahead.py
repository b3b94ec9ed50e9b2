"""Read-ahead: a batch's reads in flight at once (thread pools per process, page-cache probes, hints)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor


class PendingReads:
    """A batch's reads under way (``start_reads``)."""

    def __init__(self, wait: Callable[[], list[bytes]] | None = None, future: Future[list[bytes]] | None = None,
                 pending: Sequence[Future[bytes]] = (), error: BaseException | None = None) -> None:
        self._wait, self._future, self._pending, self._error = wait, future, pending, error

    def result(self) -> list[bytes]:
        """The payloads, once every read has landed; what a read raised, raised here."""
        if self._error is not None:
            raise self._error
        if self._future is not None:
            return self._future.result()
        assert self._wait is not None
        return self._wait()

    def cancel(self) -> None:
        """Drop the reads not yet begun (an iteration that stops early)."""
        for read in (*self._pending, *((self._future,) if self._future is not None else ())):
            read.cancel()


COLD_READS_IN_FLIGHT = 64
"""Threads reading records that are not in the page cache (a local disk serves many at once)."""

BATCH_FETCHES = 4
"""Threads fetching remote batches started ahead (``start_reads``): one waited for, one behind it,
for two readers at once."""

SHARD_OPENS = 8
"""Remote shards a process opens at once at most (``ShardReader.open_shards``)."""

OPENS_IN_TURN = 8
"""Shards opened one after another before more are opened side by side (``ShardReader.open_shards``)."""

_pools: dict[str, tuple[int, ThreadPoolExecutor]] = {}  # name -> (pid that made it, pool)


def _process_pool(name: str, threads: int) -> ThreadPoolExecutor:
    """This process's pool ``name`` (made again after a fork: a pool's threads do not survive one)."""
    made = _pools.get(name)
    if made is None or made[0] != os.getpid():
        with _pool_lock:
            made = _pools.get(name)
            if made is None or made[0] != os.getpid():
                made = _pools[name] = (os.getpid(), ThreadPoolExecutor(threads, thread_name_prefix=f"fastload-{name}"))
    return made[1]


def cold_reads() -> ThreadPoolExecutor:
    """The reads that wait for the disk."""
    return _process_pool("read", COLD_READS_IN_FLIGHT)


def batch_fetches() -> ThreadPoolExecutor:
    """The remote batches started ahead."""
    return _process_pool("fetch", BATCH_FETCHES)


def shard_opens() -> ThreadPoolExecutor:
    """The remote shards being opened side by side."""
    return _process_pool("open", SHARD_OPENS)


def will_need(places: Sequence[tuple[int, int, int]]) -> None:
    """``POSIX_FADV_WILLNEED`` for each ``(fd, offset, size)``: the kernel starts those reads now."""
    for fd, offset, size in places:
        try:
            os.posix_fadvise(fd, offset, size, os.POSIX_FADV_WILLNEED)
        except OSError:
            continue  # a hint only


def read_if_cached(fd: int, offset: int, size: int) -> bytes | None:
    """The bytes if the page cache holds them all, else None without waiting for the disk."""
    if not size:
        return b""
    buf = bytearray(size)
    try:
        got = os.preadv(fd, [buf], offset, os.RWF_NOWAIT)
    except OSError:  # EAGAIN: some page is on disk (or the file system cannot say): read it for real
        return None
    return bytes(buf) if got == size else None


_pool_lock = threading.Lock()


def _new_lock_after_fork() -> None:
    """A parent thread may have held the lock at the fork; the child's copy would stay locked."""
    global _pool_lock
    _pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)
