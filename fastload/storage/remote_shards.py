"""Shard files in an object store as the readers see them: checked against the manifest, read by
byte range, and kept in the node cache so a second epoch reads local files."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fastload.errors import CacheWarning, ManifestError
from fastload.format.manifest import Manifest
from fastload.storage.remote import ProcessLock, RemoteObject, RemoteStore
from fastload.storage.remote_fill import Filler
from fastload.storage.remote_reads import read_places
from fastload.storage.remote_shard import Place, RemoteShard

T = TypeVar("T")


class RemoteShards:
    """The shard objects of the dataset at ``store``, read through an optional node cache.

    Each is checked once per process against the manifest: its size, and its ETag when the pack
    recorded one (an object changed since the pack is refused before a byte of it is used).
    """

    def __init__(self, store: RemoteStore, manifest: Manifest, cache: Any) -> None:
        self.store = store
        self.manifest = manifest
        self.cache = cache  # a NodeCache or None
        self._objects: dict[str, RemoteObject] | None = None
        self._lock = ProcessLock()
        self._filler: Filler | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_objects"], state["_filler"] = None, None
        return state

    def objects(self) -> dict[str, RemoteObject]:
        """Every object of the dataset folder with its size and ETag: one listing, not a HEAD per shard."""
        if self._objects is None:
            with self._lock:
                if self._objects is None:
                    self._objects = {name: RemoteObject(size, etag) for name, size, etag in self.store.list_objects()}
        return self._objects

    def check(self, shard: int) -> RemoteObject:
        """The shard object's size and ETag, refused (ManifestError) if missing or changed since the pack."""
        info = self.manifest.shards[shard]
        where = self.store.display(info.file)
        found = self.objects().get(info.file)
        if found is None:
            raise ManifestError(f"{where}: shard object missing; the dataset's upload is incomplete or "
                                "was deleted in part: re-pack it with `fastload pack`")
        if found.size != info.bytes:
            raise ManifestError(f"{where}: {found.size} bytes in the store, the manifest says {info.bytes} "
                                "(changed since the pack); re-pack or re-upload the dataset")
        if info.etag and found.etag and found.etag != info.etag:
            raise ManifestError(f"{where}: ETag {found.etag} in the store, the pack recorded {info.etag}: the "
                                "object was replaced since the pack; re-pack or re-upload the dataset")
        return found

    def open(self, shard: int) -> RemoteShard:
        found = self.check(shard)
        name = self.manifest.shards[shard].file
        entry = None
        if self.cache is not None:
            key = f"{self.store.display(name)}|{found.size}|{found.etag}"
            entry = self.cache.entry(key, found.size, dataset=self.store.url)
        return RemoteShard(self, name, found, entry)

    def open_parsed(self, shard: int, parse: Callable[[RemoteShard], T],
                    damaged: type[Exception] | tuple[type[Exception], ...]) -> tuple[RemoteShard, T]:
        """The shard opened, and ``parse(shard)``: its structure (an LMDB B-tree, an HDF5 header)
        read and checked, raising ``damaged`` when it is not sound. Bytes that came from the node
        cache may be what is damaged (a failing disk, a power cut): then the cached blocks the
        parse read are dropped and it runs once more, on bytes fetched from the store, so only a
        store copy that fails too raises (the caller's "damaged, re-pack")."""
        remote = self.open(shard)
        entry = remote.entry
        remote.spans = []
        try:
            try:
                return remote, parse(remote)
            except damaged as exc:
                if entry is None:
                    raise
                first = exc
            for offset, size in remote.spans:
                entry.invalidate(offset, size)
            parsed = parse(remote)
        except BaseException:
            remote.close()
            raise
        finally:
            remote.spans = None
        self.damaged_copy(remote, str(first))
        return remote, parsed

    def damaged_copy(self, shard: RemoteShard, what: str) -> None:
        """Say that bytes of ``shard`` failed their check (``what``) as the node cache held them,
        and that the store's copy passed it (the cache's disk may be failing)."""
        if shard.entry is not None:
            warnings.warn(f"{self.cache}: the cached copy of {self.store.display(shard.name)} was damaged "
                          f"({what}); dropped it and read it again from the store, which holds it whole",
                          CacheWarning, stacklevel=3)

    def read(self, places: Sequence[Place]) -> list[bytes]:
        """The bytes at every place, from the node cache where present, else fetched with every
        request of the batch in flight at once (see ``remote_reads.read_places``)."""
        return read_places(self.store, places)  # type: ignore[return-value]  # no None without leave_cached

    def fetch(self, places: Sequence[Place]) -> list[bytes | None]:
        """As ``read``, but None for each place the node cache holds once fetched: its reader
        reads it from there when it wants it (a batch's bytes are then not all in memory at once)."""
        return read_places(self.store, places, leave_cached=True)

    def fill(self, shards: Sequence[int]) -> None:
        """Fetch the missing pieces of ``shards`` into the cache in a background thread, a few at a
        time, while batches are read and decoded: a whole epoch under a global shuffle wants every
        piece of every shard, and pieces fetched ahead turn the epoch's reads into cache hits
        (fetching and decoding overlap instead of taking turns). Shards the cache has no room for
        are left alone. One filler per process; a failure stops it (the reads then fetch what they
        need themselves and report any error)."""
        if self.cache is None:
            return
        with self._lock:
            running = self._filler
            if running is not None and running.pid == os.getpid() and running.is_alive():
                return
            self._filler = Filler(self, [int(s) for s in shards])
            self._filler.start()

    def stop_fill(self) -> None:
        """Stop this process's filler after the pieces it is fetching (the reader is closing)."""
        filler = self._filler
        if filler is not None and filler.pid == os.getpid():
            filler.stopped.set()

    def refetch(self, place: Place) -> bytes:
        """The bytes at ``place`` from the store itself, after the cached copy failed its checksum
        (the cached blocks are dropped first)."""
        shard, offset, size = place
        entry = shard.entry
        if entry is not None:
            entry.invalidate(offset, size)
        return self.store.read_ranges([(shard.name, offset, size)])[0]
