"""The object-store client under a RemoteStore: what it must do (see client_choice for which one).

Two clients implement it: ``obstore`` (Rust ``object_store``: no aiohttp/botocore, bodies streamed
in large buffers; S3 and S3-compatible stores; the default for s3:// where it can serve) and
``fsspec`` (s3fs, gcsfs, adlfs, http: every scheme). ``FASTLOAD_STORE_CLIENT`` (``fsspec``,
``obstore``) or ``RemoteStore(client=...)`` chooses; obstore serves s3:// only, other schemes always
go through fsspec.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Literal, Protocol

ClientName = Literal["obstore", "fsspec"]
CLIENT_NAMES = ("obstore", "fsspec")

Get = tuple[str, int, int]  # (name under the store's root, start, end): bytes start..end-1

MAX_LISTED = 10_000_000
"""Most objects a listing holds: a store (or something posing as one) whose listing never ends
would otherwise grow memory until the process dies; ten million names take some 2.5 GB."""
MAX_LISTED_BYTES = 2**30
"""Most bytes of object names and ETags a listing holds: a key may be 1 KB, and ten million of
them would take some 12 GB (the endless listing that ended in an allocation abort, rc 134)."""


class ListingTooLong(ValueError):
    """A listing went on past MAX_LISTED objects or MAX_LISTED_BYTES; the client stopped reading it there."""

    def __init__(self, past: str) -> None:
        super().__init__(f"the listing goes on past {past} (stopped there); name a narrower prefix, or the "
                         "objects themselves (a brace list)")


class BoundedListing:
    """A listing's ``(name, size, etag)`` entries as they are read, refused (ListingTooLong) as soon
    as they go past MAX_LISTED objects or MAX_LISTED_BYTES of names and ETags."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, int, str]] = []
        self.bytes = 0

    def add(self, name: str, size: int, etag: str) -> None:
        self.bytes += len(name) + len(etag)
        if len(self.entries) >= MAX_LISTED:
            raise ListingTooLong(f"{MAX_LISTED} objects")
        if self.bytes > MAX_LISTED_BYTES:
            raise ListingTooLong(f"{MAX_LISTED_BYTES} bytes of names ({len(self.entries)} objects)")
        self.entries.append((name, size, etag))


def bounded_listing(entries: Iterator[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    """``entries`` as a list, stopped with ListingTooLong past the bounds (read lazily: a client's
    pages are read no further than that)."""
    listing = BoundedListing()
    for entry in entries:
        listing.add(*entry)
    return listing.entries


class Sink(Protocol):
    """Where one GET's body goes as it arrives (a span of a cache file): written in order, begun
    again from its start when the GET is retried."""

    def write(self, buffer: Any) -> None: ...

    def restart(self) -> None: ...


class StoreClient(Protocol):
    """One process's connection to a store folder; names are relative to the folder. Read calls
    return each GET's outcome (an exception in place of a failed one), never retry: the RemoteStore
    retries, with its own policy, only the failures that are transient."""

    name: str

    def stat(self, name: str) -> tuple[int, str]:
        """``(size, etag)`` of ``name``, asked of the store now (never from a listing cache)."""
        ...

    def get(self, gets: Sequence[Get]) -> list[bytes | BaseException]:
        """Each GET's body, read up to its end and no further, within its deadline, all in flight."""
        ...

    def get_into(self, gets: Sequence[Get], sinks: Sequence[Sink]) -> list[BaseException | None]:
        """Each GET's body written into its sink as it arrives (no whole body held in memory)."""
        ...

    def list(self) -> list[tuple[str, int, str]]:
        """``(name, size, etag)`` of every object under the folder (any order)."""
        ...

    def put_file(self, local: str, name: str) -> None:
        """Upload a finished local file (multipart for large ones)."""
        ...

    def put_bytes(self, name: str, data: bytes, if_match: str | None | Literal[False] = False) -> None:
        """Write one object whole; ``if_match``: None to write only where no object is, an ETag to
        write only over that version (FileExistsError when the condition fails), False: always."""
        ...

    def copy(self, source: str, target: str) -> None:
        """The store copies ``source`` to ``target`` itself (server-side; no byte through here)."""
        ...

    def delete(self, name: str) -> None:
        """Remove ``name`` (FileNotFoundError when there is none, on stores that say so)."""
        ...

    def drop_idle_connections(self) -> None:
        """Close the connections no request is using, and free their buffers: a burst of reads
        is over (later requests open new ones)."""
        ...
