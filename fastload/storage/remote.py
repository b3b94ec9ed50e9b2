"""An object-store folder through fsspec: stat, bounded whole reads, many ranged reads in flight, uploads."""

from __future__ import annotations

import copy
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastload.errors import MissingDependencyError
from fastload.optional import extra_hint
from fastload.storage.location import SCHEME_PACKAGES, join, scheme_of
from fastload.storage.ranged_get import Get, get_ranges
from fastload.storage.retry import RetryPolicy, ShortRead

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

    The fsspec filesystem is made in the process that uses it (re-made after a fork, never
    pickled), so a store can go to DataLoader workers like a shard reader.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None, *,
                 retry: RetryPolicy = DEFAULT_RETRY, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.url = url.rstrip("/")
        self.scheme = scheme_of(url)
        given = dict(storage_options or {})
        self.options = _merge(_s3_defaults(), given) if self.scheme in ("s3", "s3a") else given
        self.retry = retry
        self.max_in_flight = max_in_flight
        self._fs: Any = None
        self._pid = -1
        self._lock = ProcessLock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fs"], state["_pid"] = None, -1
        return state

    @property
    def fs(self) -> Any:
        """This process's fsspec filesystem for the store."""
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    self._fs = self._make_filesystem()
                    self._pid = os.getpid()
        return self._fs

    def _make_filesystem(self) -> Any:
        package = SCHEME_PACKAGES.get(self.scheme, "fsspec")
        try:
            import fsspec

            # A private instance: fsspec shares instances made with equal options, and this one's
            # retry setting must not change a filesystem the user's own code holds.
            fs = fsspec.filesystem(self.scheme, skip_instance_cache=True, **self.options)
        except ImportError as exc:
            raise MissingDependencyError(
                f"{self.url}: reading {self.scheme}:// needs the {package} package ({exc}); install it: "
                f"pip install {package}" + (f" (or {extra_hint('remote')})" if package == "s3fs" else "")
            ) from exc
        if self.scheme in ("s3", "s3a"):
            fs.retries = 1  # s3fs's own retry loop (no jitter, unbounded by us) off: see RetryPolicy
        return fs

    def path(self, name: str = "") -> str:
        """The fsspec path of ``name`` (its URL without the scheme for stores that strip it)."""
        full = join(self.url, name) if name else self.url
        return full if self.scheme in ("http", "https") else full.split("://", 1)[1]

    def display(self, name: str = "") -> str:
        return join(self.url, name) if name else self.url

    def stat(self, name: str) -> RemoteObject:
        """Size and version tag of ``name``; a missing object raises RemoteNotFound."""
        info = self.retry.call(lambda: self.fs.info(self.path(name), refresh=True)
                               if self.scheme in ("s3", "s3a") else self.fs.info(self.path(name)),
                               lambda: self.display(name))
        if info.get("type") == "directory":
            raise IsADirectoryError(f"{self.display(name)}: is a prefix (folder), not an object")
        return RemoteObject(size=int(info.get("size") or 0), etag=_etag(info))

    def read_file(self, name: str, limit: int) -> bytes:
        """All of ``name``'s bytes, refused (OSError EFBIG) when it holds more than ``limit``."""
        from fastload.format.files import too_large

        # One GET of at most limit + 1 bytes: bounded without a HEAD first (a body cut short is an
        # error of the client, retried; the manifest parse and the index digests check the rest).
        def once() -> bytes:
            body = self._get([(self.path(name), 0, limit + 1)])[0]
            if isinstance(body, BaseException):
                raise body
            return body
        data = self.retry.call(once, lambda: self.display(name))
        if len(data) > limit:
            raise too_large(len(data), limit)
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

    def _fetch_spans(self, spans: list[tuple[str, int, int]]) -> list[bytes]:
        results: list[bytes | None] = [None] * len(spans)
        self.retry.call_each(lambda pending: self._fetch_once(spans, pending, results), len(spans),
                             lambda k: f"{self.display(spans[k][0])} bytes {spans[k][1]}-{spans[k][2] - 1}")
        return results  # type: ignore[return-value]

    def _fetch_once(self, spans: list[tuple[str, int, int]], which: list[int],
                    results: list[bytes | None]) -> dict[int, BaseException]:
        got = self._get([(self.path(spans[k][0]), spans[k][1], spans[k][2]) for k in which])
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

    def _get(self, gets: list[Get]) -> list[bytes | BaseException]:
        """Each ranged GET's body, or the exception that stopped it: on an async filesystem read to
        the bytes asked for and no further, each within its deadline (see ranged_get)."""
        fs = self.fs
        if getattr(fs, "async_impl", False):
            return get_ranges(fs, gets, self.max_in_flight)

        def one(get: Get) -> bytes | BaseException:
            try:
                return fs.cat_file(get[0], start=get[1], end=get[2])  # type: ignore[no-any-return]
            except Exception as exc:  # noqa: BLE001 - returned, classified by the caller
                return exc
        with ThreadPoolExecutor(min(self.max_in_flight, len(gets)) or 1) as pool:
            return list(pool.map(one, gets))

    def list_objects(self) -> list[tuple[str, int, str]]:
        """Every object under the folder: (name relative to it, size, ETag), sorted by name."""
        base = self.path().rstrip("/")
        found = self.retry.call(lambda: self.fs.find(base, detail=True), lambda: self.display())
        out = []
        for path, info in found.items():
            if info.get("type") == "directory":
                continue
            rel = path[len(base):].lstrip("/") if path.startswith(base) else path
            out.append((rel, int(info.get("size") or 0), _etag(info)))
        return sorted(out)

    def put_file(self, local: str | os.PathLike[str], name: str) -> RemoteObject:
        """Upload a finished local file (multipart for large files, parts in flight) and return what
        the store then holds; retried as a whole on transient failures."""
        size = os.path.getsize(local)

        def upload() -> None:
            # A deadline of its own: a PUT waits for "100 Continue" with no timeout in aiohttp, so a
            # store that never answers would hang it. Generous: 2 minutes plus 1 MB/s.
            kwargs = {"timeout": 120 + size / 1e6} if getattr(self.fs, "async_impl", False) else {}
            self.fs.put_file(os.fspath(local), self.path(name), **kwargs)
        self.retry.call(upload, lambda: f"uploading {local} to {self.display(name)}")
        return self.stat(name)

    def put_bytes(self, name: str, data: bytes) -> RemoteObject:
        """Write one small object whole (a single PUT: readers see the old one or the new one)."""
        kwargs = {"timeout": 120} if getattr(self.fs, "async_impl", False) else {}  # see put_file
        self.retry.call(lambda: self.fs.pipe_file(self.path(name), data, **kwargs),
                        lambda: f"writing {self.display(name)}")
        return self.stat(name)

    def remove(self, names: Sequence[str]) -> None:
        for name in names:
            path, where = self.path(name), self.display(name)
            try:
                self.retry.call(lambda: self.fs.rm_file(path), lambda: where)  # noqa: B023 - called here
            except FileNotFoundError:
                pass


def _etag(info: dict[str, Any]) -> str:
    """The version tag fsspec's filesystems report under their own names ("" when none)."""
    return str(info.get("ETag") or info.get("etag") or info.get("md5Hash") or "")


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
