"""The obstore client: S3 through Rust's ``object_store``, bodies streamed in large buffers straight
to where they go, every GET bounded by its range and its deadline.

Only obstore's blocking API is used, each GET on a thread of the client's pool (``max_in_flight``
threads): its asyncio bindings aborted a process at exit 2 times in 100 (a tokio worker waking an
asyncio loop while the interpreter ended); with no asyncio loop touched, 0 in 500 (docs/remote.md).
A blocking GET cannot be cancelled from Python, so its deadline is the store's own request timeout:
GETs go through a store per size class whose timeout is the deadline of the class's largest GET
(``config.request_deadline``), and a body that is still coming past its own deadline is stopped
at its next buffer.

obstore's runtime does not survive a fork: a process forked after it started here cannot use it
(``runtime_inherited``; the client choice falls back to fsspec there, see fastload.storage.client_choice).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, Literal

from fastload.config import request_deadline, request_timeout
from fastload.errors import MissingDependencyError
from fastload.optional import extra_hint
from fastload.storage.allocator import bound_malloc_arenas, give_back_freed_memory
from fastload.storage.client import Get, Sink, bounded_listing
from fastload.storage.obstore_config import builtin_error, first_line, s3_settings
from fastload.storage.ranged_get import PIECE, deadline_exceeded, too_long

_NOT_RANGED = re.compile(r"Content-Length Header missing|Content-Range|InvalidRangeRequest|range request", re.IGNORECASE)
_TIMED_OUT = re.compile(r"TimedOut|timed out", re.IGNORECASE)
_SMALLEST_CLASS = 1 << 16
"""GETs of up to 64 KiB share one store (and one deadline); above, one per power of two."""

SINK_CHUNK = 256 * 1024
"""A body streamed into a sink (a cache file) is written in buffers of this size: each GET in flight
holds one while it fills, and the heap keeps what the bursts of a cold start held (training from
the store, bench/remote_bench.py: peak 4-6 MB lower than with 1 MiB buffers, the same CPU)."""

_started_in: int | None = None  # the pid in which obstore's runtime started


def runtime_inherited() -> bool:
    """True in a process forked after obstore's runtime started in an ancestor (it cannot run here)."""
    return _started_in is not None and _started_in != os.getpid()


def size_class(num_bytes: int) -> int:
    """The bytes of the largest GET in ``num_bytes``'s class (a power of two, at least 64 KiB)."""
    return max(_SMALLEST_CLASS, 1 << max(num_bytes - 1, 0).bit_length())


class ObstoreClient:
    """The store folder ``url`` (``s3://bucket/prefix``) through obstore; made in the process that uses it."""

    name = "obstore"

    def __init__(self, url: str, options: dict[str, Any], max_in_flight: int) -> None:
        global _started_in
        try:
            import obstore
            from obstore.store import S3Store
        except ImportError as exc:
            raise MissingDependencyError(f"{url}: the obstore client needs the obstore package ({exc}); install "
                                         f"it: pip install obstore (or {extra_hint('remote')})") from exc
        self._obstore, self._make = obstore, S3Store
        bound_malloc_arenas()  # before the pool's threads: each would keep its own freed buffers
        self._bucket, self._prefix, self._settings = s3_settings(url, options)
        self.store = self._new_store(timedelta(minutes=30))  # stat, list, put, delete
        self._by_class: dict[tuple[int, float], Any] = {}
        self._lock = threading.Lock()
        self.max_in_flight = max(max_in_flight, 1)
        self._pool = _started_pool(self.max_in_flight)
        _started_in = os.getpid()

    def stat(self, name: str) -> tuple[int, str]:
        meta = self._call(lambda: self._obstore.head(self.store, name))
        return int(meta["size"]), str(meta.get("e_tag") or "")

    def get(self, gets: Sequence[Get]) -> list[bytes | BaseException]:
        return self._get_all(gets, None)

    def get_into(self, gets: Sequence[Get], sinks: Sequence[Sink]) -> list[BaseException | None]:
        return [None if isinstance(got, bytes) else got for got in self._get_all(gets, sinks)]

    def list(self) -> list[tuple[str, int, str]]:
        def listing() -> list[tuple[str, int, str]]:  # its pages fetched as they are read: bounded
            return bounded_listing((str(meta["path"]), int(meta["size"]), str(meta.get("e_tag") or ""))
                                   for batch in self._obstore.list(self.store) for meta in batch)
        return self._call(listing)

    def put_file(self, local: str, name: str) -> None:
        # multipart above 5 MiB, parts in flight; a file path is read by obstore, not through Python
        from pathlib import Path

        self._call(lambda: self._obstore.put(self.store, name, Path(local), max_concurrency=8))

    def put_bytes(self, name: str, data: bytes, if_match: str | None | Literal[False] = False) -> None:
        mode: Any = "overwrite" if if_match is False else "create" if if_match is None else {"e_tag": if_match}
        self._call(lambda: self._obstore.put(self.store, name, data, mode=mode))

    def copy(self, source: str, target: str) -> None:
        self._call(lambda: self._obstore.copy(self.store, source, target))

    def delete(self, name: str) -> None:
        self._call(lambda: self._obstore.delete(self.store, name))

    def drop_idle_connections(self) -> None:
        """Drop the stores, each with its pool of connections (new ones connect when next used);
        a request still running keeps its own store until it ends. Each connection holds a read
        buffer grown to what its bodies brought (up to ~400 KB), and the heap keeps what the
        burst freed: training from the store (bench/remote_bench.py, 1.36 GB filled into the
        cache) then held 72 sockets and 314 MB to the end; dropped, 1 socket and 289-291 MB
        after epoch 2 (the local run: 269 MB)."""
        with self._lock:
            dropped, self._by_class = [self.store, *self._by_class.values()], {}
            self.store = self._new_store(timedelta(minutes=30))  # connects when next used
        del dropped
        give_back_freed_memory()

    def _call(self, fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:
            raise builtin_error(exc) from exc

    def _new_store(self, timeout: timedelta) -> Any:
        settings = {**self._settings, "client_options": {**self._settings["client_options"], "timeout": timeout}}
        return self._make(self._bucket, prefix=self._prefix or None, **settings)

    def _store_for(self, want: int) -> tuple[Any, float]:
        """The store whose request timeout bounds a GET of ``want`` bytes, and that timeout."""
        key = (size_class(want), request_timeout())
        limit = request_deadline(key[0])
        with self._lock:
            store = self._by_class.get(key)
            if store is None:
                store = self._by_class[key] = self._new_store(timedelta(seconds=limit))
        return store, limit

    def _get_all(self, gets: Sequence[Get], sinks: Sequence[Sink] | None) -> list[Any]:
        def one(k: int) -> Any:
            try:
                return self._get_one(*gets[k], None if sinks is None else sinks[k])
            except Exception as exc:  # noqa: BLE001 - returned, classified by the caller
                return builtin_error(exc)
        if len(gets) <= 1:
            return [one(k) for k in range(len(gets))]
        return list(self._pool.map(one, range(len(gets))))

    def _get_one(self, name: str, start: int, end: int, sink: Sink | None) -> bytes:
        """One ranged GET: into ``sink`` as 256 KiB buffers arrive (returns b""), or whole (its 1 MiB
        buffers joined: asking obstore for one buffer of the whole body cost ~10 CPU-s per GB for
        4 MiB bodies, bench/client_bench.py). A byte past the range is BodyTooLong, read no further."""
        want, began = end - start, time.monotonic()
        if want <= 0:  # an empty object's whole body: object_store refuses a zero-length range
            return b""
        store, limit = self._store_for(want)
        waiting = "begin"
        try:
            try:
                result = self._obstore.get(store, name, options={"range": (start, end)})
            except Exception as exc:
                if _NOT_RANGED.search(str(exc)):  # a 200 to a ranged GET: object_store reads none of it
                    raise too_long(want, f"a body that is not the range (obstore: {first_line(exc)})", None) from exc
                raise
            first, last = result.range
            if first != start or last - first > want:
                raise too_long(want, f"bytes {first}-{last - 1}", None)
            waiting, deadline = "end", began + request_deadline(last - first)
            got, pieces = 0, []
            for buffer in result.stream(min_chunk_size=min(PIECE if sink is None else SINK_CHUNK, want)):
                got += len(buffer)
                if got > want:
                    raise too_long(want, f"{want + 1} or more bytes", None)
                if sink is None:
                    pieces.append(buffer)
                else:
                    sink.write(buffer)
                if got < last - first and time.monotonic() > deadline:  # a slow drip, stopped here
                    raise deadline_exceeded(deadline - began, waiting)
        except Exception as exc:
            # the store's timeout fired: the whole request ran past its size class's deadline
            if type(exc).__module__.startswith("obstore") and _TIMED_OUT.search(str(exc)) \
                    and time.monotonic() - began >= 0.9 * limit:
                raise deadline_exceeded(limit, waiting) from exc
            raise
        if sink is not None:
            return b""
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _started_pool(threads: int) -> ThreadPoolExecutor:
    """A pool whose ``threads`` threads are all running now. Started later, inside a read, a thread
    deadlocked: h5py reads a shard from within a callback holding its lock, and a new thread's first
    garbage collection freed an h5py object, which waits for that lock, while the reader waited for
    the thread to start. Its threads are joined at exit (none is cut off inside obstore)."""
    pool = ThreadPoolExecutor(threads, thread_name_prefix="fastload-obstore")
    all_up = threading.Barrier(threads + 1)
    for _ in range(threads):
        pool.submit(all_up.wait)
    all_up.wait()
    return pool
