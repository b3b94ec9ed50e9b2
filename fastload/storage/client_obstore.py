"""The obstore client: S3 through Rust's ``object_store``, bodies streamed in large buffers straight
to where they go, every GET bounded by its range and its deadline, each batch on an event loop of its own.

obstore's runtime does not survive a fork: a process forked after it started here cannot use it
(``runtime_inherited``; the client choice falls back to fsspec there, see fastload.storage.client).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from fastload.config import request_deadline, request_timeout
from fastload.errors import MissingDependencyError
from fastload.optional import extra_hint
from fastload.storage.client import Get, Sink
from fastload.storage.obstore_config import builtin_error, first_line, s3_settings
from fastload.storage.ranged_get import PIECE, _deadline, _too_long

_NOT_RANGED = re.compile(r"Content-Length Header missing|Content-Range|InvalidRangeRequest|range request", re.IGNORECASE)

_started_in: int | None = None  # the pid in which obstore's runtime started


def runtime_inherited() -> bool:
    """True in a process forked after obstore's runtime started in an ancestor (it cannot run here)."""
    return _started_in is not None and _started_in != os.getpid()


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
        bucket, prefix, settings = s3_settings(url, options)
        self._obstore = obstore
        self.store = S3Store(bucket, prefix=prefix or None, **settings)
        self.max_in_flight = max(max_in_flight, 1)
        _started_in = os.getpid()

    def stat(self, name: str) -> tuple[int, str]:
        meta = self._call(lambda: self._obstore.head(self.store, name))
        return int(meta["size"]), str(meta.get("e_tag") or "")

    def get(self, gets: Sequence[Get]) -> list[bytes | BaseException]:
        return _run(self._get_all(gets, None))

    def get_into(self, gets: Sequence[Get], sinks: Sequence[Sink]) -> list[BaseException | None]:
        return [None if isinstance(got, bytes) else got for got in _run(self._get_all(gets, sinks))]

    def list(self) -> list[tuple[str, int, str]]:
        def listing() -> list[tuple[str, int, str]]:
            return [(str(meta["path"]), int(meta["size"]), str(meta.get("e_tag") or ""))
                    for batch in self._obstore.list(self.store) for meta in batch]
        return self._call(listing)

    def put_file(self, local: str, name: str) -> None:
        # multipart above 5 MiB, parts in flight; a file path is read by obstore, not through Python
        from pathlib import Path

        self._call(lambda: self._obstore.put(self.store, name, Path(local), max_concurrency=8))

    def put_bytes(self, name: str, data: bytes, if_match: str | None | Literal[False] = False) -> None:
        mode: Any = "overwrite" if if_match is False else "create" if if_match is None else {"e_tag": if_match}
        self._call(lambda: self._obstore.put(self.store, name, data, mode=mode))

    def delete(self, name: str) -> None:
        self._call(lambda: self._obstore.delete(self.store, name))

    def _call(self, fn: Any) -> Any:
        try:
            return fn()
        except Exception as exc:
            raise builtin_error(exc) from exc

    async def _get_all(self, gets: Sequence[Get], sinks: Sequence[Sink] | None) -> list[Any]:
        gate = asyncio.Semaphore(self.max_in_flight)

        async def one(k: int) -> Any:
            async with gate:  # the deadline starts when the request does, not while it waits its turn
                try:
                    return await self._get_one(*gets[k], None if sinks is None else sinks[k])
                except Exception as exc:  # noqa: BLE001 - returned, classified by the caller
                    return builtin_error(exc)
        return list(await asyncio.gather(*(one(k) for k in range(len(gets)))))

    async def _get_one(self, name: str, start: int, end: int, sink: Sink | None) -> bytes:
        """One ranged GET: into ``sink`` as 1 MiB buffers arrive (returns b""), or whole (its
        buffers joined: asking obstore for one buffer of the whole body cost ~10 CPU-s per GB for
        4 MiB bodies, bench/client_bench.py). A byte past the range is BodyTooLong, read no further."""
        want, began = end - start, time.monotonic()
        if want <= 0:  # an empty object's whole body: object_store refuses a zero-length range
            return b""
        async with _deadline(request_timeout(), "begin"):
            try:
                result = await self._obstore.get_async(self.store, name, options={"range": (start, end)})
            except Exception as exc:
                if _NOT_RANGED.search(str(exc)):  # a 200 to a ranged GET: object_store reads none of it
                    raise _too_long(want, f"a body that is not the range (obstore: {first_line(exc)})", None) from exc
                raise
        first, last = result.range
        if first != start or last - first > want:
            raise _too_long(want, f"bytes {first}-{last - 1}", None)
        expected = last - first
        left = began + request_deadline(expected) - time.monotonic()
        async with _deadline(request_deadline(expected), "end", max(left, 0.0)):
            got, pieces = 0, []
            async for buffer in result.stream(min_chunk_size=min(PIECE, want)):
                got += len(buffer)
                if got > want:
                    raise _too_long(want, f"{want + 1} or more bytes", None)
                if sink is None:
                    pieces.append(buffer)
                else:
                    sink.write(buffer)
        if sink is not None:
            return b""
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _run(coro: Any) -> Any:
    """Run ``coro`` to its end on a loop of its own in this thread (in a helper thread when this one
    already runs a loop, as a notebook's does). No loop is left running in the background: one kept
    on a thread into the interpreter's end, with obstore's futures on it, aborts the process now and
    then (about 1 exit in 12, measured)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1, thread_name_prefix="fastload-obstore") as helper:
        return helper.submit(asyncio.run, coro).result()
