"""Shard files in an object store as the readers see them: checked against the manifest, read by
byte range, and kept in the node cache so a second epoch reads local files."""

from __future__ import annotations

import io
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fastload.errors import ManifestError
from fastload.format.manifest import Manifest
from fastload.errors import CacheWarning
from fastload.storage.cache_entry import BlocksMissing
from fastload.storage.remote import ProcessLock, RemoteObject, RemoteStore

FILL_PIECE = 4 * 2**20
"""With a cache entry, a record is fetched with the aligned 4 MiB piece of the shard around it: a far
store answers one large GET about as fast as one small one, and under a global shuffle the rest of
the piece is read later in the epoch, from the cache (the first epoch then runs at the store's
bandwidth, not at one round trip per record)."""

FILL_BUDGET = 32 * 2**20
"""Bytes of whole pieces one read fetches at most (memory in flight); past it, only the records'
own blocks."""


class RemoteShard:
    """One shard object: its name, size and version tag, and its cache entry (None: not cached)."""

    def __init__(self, shards: RemoteShards, name: str, info: RemoteObject, entry: Any) -> None:
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
        self._filler: _Filler | None = None

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
        """The bytes at every place: from the cache where present, else fetched (whole pieces or
        cache blocks, so they can be kept) with every request of the batch in flight at once.

        A piece is claimed before it is fetched (``CacheEntry.claim``): one that another process
        or thread of the node is fetching is waited for, once this batch's own fetches are done
        (never while holding claims), and read from the cache."""
        out: list[bytes | None] = [None] * len(places)
        budget = FILL_BUDGET
        direct: list[int] = []
        fills: dict[tuple[int, int], tuple[RemoteShard, int, int]] = {}
        pieces: set[tuple[int, int]] = set()
        claims: list[Any] = []
        busy: list[tuple[Any, int]] = []  # (entry, piece) another fetcher holds
        for k, (shard, offset, size) in enumerate(places):
            entry = shard.entry  # once: another thread may drop it (see _keep)
            if entry is None:
                direct.append(k)
                continue
            missing = entry.missing([(offset, size)])
            if not missing:
                out[k] = self._cached(entry, offset, size)
                continue
            if budget > 0:  # the whole aligned pieces around the record: later reads will want them
                missing = []
                for piece in range(offset // FILL_PIECE, (offset + size - 1) // FILL_PIECE + 1):
                    if (id(shard), piece) in pieces:
                        continue
                    pieces.add((id(shard), piece))
                    claim = entry.claim(piece)
                    if claim is None:
                        busy.append((entry, piece))
                        continue
                    claims.append(claim)
                    missing += entry.missing([(piece * FILL_PIECE, FILL_PIECE)])
            for start, length in missing:
                if (id(shard), start) not in fills:
                    fills[(id(shard), start)] = (shard, start, length)
                    budget -= length
        wanted = [(places[k][0].name, places[k][1], places[k][2]) for k in direct]
        wanted += [(shard.name, start, length) for shard, start, length in fills.values()]
        fetched: dict[int, list[tuple[int, bytes]]] = {}
        try:
            bodies = self.store.read_ranges(wanted) if wanted else []
            for k, body in zip(direct, bodies):
                out[k] = body
            for (shard, start, _), body in zip(fills.values(), bodies[len(direct):]):
                fetched.setdefault(id(shard), []).append((start, body))
                self._keep(shard, start, body)
        finally:
            for claim in claims:
                claim.release()
        for entry, piece in busy:
            entry.wait(piece)
        # Each record from the piece fetched around it, else from the cache (its blocks there and
        # fetched ones together); what neither holds (dropped meanwhile) in one more round.
        again = []
        for k, (shard, offset, size) in enumerate(places):
            if out[k] is None:
                out[k] = _slice(fetched.get(id(shard), ()), offset, size)
            entry = shard.entry
            if out[k] is None and entry is not None:
                out[k] = self._cached(entry, offset, size)
            if out[k] is None:
                again.append(k)
        if again:
            for k, body in zip(again, self.store.read_ranges([(places[k][0].name, places[k][1], places[k][2])
                                                             for k in again])):
                out[k] = body
        return out  # type: ignore[return-value]

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
            self._filler = _Filler(self, [int(s) for s in shards])
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

    def _keep(self, shard: RemoteShard, start: int, body: bytes) -> None:
        entry = shard.entry  # once: another thread may drop it
        if entry is not None and not entry.write(start, body):
            shard.entry = None  # evicted and no room to come back, or the cache failed: read it through

    @staticmethod
    def _cached(entry: Any, offset: int, size: int) -> bytes | None:
        try:
            return entry.read(offset, size)
        except BlocksMissing:  # not kept, or another process dropped them since
            return None


def _slice(spans: Sequence[tuple[int, bytes]], offset: int, size: int) -> bytes | None:
    """The bytes at ``offset`` from whichever fetched ``(start, body)`` holds them all, or None."""
    for start, body in spans:
        if start <= offset and offset + size <= start + len(body):
            return body[offset - start:offset - start + size]
    return None


FILL_GROUP = 4
"""Pieces one fill stream fetches at once (16 MiB in memory)."""

FILL_STREAMS = 3
"""Fill streams of a process, each taking every third shard a group at a time: a group ends with
its slowest piece, and the other streams keep pieces in flight across those waits (cold shuffled
reads with the fill ahead, bench/remote_bench.py: 1,995 / 2,246 / 2,562 records/s with 1 / 2 / 3
streams, 20 ms a request; 16 MiB more in flight per stream)."""


class _Filler(threading.Thread):
    """RemoteShards.fill's thread: shards in turn, each shard's missing pieces a group at a time
    (``FILL_STREAMS`` streams side by side), starting at a shard that spreads the node's
    processes over the dataset (see _first_shard).

    It holds its RemoteShards weakly and stops between groups once they are gone (the dataset was
    dropped) or ``stopped`` is set (the reader closed): a dataset thrown away must not go on
    fetching the rest of itself."""

    def __init__(self, shards: RemoteShards, numbers: list[int]) -> None:
        super().__init__(daemon=True, name="fastload-fill")
        self.shards = weakref.ref(shards)
        self.url, self.pid = shards.store.url, os.getpid()
        self.stopped = threading.Event()
        start = _first_shard(len(numbers))
        self.numbers = numbers[start:] + numbers[:start]

    def run(self) -> None:
        streams = [threading.Thread(target=self._fill, args=(self.numbers[k::FILL_STREAMS],), daemon=True,
                                    name=f"fastload-fill-{k}") for k in range(max(1, min(FILL_STREAMS, len(self.numbers))))]
        for stream in streams:
            stream.start()
        for stream in streams:
            stream.join()

    def _fill(self, numbers: list[int]) -> None:
        try:
            for number in numbers:
                shards = self._live()
                if shards is None:
                    return
                remote = shards.open(number)
                del shards
                try:
                    self._fill_shard(remote)
                finally:
                    remote.close()
        except Exception as exc:  # noqa: BLE001 - the reads fetch for themselves and raise there
            warnings.warn(f"{self.url}: filling the cache ahead stopped ({exc}); batches "
                          "fetch what they need as they are read", stacklevel=1)

    def _live(self) -> RemoteShards | None:
        return None if self.stopped.is_set() else self.shards()

    def _fill_shard(self, remote: RemoteShard) -> None:
        count = -(-remote.size // FILL_PIECE)
        for k in range(0, count, FILL_GROUP):
            entry = remote.entry  # None: no room for this shard (or no longer): the next may have one
            shards = self._live()
            if entry is None or shards is None:
                return
            claims, missing = [], []
            for piece in range(k, min(k + FILL_GROUP, count)):
                span = [(piece * FILL_PIECE, FILL_PIECE)]
                if not entry.missing(span):
                    continue  # cached already (a second epoch: no claim to take)
                claim = entry.claim(piece)
                if claim is None:
                    continue  # another process or thread is fetching it
                claims.append(claim)
                missing += entry.missing(span)  # again, claimed: the last holder may have written it
            try:
                if missing:
                    bodies = shards.store.read_ranges([(remote.name, a, n) for a, n in missing])
                    for (start, _), body in zip(missing, bodies):
                        shards._keep(remote, start, body)
            finally:
                for claim in claims:
                    claim.release()
            del shards


def _first_shard(count: int) -> int:
    """Where this process's filler starts: rank k of a node's W (torchrun's LOCAL_RANK and
    LOCAL_WORLD_SIZE) at shard k·count/W, so the ranks' fillers meet only as they finish (two
    started side by side would fetch the same pieces at once); else a place set by the pid."""
    if count < 1:
        return 0
    try:
        rank, ranks = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return os.getpid() % count
    return rank * count // ranks if 0 <= rank < ranks else os.getpid() % count


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
        size = max(0, min(len(buffer), self.shard.size - self.pos))
        if size:
            memoryview(buffer).cast("B")[:size] = self.shard.read_at(self.pos, size)
            self.pos += size
        return size
