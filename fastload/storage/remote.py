"""An object-store folder: stat, bounded whole reads, many ranged reads in flight (into memory or
streamed into files), listings, uploads, conditional publishes; retried, through a client of its choice."""

from __future__ import annotations

import copy
import errno
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastload.storage.client import ClientName, Get, Sink, StoreClient
from fastload.storage.client_choice import make_client
from fastload.storage.location import check_remote_url, join, scheme_of
from fastload.storage.retry import RetryPolicy, ShortRead, condition_failed, range_not_satisfiable

MAX_IN_FLIGHT = 64
"""Requests a store keeps in flight at once: 64 × a 20 ms round trip is ~3,200 requests/s."""

COALESCE_GAP = 256 * 1024
"""Two ranges of one object closer than this are fetched with one GET (the gap read and dropped):
a round trip to a far store costs as much as ~0.5 MB of bandwidth."""

MAX_SPAN = 16 * 2**20
"""A coalesced GET never spans more than this, so one slow response holds back little."""


DEFAULT_RETRY = RetryPolicy()


@dataclass(frozen=True)
class RemoteObject:
    """What the store says about one object."""

    size: int
    etag: str  # the store's version tag ("" when it gives none): a change means other bytes


Range = tuple[str, int, int]  # (name under the store's root, start, length)


class ProcessLock:
    """A thread lock that is made anew in each process: one inherited through a fork may have been
    held by a parent thread at that moment, and would then never be released in the child. Pickles
    as a fresh lock."""

    def __init__(self) -> None:
        self._lock, self._pid = threading.Lock(), os.getpid()

    def __enter__(self) -> None:
        if self._pid != os.getpid():
            self._lock, self._pid = threading.Lock(), os.getpid()
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]


def _s3_defaults() -> dict[str, Any]:
    # fastload retries itself (bounded, with jitter, naming the object): the client's own retries off,
    # and a connection pool as large as the requests in flight (botocore's default is 10).
    # (botocore's "max_attempts" counts retries; "total_max_attempts": 1 is one try and no retry.)
    return {"config_kwargs": {"retries": {"total_max_attempts": 1}, "connect_timeout": 10, "read_timeout": 60,
                              "max_pool_connections": MAX_IN_FLIGHT}}


def _merge(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(defaults)
    for key, value in given.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


class RemoteStore:
    """The folder ``url`` in an object store; names are relative to it (``manifest.json``).

    Its client (see fastload.storage.client: obstore or fsspec, ``client`` or FASTLOAD_STORE_CLIENT)
    is made in the process that uses it (re-made after a fork, never pickled), so a store can go to
    DataLoader workers like a shard reader.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, *,
                 retry: RetryPolicy = DEFAULT_RETRY, max_in_flight: int = MAX_IN_FLIGHT,
                 client: ClientName | None = None) -> None:
        self.url = check_remote_url(url).rstrip("/")
        self.scheme = scheme_of(url)
        given = dict(storage_options or {})
        self.options = _merge(_s3_defaults(), given) if self.scheme in ("s3", "s3a") else given
        self.retry = retry
        self.max_in_flight = max_in_flight
        self.choice = client
        self._client: StoreClient | None = None
        self._pid = -1
        self._lock = ProcessLock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"], state["_pid"] = None, -1
        return state

    @property
    def client(self) -> StoreClient:
        """This process's client for the store."""
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._client = make_client(self.url, self.scheme, self.options, self.max_in_flight,
                                               self.choice)
                    self._pid = os.getpid()
        return self._client  # type: ignore[return-value]

    def display(self, name: str = "") -> str:
        return join(self.url, name) if name else self.url

    def stat(self, name: str) -> RemoteObject:
        """Size and version tag of ``name``; a missing object raises RemoteNotFound."""
        size, etag = self.retry.call(lambda: self.client.stat(name), lambda: self.display(name))
        return RemoteObject(size=size, etag=etag)

    def read_file(self, name: str, limit: int) -> bytes:
        """All of ``name``'s bytes, refused (OSError EFBIG, its ``filename`` the object's URL) when it
        holds more than ``limit``."""
        # One GET of at most limit + 1 bytes: bounded without a HEAD first (a body cut short is an
        # error of the client, retried; the manifest parse and the index digests check the rest).
        def once() -> bytes:
            body = self.client.get([(name, 0, limit + 1)])[0]
            if isinstance(body, BaseException):
                # S3 answers a ranged GET of an empty object with 416: an empty object, not an error
                if range_not_satisfiable(body) and self.client.stat(name)[0] == 0:
                    return b""
                raise body
            return body
        data = self.retry.call(once, lambda: self.display(name))
        if len(data) > limit:
            raise OSError(errno.EFBIG, f"larger than the limit of {limit} bytes", self.display(name))
        return data

    def read_ranges(self, ranges: Sequence[Range]) -> list[bytes]:
        """The bytes of every ``(name, start, length)``, fetched with neighbours coalesced and up to
        ``max_in_flight`` GETs at once; transient failures retried, then RemoteReadError naming
        the object and byte range. A body shorter than asked for counts as a failure."""
        spans = coalesce(ranges)
        bodies = self._fetch_spans([(name, start, end) for name, start, end, _ in spans])
        out: list[bytes] = [b""] * len(ranges)
        for (_, start, end, members), body in zip(spans, bodies):
            view = memoryview(body)
            for k in members:
                _, offset, length = ranges[k]
                whole = offset == start and length == end - start
                out[k] = body if whole else bytes(view[offset - start:offset - start + length])
        return out

    def read_into(self, ranges: Sequence[Range], sinks: Sequence[Sink]) -> None:
        """Every ``(name, start, length)`` written into its sink as its body arrives (no second copy
        of the bytes in memory), all in flight, retried like ``read_ranges`` (a retried sink is
        restarted first); a sink is complete only when this returns."""
        spans: list[Get] = [(name, start, start + length) for name, start, length in ranges]
        counters = [_Counted(sink) for sink in sinks]

        def once(which: list[int]) -> dict[int, BaseException]:
            for k in which:
                counters[k].restart()
            got = self.client.get_into([spans[k] for k in which], [counters[k] for k in which])
            failures: dict[int, BaseException] = {}
            for k, exc in zip(which, got):
                want = spans[k][2] - spans[k][1]
                if exc is not None:
                    failures[k] = exc
                elif counters[k].written != want:
                    failures[k] = ShortRead(f"the body held {counters[k].written} of {want} bytes")
            return failures
        self.retry.call_each(once, len(spans),
                             lambda k: f"{self.display(spans[k][0])} bytes {spans[k][1]}-{spans[k][2] - 1}")

    def _fetch_spans(self, spans: list[Get]) -> list[bytes]:
        results: list[bytes | None] = [None] * len(spans)
        self.retry.call_each(lambda pending: self._fetch_once(spans, pending, results), len(spans),
                             lambda k: f"{self.display(spans[k][0])} bytes {spans[k][1]}-{spans[k][2] - 1}")
        return results  # type: ignore[return-value]

    def _fetch_once(self, spans: list[Get], which: list[int], results: list[bytes | None]) -> dict[int, BaseException]:
        for k in [k for k in which if spans[k][2] <= spans[k][1]]:
            results[k] = b""  # nothing to ask for (a GET of "bytes=0--1" would fetch the whole object)
        which = [k for k in which if results[k] is None]
        got = self.client.get([spans[k] for k in which])
        failures: dict[int, BaseException] = {}
        for k, body in zip(which, got):
            want = spans[k][2] - spans[k][1]
            if isinstance(body, BaseException):
                failures[k] = body
            elif len(body) != want:
                failures[k] = ShortRead(f"the body held {len(body)} of {want} bytes")
            else:
                results[k] = body
        return failures

    def list_objects(self) -> list[tuple[str, int, str]]:
        """Every object under the folder: (name relative to it, size, ETag), sorted by name."""
        return sorted(self.retry.call(lambda: self.client.list(), lambda: self.display()))

    def put_file(self, local: str | os.PathLike[str], name: str) -> RemoteObject:
        """Upload a finished local file (multipart for large files, parts in flight) and return what
        the store then holds; retried as a whole on transient failures."""
        self.retry.call(lambda: self.client.put_file(os.fspath(local), name),
                        lambda: f"uploading {local} to {self.display(name)}")
        return self.stat(name)

    def put_bytes(self, name: str, data: bytes) -> RemoteObject:
        """Write one small object whole (a single PUT: readers see the old one or the new one)."""
        self.retry.call(lambda: self.client.put_bytes(name, data), lambda: f"writing {self.display(name)}")
        return self.stat(name)

    def put_if(self, name: str, data: bytes, if_match: str | None) -> str | None:
        """PUT ``data`` at ``name`` only if no object is there (``if_match`` None) or the one there has
        ETag ``if_match`` (an atomic publish); the new ETag, or None when the condition failed."""
        try:
            self.retry.call(lambda: self.client.put_bytes(name, data, if_match),
                            lambda: f"writing {self.display(name)}")
        except Exception as exc:
            if condition_failed(exc):
                return None
            raise
        return self.stat(name).etag

    def copy(self, source: str, target: str) -> RemoteObject:
        """The store copies ``source`` to ``target`` itself (no byte through here), retried; what
        ``target`` then holds."""
        self.retry.call(lambda: self.client.copy(source, target),
                        lambda: f"copying {self.display(source)} to {self.display(target)}")
        return self.stat(target)

    def drop_idle_connections(self) -> None:
        """Close this process's idle connections to the store (the cache now holds what is read)."""
        if self._pid == os.getpid() and self._client is not None:
            self._client.drop_idle_connections()

    def remove(self, names: Sequence[str]) -> None:
        for name in names:
            try:
                self.retry.call(lambda: self.client.delete(name), lambda: self.display(name))  # noqa: B023
            except FileNotFoundError:
                pass


class _Counted:
    """A sink that counts what went into it (a body shorter than its range is retried)."""

    def __init__(self, sink: Sink) -> None:
        self.sink, self.written = sink, 0

    def write(self, buffer: Any) -> None:
        self.sink.write(buffer)
        self.written += len(buffer)

    def restart(self) -> None:
        self.sink.restart()
        self.written = 0


def coalesce(ranges: Sequence[Range], gap: int = COALESCE_GAP,
             max_span: int = MAX_SPAN) -> list[tuple[str, int, int, list[int]]]:
    """Merge ranges of one object that lie within ``gap`` bytes of each other into spans
    ``(name, start, end, [indices of the ranges inside])``, none longer than ``max_span``
    (unless one range alone is)."""
    order = sorted(range(len(ranges)), key=lambda k: (ranges[k][0], ranges[k][1]))
    spans: list[tuple[str, int, int, list[int]]] = []
    for k in order:
        name, start, length = ranges[k]
        end = start + length
        if spans:
            last_name, last_start, last_end, members = spans[-1]
            if (name == last_name and start <= last_end + gap
                    and max(end, last_end) - last_start <= max_span):
                spans[-1] = (name, last_start, max(end, last_end), members + [k])
                continue
        spans.append((name, start, end, [k]))
    return spans
