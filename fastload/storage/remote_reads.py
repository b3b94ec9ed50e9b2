"""Byte ranges of shard objects read through the node cache: read there where present, else fetched
with the whole pieces around them (claimed, so that one fetcher per node fetches each) and kept."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastload.storage.cache_entry import BlocksMissing
from fastload.storage.remote import RemoteStore
from fastload.storage.remote_shard import Place, RemoteShard

FILL_PIECE = 4 * 2**20
"""With a cache entry, a record is fetched with the aligned 4 MiB piece of the shard around it: a far
store answers one large GET about as fast as one small one, and under a global shuffle the rest of
the piece is read later in the epoch, from the cache (the first epoch then runs at the store's
bandwidth, not at one round trip per record)."""

FILL_BUDGET = 32 * 2**20
"""Bytes of whole pieces one read fetches at most (memory in flight); past it, only the records'
own blocks."""


def read_places(store: RemoteStore, places: Sequence[Place], leave_cached: bool = False) -> list[bytes | None]:
    """The bytes at every place: from the cache where present, else fetched (whole pieces or
    cache blocks, so they can be kept) with every request of the batch in flight at once.
    ``leave_cached``: None for each place the cache holds once this returns (its reader reads it
    from there when it wants it: a batch's records are then not all in memory at once).

    A piece is claimed before it is fetched (``CacheEntry.claim``): one that another process
    or thread of the node is fetching is waited for, once this batch's own fetches are done
    (never while holding claims), and read from the cache. A streamed piece's records are read
    back from the cache (the page cache holds them): the piece is never whole in memory."""
    out: list[Any] = [None] * len(places)  # bytes, or _LEFT
    budget = FILL_BUDGET
    direct: list[int] = []
    fills: dict[tuple[int, int], tuple[RemoteShard, int, int]] = {}
    pieces: set[tuple[int, int]] = set()
    claims: list[Any] = []
    busy: list[tuple[Any, int]] = []  # (entry, piece) another fetcher holds
    for k, (shard, offset, size) in enumerate(places):
        entry = shard.entry  # once: another thread may drop it (see keep)
        if entry is None:
            direct.append(k)
            continue
        missing = entry.missing([(offset, size)])
        if not missing:
            out[k] = _LEFT if leave_cached else _cached(entry, offset, size)
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
    # Pieces whose entry can keep them are streamed into it as they arrive; the rest (and records
    # of shards not cached) come back in memory.
    streamed, writers, held = [], [], []
    for shard, start, length in fills.values():
        entry = shard.entry
        writer = entry.span_writer(start, length) if entry is not None else None
        if writer is None:
            held.append((shard, start, length))
        else:
            streamed.append((shard, start, length))
            writers.append(writer)
    wanted = [(places[k][0].name, places[k][1], places[k][2]) for k in direct]
    wanted += [(shard.name, start, length) for shard, start, length in held]
    fetched: dict[int, list[tuple[int, bytes]]] = {}
    try:
        if streamed:
            store.read_into([(shard.name, start, length) for shard, start, length in streamed], writers)
            for (shard, _, _), writer in zip(streamed, writers):
                if not writer.commit():
                    shard.entry = None  # the cache failed under it: read it through
        bodies = store.read_ranges(wanted) if wanted else []
        for k, body in zip(direct, bodies):
            out[k] = body
        for (shard, start, _), body in zip(held, bodies[len(direct):]):
            fetched.setdefault(id(shard), []).append((start, body))
            keep(shard, start, body)
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
            out[k] = _LEFT if leave_cached and not entry.missing([(offset, size)]) else _cached(entry, offset, size)
        if out[k] is None:
            again.append(k)
    if again:
        for k, body in zip(again, store.read_ranges([(places[k][0].name, places[k][1], places[k][2])
                                                    for k in again])):
            out[k] = body
    return [None if data is _LEFT else data for data in out]


_LEFT: Any = object()  # a place left in the cache (``leave_cached``): None in the result


def keep(shard: RemoteShard, start: int, body: bytes) -> None:
    """Write fetched bytes to the shard's cache entry; a shard whose entry cannot keep them is read
    through from then on."""
    entry = shard.entry  # once: another thread may drop it
    if entry is not None and not entry.write(start, body):
        shard.entry = None  # evicted and no room to come back, or the cache failed: read it through


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
