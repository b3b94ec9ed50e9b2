"""GETs of byte ranges read up to the bytes asked for and no further, each within a total deadline.

A store (or a proxy in front of it) that answers a ranged GET with 200 and the whole object, or
with a body that never ends, must not fill memory; one that stalls or drips a byte a minute must
not hold a read for the socket timeout times the retries. So an S3 body is read in pieces, never
past the range's end, and each request has a deadline of its own (``config.request_deadline``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastload.config import request_deadline, request_timeout

PIECE = 1 << 20
"""A body is read in pieces of at most this many bytes."""

Get = tuple[str, int, int]  # (fsspec path, start, end): bytes start..end-1, or fewer at the object's end


class BodyTooLong(Exception):
    """A response holding more than the range asked for (the store ignored the Range header):
    not retried, a retry gets the same answer."""


class DeadlineExceeded(TimeoutError):
    """A response not complete within its deadline (a stall, a slow drip, a Content-Length larger
    than the body sent): retried like any timeout."""


def get_ranges(fs: Any, gets: Sequence[Get], max_in_flight: int) -> list[bytes | BaseException]:
    """Each GET's body (or the exception that stopped it), with up to ``max_in_flight`` in flight,
    on the event loop of ``fs`` (an async fsspec filesystem)."""
    from fsspec.asyn import sync

    return sync(fs.loop, _get_all, fs, list(gets), max_in_flight)  # type: ignore[no-any-return]


async def _get_all(fs: Any, gets: list[Get], max_in_flight: int) -> list[bytes | BaseException]:
    gate = asyncio.Semaphore(max(max_in_flight, 1))
    s3 = any(cls.__name__ == "S3FileSystem" for cls in type(fs).__mro__)  # s3fs not imported here
    fetch = _get_s3 if s3 else _get_other

    async def one(get: Get) -> bytes | BaseException:
        async with gate:  # the deadline starts when the request does, not while it waits its turn
            try:
                return await fetch(fs, *get)
            except Exception as exc:  # noqa: BLE001 - returned, classified by the caller
                return exc

    return list(await asyncio.gather(*(one(get) for get in gets)))


async def _get_s3(fs: Any, path: str, start: int, end: int) -> bytes:
    """One ranged GetObject, its body read in pieces up to ``end - start`` bytes."""
    bucket, key, version = fs.split_path(path)
    began, want = time.monotonic(), end - start
    async with _deadline(request_timeout(), "begin"):
        response = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}",
                                     **({"VersionId": version} if version else {}))
    body = response["Body"]
    try:
        announced = response.get("ContentLength")
        if announced is not None and announced > want:
            raise too_long(want, f"{announced} bytes (its Content-Length)", response)
        # the body's share of the deadline follows the bytes that will come, not the bytes asked for
        expected = want if announced is None else announced
        left = began + request_deadline(expected) - time.monotonic()
        async with _deadline(request_deadline(expected), "end", max(left, 0.0)):
            return await _read_body(body, want, response)
    finally:
        body.close()


async def _get_other(fs: Any, path: str, start: int, end: int) -> bytes:
    """A ranged read through the filesystem's own ``_cat_file`` (gcsfs, adlfs, http): bounded in time;
    its body is bounded only as far as that client honours the range."""
    async with _deadline(request_deadline(end - start), "end"):
        data: bytes = await fs._cat_file(path, start=start, end=end)
    if len(data) > end - start:
        raise too_long(end - start, f"{len(data)} bytes", None)
    return data


async def _read_body(body: Any, want: int, response: dict[str, Any]) -> bytes:
    """At most ``want`` bytes of ``body``; a byte more is BodyTooLong (nothing past it is read)."""
    pieces: list[bytes] = []
    got = 0
    while piece := await body.read(min(PIECE, want - got + 1)):
        got += len(piece)
        if got > want:
            raise too_long(want, f"{want + 1} or more bytes", response)
        pieces.append(piece)
    return b"".join(pieces)


def too_long(want: int, found: str, response: dict[str, Any] | None) -> BodyTooLong:
    """The error of a body holding more than the ``want`` bytes asked for (``found``: what came)."""
    status = (response or {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
    answered = f" (HTTP {status})" if status else ""
    return BodyTooLong(f"the store answered{answered} with {found} where {want} were asked for (it "
                       "ignored the Range header), so the read stopped there; check that the endpoint, "
                       "and any proxy in front of it, serves ranged GETs")


@asynccontextmanager
async def _deadline(limit: float, waiting: str, left: float | None = None) -> AsyncIterator[None]:
    """``asyncio.timeout`` whose expiry raises DeadlineExceeded saying whether the response did not
    ``waiting`` ("begin", "end") in time (a socket timeout inside stays what it is); ``left``: the
    seconds that remain of ``limit``."""
    timeout = asyncio.timeout(limit if left is None else left)
    try:
        async with timeout:
            yield
    except TimeoutError as exc:
        if not timeout.expired():
            raise
        raise deadline_exceeded(limit, waiting) from exc


def deadline_exceeded(limit: float, waiting: str) -> DeadlineExceeded:
    """The error of a response that did not ``waiting`` ("begin", "end") within ``limit`` seconds."""
    return DeadlineExceeded(
        f"the response did not {waiting} within its deadline of {limit:.1f} s (a stalled or slow-dripping "
        "store, or a Content-Length larger than the body sent); FASTLOAD_REQUEST_TIMEOUT sets the "
        f"deadline's base, now {request_timeout():g} s")
