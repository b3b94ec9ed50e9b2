"""Filling the node cache ahead: a background thread fetches the missing pieces of every shard
while batches are read and decoded."""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from typing import Protocol

from fastload.storage.remote import RemoteStore
from fastload.storage.remote_reads import FILL_PIECE
from fastload.storage.remote_shard import RemoteShard

FILL_GROUP = 8
"""Pieces one fill stream fetches at once, each written into its cache file as it arrives (a GET in
flight holds a 256 KiB buffer and its connection's, not its piece). Training from the store (the
photos through 20 ms), 8 against 4 a group, in probes: the fill done in 1.3-1.5 s, not 1.6-1.9 s;
epoch 1 5.8-6.0 s, not 6.2-6.5 s; peak memory no higher (bench/remote_bench.py's paired rows:
epoch 1 1.06x and 0.99x)."""

FILL_STREAMS = 3
"""Fill streams of a process, each taking every third shard a group at a time: a group ends with
its slowest piece, and the other streams keep pieces in flight across those waits (cold shuffled
reads with the fill ahead, bench/remote_bench.py: 1,995 / 2,246 / 2,562 records/s with 1 / 2 / 3
streams, 20 ms a request, 4 pieces a group)."""


class FillSource(Protocol):
    """What the filler asks of the ``RemoteShards`` that started it (fastload.storage.remote_shards)."""

    store: RemoteStore

    def open(self, shard: int) -> RemoteShard: ...


class Filler(threading.Thread):
    """RemoteShards.fill's thread: shards in turn, each shard's missing pieces a group at a time
    (``FILL_STREAMS`` streams side by side), starting at a shard that spreads the node's
    processes over the dataset (see _first_shard).

    It holds its RemoteShards weakly and stops between groups once they are gone (the dataset was
    dropped) or ``stopped`` is set (the reader closed): a dataset thrown away must not go on
    fetching the rest of itself."""

    def __init__(self, shards: FillSource, numbers: list[int]) -> None:
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
        shards = self.shards()
        if shards is not None:  # the fill is over: its connections, and the cold start's, sit idle
            shards.store.drop_idle_connections()  # (reads the cache had no room for connect again)

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

    def _live(self) -> FillSource | None:
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
                writers = [entry.span_writer(a, n) for a, n in missing]
                if None in writers:
                    remote.entry = None  # the entry can keep nothing (no room): this shard is read through
                elif missing:  # each piece streamed into the cache as it arrives
                    shards.store.read_into([(remote.name, a, n) for a, n in missing], writers)  # type: ignore[arg-type]
                    if not all(writer.commit() for writer in writers):  # type: ignore[union-attr]
                        remote.entry = None  # the cache failed under it: read it through
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
