"""HDF5 shard writer: one contiguous uint8 dataset of all payloads, so readers can pread it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import h5py
import numpy as np

from fastload.format import FORMAT_VERSION, HDF5_DATA, HDF5_OFFSETS

# Unused space at the end of the payload dataset (skipped files, smaller re-encodes) is a sparse
# hole; above this much the shard is rewritten at its exact size.
_SLACK_BYTES = 4 * 2**20


class HDF5ShardWriter:
    """Streams payloads with ``pwrite`` into a contiguous dataset allocated up front.

    The dataset is sized for ``planned_bytes`` (the source files' sizes: exact when bytes are
    copied), so nothing is buffered: each payload goes to the page cache as it arrives. Payloads
    past the plan (a re-encode that grew) are kept in memory and the shard is rewritten at its
    exact size on ``finish``, as it is when much of the planned space went unused.
    """

    def __init__(self, path: Path, planned_bytes: int) -> None:
        self.path = path
        self.capacity = max(int(planned_bytes), 1)
        self.data_offset = _create(path, self.capacity)
        self.fd = os.open(path, os.O_WRONLY)
        self.offset = 0
        self.sizes: list[int] = []
        self.overflow: list[bytes] = []

    def append(self, payload: bytes) -> int:
        """Write ``payload`` after the previous one; returns its offset in the payload dataset."""
        offset = self.offset
        if not self.overflow and offset + len(payload) <= self.capacity:
            _pwrite_all(self.fd, payload, self.data_offset + offset, self.path)
        else:
            self.overflow.append(payload)
        self.offset += len(payload)
        self.sizes.append(len(payload))
        return offset

    def finish(self) -> tuple[int, int]:
        """Add the offsets dataset, fsync, close; returns (file bytes, payload dataset's file offset)."""
        if self.overflow or self.capacity - self.offset > _SLACK_BYTES:
            self._rewrite_exact()
        os.close(self.fd)
        self.fd = -1
        offsets = np.zeros(len(self.sizes) + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=offsets[1:])
        try:
            with h5py.File(self.path, "r+") as f:
                f.create_dataset(HDF5_OFFSETS, data=offsets)
        except RuntimeError as exc:  # h5py reports a failed write or close (disk full) as RuntimeError
            raise OSError(f"HDF5 could not write the file ({exc})") from None
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return os.path.getsize(self.path), self.data_offset

    def _rewrite_exact(self) -> None:
        """Copy what was streamed into a new file whose dataset holds exactly ``self.offset`` bytes."""
        exact = self.path.with_name(self.path.name + ".exact")
        streamed = self.offset - sum(len(p) for p in self.overflow)
        data_offset = _create(exact, max(self.offset, 1))
        src = os.open(self.path, os.O_RDONLY)
        dst = os.open(exact, os.O_WRONLY)
        try:
            _copy_range(src, dst, streamed, self.data_offset, data_offset, self.path)
            position = data_offset + streamed
            for payload in self.overflow:
                _pwrite_all(dst, payload, position, exact)
                position += len(payload)
        finally:
            os.close(src)
            os.close(dst)
        os.replace(exact, self.path)
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_WRONLY)
        self.data_offset, self.capacity, self.overflow = data_offset, max(self.offset, 1), []

    def abort(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self.overflow = []
        self.path.with_name(self.path.name + ".exact").unlink(missing_ok=True)


def _create(path: Path, capacity: int) -> int:
    """A new HDF5 file with a contiguous uint8 payload dataset of ``capacity`` bytes; its file offset."""
    try:
        with h5py.File(path, "w", libver="earliest") as f:
            f.attrs["fastload_format_version"] = FORMAT_VERSION
            # Early allocation and no fill: the space exists now (a sparse hole until written).
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_layout(h5py.h5d.CONTIGUOUS)
            dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
            dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
            space = h5py.h5s.create_simple((capacity,))
            dset = h5py.h5d.create(f.id, HDF5_DATA.encode(), h5py.h5t.NATIVE_UINT8, space, dcpl=dcpl)
            data_offset = dset.get_offset()
            dset.close()
    except RuntimeError as exc:
        raise OSError(f"HDF5 could not write the file ({exc})") from None
    if data_offset is None:
        raise OSError(f"{path}: HDF5 did not allocate the payload dataset")
    return int(data_offset)


def _copy_range(src: int, dst: int, size: int, src_at: int, dst_at: int, path: Path) -> None:
    """``size`` bytes from ``src`` at ``src_at`` to ``dst`` at ``dst_at``: in the kernel where the
    file system can, else through a buffer (some network and FUSE mounts cannot)."""
    copied = 0
    while copied < size:
        try:
            n = os.copy_file_range(src, dst, size - copied, src_at + copied, dst_at + copied)
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EXDEV, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            chunk = os.pread(src, min(size - copied, 1 << 24), src_at + copied)
            n = len(chunk)
            if n:
                _pwrite_all(dst, chunk, dst_at + copied, path)
        if n == 0:
            raise OSError(f"{path}: ended early while copying ({copied} of {size} bytes)")
        copied += n


def _pwrite_all(fd: int, payload: bytes, position: int, path: Path) -> None:
    """pwrite every byte: a short write is retried, so a full disk surfaces as ENOSPC/EFBIG."""
    view, done = memoryview(payload), 0
    while done < len(view):
        written = os.pwrite(fd, view[done:], position + done)
        if written == 0:
            raise OSError(f"{path}: the write made no progress at byte {position + done}")
        done += written
