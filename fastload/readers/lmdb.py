"""LMDB shard reader: records read with ``pread`` at offsets the B-tree walk found at open."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastload.errors import ManifestError
from fastload.format.files import open_regular
from fastload.readers.base import ShardReader
from fastload.readers.lmdb_pages import DamagedShard, RecordPlaces, locate_records

_READAHEAD_MIN_RECORD = 16 * 1024


@dataclass(frozen=True)
class _OpenShard:
    fd: Any  # a descriptor, or a RemoteShard
    places: RecordPlaces


class LMDBReader(ShardReader):
    """Reads payloads from ``shard-NNNNN.lmdb`` files by (shard, position).

    Each process that reads a shard walks its B-tree once (:mod:`fastload.readers.lmdb_pages`:
    a few dozen pages per 256 MB of photos) and from then on reads a record like the HDF5 reader
    does: one ``pread``, without the GIL, mapping nothing. No liblmdb environment is opened for
    reading, so none of LMDB's fork and process traps apply (``MDB_BAD_RSLOT`` in forked workers,
    a file that cannot be opened twice in one process); like every reader, a forked worker opens
    its own descriptors.
    """

    def open_shard(self, shard: int) -> Any:
        info = self.manifest.shards[shard]
        if self.remote is not None:
            def walk(remote: Any) -> RecordPlaces:
                return locate_records(remote.read_at, remote.size, info.entries, remote.read_many)

            try:  # a tree that fails on cached bytes is walked again on the store's
                return _OpenShard(*self.remote.open_parsed(shard, walk, DamagedShard))
            except DamagedShard as exc:
                raise ManifestError(f"{self.root}/{info.file}: damaged LMDB shard ({exc}); run `fastload "
                                    "verify` on the dataset and re-pack it") from None
        path = Path(self.root) / info.file
        self.stat_shard(shard)
        try:
            fd = open_regular(path)
        except OSError as exc:
            raise ManifestError(f"{path}: shard file cannot be opened ({exc.strerror}); re-pack "
                                "the dataset with `fastload pack`") from None
        try:
            places = locate_records(lambda offset, size: os.pread(fd, size, offset),
                                    os.fstat(fd).st_size, info.entries)
        except (DamagedShard, OSError) as exc:
            os.close(fd)
            raise ManifestError(f"{path}: damaged LMDB shard ({exc}); run `fastload verify` on the "
                                "dataset and re-pack it") from None
        if info.data_bytes < _READAHEAD_MIN_RECORD * max(info.entries, 1):
            # Tiny records: a random read should not drag its neighbours in with readahead
            # (records of tens of KB gain from it: cold ~105 KB photos read 4x faster with it).
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            except OSError:
                pass  # a hint only
        return _OpenShard(fd, places)

    def close_handle(self, handle: Any) -> None:
        if isinstance(handle.fd, int):
            os.close(handle.fd)
        else:
            handle.fd.close()

    def locate(self, i: int, field: str | None = None) -> tuple[int, int, int]:
        shard = self.handle(int(self.index.shard[i]))
        columns = self.places(field)
        position = int(columns.position[i])
        offset, stored = int(shard.places.offset[position]), int(shard.places.size[position])
        size = int(columns.size[i])
        if offset < 0:
            raise self.corrupt(i, "record missing from its shard", field)
        if stored != size:
            raise self.corrupt(i, f"{stored} bytes stored, index says {size}", field)
        return shard.fd, offset, size
