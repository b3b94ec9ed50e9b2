"""HDF5 shard reader: checks the layout once with h5py, then reads payloads with pread."""

from __future__ import annotations

import os
from typing import Any

from fastload.errors import FastloadError, ManifestError
from fastload.format import HDF5_DATA
from fastload.format.files import open_regular
from fastload.format.manifest import ShardInfo
from fastload.readers.base import ShardReader


class HDF5Reader(ShardReader):
    """Reads payloads from the contiguous ``data`` dataset of ``shard-NNNNN.h5`` at known offsets.

    The dataset is contiguous, so its bytes sit at one file offset: ``os.pread`` reads a record
    without h5py's per-call overhead and releases the GIL, so threads read in parallel.
    """

    def open_shard(self, shard: int) -> Any:
        info = self.manifest.shards[shard]
        path = f"{self.root}/{info.file}"
        if self.remote is not None:
            remote, _ = self.remote.open_parsed(shard, lambda r: _check_layout(r.stream(), path, info),
                                                ManifestError)
            return remote
        self.stat_shard(shard)  # a regular file of the size the manifest says, before h5py opens it
        _check_layout(path, path, info)
        try:
            return open_regular(path)
        except OSError as exc:
            raise ManifestError(f"{path}: shard file cannot be opened ({exc.strerror}); re-pack "
                                "the dataset with `fastload pack`") from None

    def close_handle(self, handle: Any) -> None:
        if isinstance(handle, int):
            os.close(handle)
        else:
            handle.close()

    def locate(self, i: int, field: str | None = None) -> tuple[int, int, int]:
        shard, columns = int(self.index.shard[i]), self.places(field)
        start = self.manifest.shards[shard].data_offset + int(columns.offset[i])
        return self.handle(shard), start, int(columns.size[i])


def _check_layout(source: Any, path: str, info: ShardInfo) -> None:
    """Check with h5py that the shard (a path, or a file object over a remote one) holds its
    payloads contiguous where the manifest says; ManifestError if not. A store that fails is
    not called damaged: its own error is raised."""
    import h5py

    try:
        with h5py.File(source, "r") as f:
            dset = f[HDF5_DATA]
            if not isinstance(dset, h5py.Dataset) or dset.ndim != 1:  # a damaged header
                raise ValueError(f"{HDF5_DATA!r} is a {type(dset).__name__}, not a 1-D dataset")
            offset = dset.id.get_offset()
            ok = dset.dtype == "uint8" and dset.chunks is None and dset.shape[0] >= info.data_bytes
    except (OSError, KeyError, ValueError, RuntimeError, TypeError) as exc:  # what h5py raises
        if isinstance(exc, FastloadError):  # the store failed: say so, not "damaged"
            raise
        raise ManifestError(f"{path}: not a readable fastload HDF5 shard ({exc}); re-pack the dataset") from None
    if not ok or offset != info.data_offset:
        raise ManifestError(f"{path}: the payload dataset is not where the manifest says "
                            f"(offset {offset}, expected {info.data_offset}); re-pack the dataset")
