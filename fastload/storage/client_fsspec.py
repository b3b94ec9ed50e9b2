"""The fsspec client: every scheme fsspec serves (s3fs, gcsfs, adlfs, http), ranged GETs bounded
and in flight on the filesystem's own event loop (fastload.storage.ranged_get)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from fastload.errors import MissingDependencyError
from fastload.optional import extra_hint
from fastload.storage.client import BoundedListing, Get, Sink, bounded_listing
from fastload.storage.location import SCHEME_PACKAGES, join
from fastload.storage.ranged_get import get_ranges


class FsspecClient:
    """The store folder ``url`` through a private fsspec filesystem, made in the process that uses it."""

    name = "fsspec"

    def __init__(self, url: str, scheme: str, options: dict[str, Any], max_in_flight: int) -> None:
        self.url, self.scheme, self.max_in_flight = url, scheme, max_in_flight
        package = SCHEME_PACKAGES.get(scheme, "fsspec")
        try:
            import fsspec

            # A private instance: fsspec shares instances made with equal options, and this one's
            # retry setting must not change a filesystem the user's own code holds.
            self.fs = fsspec.filesystem(scheme, skip_instance_cache=True, **options)
        except ImportError as exc:
            raise MissingDependencyError(
                f"{url}: reading {scheme}:// needs the {package} package ({exc}); install it: "
                f"pip install {package}" + (f" (or {extra_hint('remote')})" if package == "s3fs" else "")
            ) from exc
        if scheme in ("s3", "s3a"):
            self.fs.retries = 1  # s3fs's own retry loop (no jitter, unbounded by us) off: see RetryPolicy

    def path(self, name: str = "") -> str:
        """The fsspec path of ``name`` (its URL without the scheme for stores that strip it)."""
        full = join(self.url, name) if name else self.url
        return full if self.scheme in ("http", "https") else full.split("://", 1)[1]

    def stat(self, name: str) -> tuple[int, str]:
        path = self.path(name)
        info = self.fs.info(path, refresh=True) if self.scheme in ("s3", "s3a") else self.fs.info(path)
        if info.get("type") == "directory":
            raise IsADirectoryError(f"{join(self.url, name)}: is a prefix (folder), not an object")
        return int(info.get("size") or 0), _etag(info)

    def get(self, gets: Sequence[Get]) -> list[bytes | BaseException]:
        paths = [(self.path(name), start, end) for name, start, end in gets]
        if getattr(self.fs, "async_impl", False):
            return get_ranges(self.fs, paths, self.max_in_flight)

        def one(get: Get) -> bytes | BaseException:
            try:
                return self.fs.cat_file(get[0], start=get[1], end=get[2])  # type: ignore[no-any-return]
            except Exception as exc:  # noqa: BLE001 - returned, classified by the caller
                return exc
        with ThreadPoolExecutor(min(self.max_in_flight, len(paths)) or 1) as pool:
            return list(pool.map(one, paths))

    def get_into(self, gets: Sequence[Get], sinks: Sequence[Sink]) -> list[BaseException | None]:
        # aiohttp joins a body's chunks before fsspec returns it, so there is nothing to stream here
        out: list[BaseException | None] = []
        for body, sink in zip(self.get(gets), sinks):
            if isinstance(body, BaseException):
                out.append(body)
            else:
                sink.write(body)
                out.append(None)
        return out

    def list(self) -> list[tuple[str, int, str]]:
        base = self.path().rstrip("/")
        if self.scheme in ("s3", "s3a"):  # page by page, stopped at the bounds (s3fs's find reads them all first)
            from fsspec.asyn import sync

            return sync(self.fs.loop, _list_s3, self.fs, base)  # type: ignore[no-any-return]
        # fsspec's find gathers every page before it returns: the bound is applied to what it found
        found = self.fs.find(base, detail=True).items()
        return bounded_listing((path[len(base):].lstrip("/") if path.startswith(base) else path,
                                int(info.get("size") or 0), _etag(info))
                               for path, info in found if info.get("type") != "directory")

    def put_file(self, local: str, name: str) -> None:
        # A deadline of its own: a PUT waits for "100 Continue" with no timeout in aiohttp, so a
        # store that never answers would hang it. Generous: 2 minutes plus 1 MB/s.
        size = os.path.getsize(local)
        kwargs = {"timeout": 120 + size / 1e6} if getattr(self.fs, "async_impl", False) else {}
        self.fs.put_file(local, self.path(name), **kwargs)

    def put_bytes(self, name: str, data: bytes, if_match: str | None | Literal[False] = False) -> None:
        kwargs: dict[str, Any] = {"timeout": 120} if getattr(self.fs, "async_impl", False) else {}  # see put_file
        if if_match is not False:
            kwargs.update({"IfNoneMatch": "*"} if if_match is None else {"IfMatch": if_match})
        self.fs.pipe_file(self.path(name), data, **kwargs)

    def copy(self, source: str, target: str) -> None:
        self.fs.copy(self.path(source), self.path(target))

    def drop_idle_connections(self) -> None:
        pass  # aiohttp's pool keeps them: s3fs has no call that closes only the idle ones

    def delete(self, name: str) -> None:
        self.fs.rm_file(self.path(name))


async def _list_s3(fs: Any, base: str) -> list[tuple[str, int, str]]:
    """Every object under ``base`` (``bucket/prefix``), its ListObjectsV2 pages read one at a time
    and no further than the listing's bounds (BoundedListing); folder markers (``a/``) left out."""
    bucket, _, folder = base.partition("/")
    prefix = folder + "/" if folder else ""
    listing, token = BoundedListing(), None
    while True:
        page = await fs._call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix,
                                 **({"ContinuationToken": token} if token else {}))
        for entry in page.get("Contents", []):
            if not entry["Key"].endswith("/"):
                listing.add(entry["Key"][len(prefix):], int(entry.get("Size") or 0), str(entry.get("ETag") or ""))
        token = page.get("NextContinuationToken")
        if not page.get("IsTruncated") or not token:
            return listing.entries


def _etag(info: dict[str, Any]) -> str:
    """The version tag fsspec's filesystems report under their own names ("" when none)."""
    return str(info.get("ETag") or info.get("etag") or info.get("md5Hash") or "")
