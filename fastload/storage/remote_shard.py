"""One shard object of a remote dataset as its reader sees it: read by byte ranges, or as a file."""

from __future__ import annotations

import gc
import io
import os
import weakref
from collections.abc import Sequence
from typing import Any, Protocol

from fastload.storage.remote import RemoteObject


class ShardReads(Protocol):
    """What a shard asks of the ``RemoteShards`` that opened it (fastload.storage.remote_shards)."""

    def read(self, places: Sequence[Place]) -> list[bytes]: ...


class RemoteShard:
    """One shard object: its name, size and version tag, and its cache entry (None: not cached)."""

    def __init__(self, shards: ShardReads, name: str, info: RemoteObject, entry: Any) -> None:
        # weakly: the RemoteShards owns its shards, and a filler holding one must not keep it alive
        self.shards = weakref.proxy(shards)
        self.name, self.size, self.etag, self.entry = name, info.size, info.etag, entry
        self.spans: list[tuple[int, int]] | None = None  # what was read, while RemoteShards.open_parsed runs

    def read_at(self, offset: int, size: int) -> bytes:
        return self.read_many([(offset, size)])[0]

    def read_many(self, ranges: Sequence[tuple[int, int]]) -> list[bytes]:
        """The bytes at every ``(offset, size)``, in one round of requests."""
        if self.spans is not None:
            self.spans += ranges
        return self.shards.read([(self, offset, size) for offset, size in ranges])

    def stream(self) -> io.RawIOBase:
        """A seekable read-only file object over the shard (for h5py, which reads its header so)."""
        return _RangeStream(self)

    def close(self) -> None:
        if self.entry is not None:
            self.entry.close()


Place = tuple[RemoteShard, int, int]  # (shard, offset, size)


class _RangeStream(io.RawIOBase):
    def __init__(self, shard: RemoteShard) -> None:
        self.shard, self.pos = shard, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.shard.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer: Any) -> int:
        # h5py calls this holding its lock; a garbage collection in another thread (one reading for
        # us, or any other) that freed an h5py object would wait for that lock while we wait for it:
        # none runs until the read is done
        size = max(0, min(len(buffer), self.shard.size - self.pos))
        if size:
            collecting = gc.isenabled()
            gc.disable()
            try:
                memoryview(buffer).cast("B")[:size] = self.shard.read_at(self.pos, size)
            finally:
                if collecting:
                    gc.enable()
            self.pos += size
        return size
