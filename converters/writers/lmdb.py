"""LMDB shard writer: one environment file per shard, keys are positions, values the raw bytes."""

from __future__ import annotations

import os
from pathlib import Path

import lmdb

from fastload.format import lmdb_key

_PAGE = 4096
# Dirty pages per transaction, bounded by bytes (they are memory) and by records (each is a
# dirty-list entry; LMDB holds 128 Ki). One commit per 256 MB shard measured no faster here
# and much more variable (fresh memory for every shard).
_COMMIT_EVERY_BYTES = 64 * 2**20
_COMMIT_EVERY_RECORDS = 65536


class LMDBShardWriter:
    """Appends records in position order to ``path`` (a single file, no lock file)."""

    def __init__(self, path: Path, planned_bytes: int) -> None:
        self.path = path
        self.map_size = int(planned_bytes * 1.3) + 64 * 2**20
        # No fsync per commit: a shard counts only once finish() has synced it (env.sync) and the
        # packer has renamed and journaled it, so a crash mid-shard redoes the shard either way.
        # Syncing each 64 MB commit made the writer thread wait on the disk 12 times a 10,000-photo
        # pack (0.7-2.0 s of its time against 0.2 s without: bench/writer_bench.py, profiled).
        self.env = lmdb.open(str(path), subdir=False, map_size=self.map_size, lock=False,
                             readahead=False, meminit=False, sync=False, metasync=False, max_dbs=0)
        self.txn = self.env.begin(write=True)
        self.position = 0
        self.offset = 0
        self.used = 0  # pages LMDB will need, estimated, to grow the map before it is full
        self.pending = 0
        self.pending_records = 0

    def append(self, payload: bytes) -> int:
        """Store ``payload`` at the next position; returns its offset in the shard's data stream."""
        need = (len(payload) + 16 + _PAGE - 1) // _PAGE * _PAGE + 64
        if self.used + need + 16 * _PAGE > self.map_size * 0.9:
            # LMDB may only grow the map with no transaction open: commit, grow, then begin again.
            self.txn.commit()
            self.map_size = max(self.map_size * 2, self.used + need + 64 * 2**20)
            self.env.set_mapsize(self.map_size)
            self.txn = self.env.begin(write=True)
            self.pending = self.pending_records = 0
        elif self.pending > _COMMIT_EVERY_BYTES or self.pending_records >= _COMMIT_EVERY_RECORDS:
            self._commit()
        self.txn.put(lmdb_key(self.position), payload, append=True)
        self.used += need
        self.pending += len(payload)
        self.pending_records += 1
        offset = self.offset
        self.position += 1
        self.offset += len(payload)
        return offset

    def _commit(self) -> None:
        self.txn.commit()
        self.txn = self.env.begin(write=True)
        self.pending = self.pending_records = 0

    def finish(self) -> tuple[int, int]:
        """Commit, fsync and close; returns (file bytes, -1: LMDB has no single data offset)."""
        self.txn.commit()
        self.env.sync(True)
        self.env.close()
        return os.path.getsize(self.path), -1

    def abort(self) -> None:
        try:
            self.txn.abort()
            self.env.close()
        except lmdb.Error:
            pass
