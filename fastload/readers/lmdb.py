"""LMDB shard reader: read-only environments, no locks, one read transaction per batch and shard."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lmdb

from fastload.errors import ManifestError
from fastload.format import lmdb_key
from fastload.readers.base import ShardReader


class LMDBReader(ShardReader):
    """Reads payloads from ``shard-NNNNN.lmdb`` files by (shard, position)."""

    def open_shard(self, shard: int) -> Any:
        path = self.root / self.manifest.shards[shard].file
        try:
            # lock=False: read-only data never changes; readahead=False: random access on big sets.
            return lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=False,
                             max_readers=1024, max_dbs=0)
        except lmdb.Error as exc:
            raise ManifestError(f"{path}: cannot open LMDB shard ({exc}); re-pack the dataset") from None

    def read_raw(self, indices: Sequence[int]) -> list[bytes]:
        out: list[bytes | None] = [None] * len(indices)
        by_shard: dict[int, list[int]] = {}
        for k, i in enumerate(indices):
            by_shard.setdefault(int(self.index.shard[i]), []).append(k)
        for shard, ks in by_shard.items():
            env = self.handle(shard)
            try:
                with env.begin(buffers=False) as txn:
                    for k in ks:
                        i = indices[k]
                        value = txn.get(lmdb_key(int(self.index.position[i])))
                        if value is None:
                            raise self.corrupt(i, "record missing from its shard")
                        if len(value) != self.index.size[i]:
                            raise self.corrupt(i, f"{len(value)} bytes stored, index says {int(self.index.size[i])}")
                        out[k] = value
            except lmdb.Error as exc:
                raise self.corrupt(indices[ks[0]], f"LMDB read failed ({exc})") from None
        return out  # type: ignore[return-value]
