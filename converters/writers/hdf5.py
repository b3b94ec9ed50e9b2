"""HDF5 shard writer: one contiguous uint8 dataset of all payloads, so readers can pread it."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np

from fastload.format import FORMAT_VERSION, HDF5_DATA, HDF5_OFFSETS

_WRITE_CHUNK = 64


class HDF5ShardWriter:
    """Buffers one shard's payloads, then writes a contiguous dataset and its offsets."""

    def __init__(self, path: Path, planned_bytes: int) -> None:
        self.path = path
        self.payloads: list[bytes] = []
        self.offset = 0

    def append(self, payload: bytes) -> int:
        offset = self.offset
        self.payloads.append(payload)
        self.offset += len(payload)
        return offset

    def finish(self) -> tuple[int, int]:
        """Write the file and fsync it; returns (file bytes, payload dataset's file offset)."""
        total = self.offset
        offsets = np.zeros(len(self.payloads) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in self.payloads], out=offsets[1:])
        try:
            with h5py.File(self.path, "w", libver="earliest") as f:
                f.attrs["fastload_format_version"] = FORMAT_VERSION
                f.create_dataset(HDF5_OFFSETS, data=offsets)
                # Early allocation and no fill: the payload space exists now, and we write it ourselves.
                dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                dcpl.set_layout(h5py.h5d.CONTIGUOUS)
                dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
                dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
                space = h5py.h5s.create_simple((max(total, 1),))
                dset = h5py.h5d.create(f.id, HDF5_DATA.encode(), h5py.h5t.NATIVE_UINT8, space, dcpl=dcpl)
                data_offset = dset.get_offset()
                dset.close()
        except RuntimeError as exc:  # h5py reports a failed extend or close (disk full) as RuntimeError
            raise OSError(f"HDF5 could not write the file ({exc})") from None
        if data_offset is None:
            raise OSError(f"{self.path}: HDF5 did not allocate the payload dataset")
        fd = os.open(self.path, os.O_WRONLY)
        try:
            position = data_offset
            for start in range(0, len(self.payloads), _WRITE_CHUNK):
                chunk = self.payloads[start:start + _WRITE_CHUNK]
                written = os.pwritev(fd, chunk, position)
                expected = sum(len(p) for p in chunk)
                if written != expected:
                    raise OSError(f"{self.path}: short write ({written} of {expected} bytes)")
                position += written
            os.fsync(fd)
        finally:
            os.close(fd)
        self.payloads = []
        return os.path.getsize(self.path), int(data_offset)

    def abort(self) -> None:
        self.payloads = []
