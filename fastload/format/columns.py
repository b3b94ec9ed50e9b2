"""Index columns read back: one .npy file each, digest, dtype and length checked; strings and arrays as offsets."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import numpy as np

from fastload.errors import ManifestError, RemoteReadError
from fastload.format.files import read_regular
from fastload.format.layout import array_type, file_digest
from fastload.format.manifest import IndexFile, Manifest

_NPY_HEADER_MAX = 65536 + 12  # np.save writes a header of at most 64 KiB after its preamble


class StringColumn:
    """Read-only strings stored as UTF-8 bytes back to back plus N+1 offsets (no Python list)."""

    def __init__(self, offsets: np.ndarray, blob: np.ndarray) -> None:
        self.offsets = offsets
        self.blob = blob

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.blob[start:end].tobytes().decode("utf-8")


class ArrayColumn:
    """Read-only arrays, one per record: N+1 offsets into the rows of ``values`` (flattened; each
    row shaped ``inner``). ``column[i]`` is a view of record ``i``'s array, ``(rows, *inner)``."""

    def __init__(self, offsets: np.ndarray, values: np.ndarray, inner: tuple[int, ...]) -> None:
        self.offsets, self.values, self.inner = offsets, values, inner
        self._row = int(np.prod(inner, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.values[start * self._row:end * self._row].reshape(end - start, *self.inner)


class FileColumn:
    """Where each record's file of one file field is: position and byte offset in the record's
    shard, size, checksum, and the image's (or array's) width and height, -1 when it has none."""

    def __init__(self, columns: dict[str, np.ndarray]) -> None:
        self.position: np.ndarray = columns["position"]
        self.offset: np.ndarray = columns["offset"]
        self.size: np.ndarray = columns["size"]
        self.checksum: np.ndarray = columns["checksum"]
        self.width: np.ndarray = columns["width"]
        self.height: np.ndarray = columns["height"]

    def __len__(self) -> int:
        return len(self.size)


ReadFile = Callable[[str, int], bytes]
"""``read(name, limit)``: the bytes of the dataset file ``name`` (``index/label.npy``), OSError when
it cannot be read or holds more than ``limit`` bytes; local folders and object stores each give one."""


def local_files(dataset_dir: Path) -> ReadFile:
    """Reads of a local dataset folder's files: regular files only, bounded (see files.py)."""
    return lambda name, limit: read_regular(Path(dataset_dir) / name, limit)


def load_column(dataset_dir: Path | str, name: str, entry: IndexFile, expected_len: int | None,
                max_len: int | None = None, read: ReadFile | None = None) -> np.ndarray:
    """Load one column, checking its digest, dtype and length; damage raises ManifestError.

    The file is read only if it is a regular file no larger than an .npy header plus
    ``expected_len`` (else ``max_len``) 8-byte items: a FIFO, a device or an oversized file is
    refused before it is read.
    """
    path = f"{dataset_dir}/{entry.file}"
    items = expected_len if expected_len is not None else max_len
    if items is None:
        raise ValueError("load_column needs expected_len or max_len: every read is bounded")
    try:
        data = (read or local_files(Path(dataset_dir)))(entry.file, _NPY_HEADER_MAX + 8 * items)
    except RemoteReadError:
        raise  # the store's own error names the object and says what to do (a retry, not a re-pack)
    except OSError as exc:
        raise ManifestError(
            f"{path}: index column {name!r} cannot be read ({exc.strerror or exc}); re-pack the dataset"
        ) from None
    if file_digest(data) != entry.digest:
        raise ManifestError(
            f"{path}: index column {name!r} does not match the digest in the manifest "
            "(the file was changed or damaged); re-pack the dataset"
        )
    try:
        # read_array, not np.load: np.load would also open a zip (.npz) or a pickle behind the name
        array = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ManifestError(f"{path}: not a valid .npy file ({exc}); re-pack the dataset") from None
    if str(array.dtype) != entry.dtype or array.ndim != 1:
        raise ManifestError(
            f"{path}: expected a 1-D {entry.dtype} column, found {array.ndim}-D {array.dtype}; "
            "re-pack the dataset"
        )
    if expected_len is not None and len(array) != expected_len:
        raise ManifestError(
            f"{path}: has {len(array)} entries, expected {expected_len}; re-pack the dataset"
        )
    array.setflags(write=False)
    return array


def load_strings(dataset_dir: Path | str, manifest: Manifest, name: str,
                 read: ReadFile | None = None) -> StringColumn:
    """Load a string column and check its offsets are monotonic and inside the blob."""
    offsets = load_column(dataset_dir, f"{name}.offsets", manifest.index[f"{name}.offsets"],
                          manifest.num_records + 1, read=read)
    blob = load_column(dataset_dir, f"{name}.blob", manifest.index[f"{name}.blob"], None,
                       max_len=max(int(offsets[-1]), 0), read=read)
    if offsets[0] != 0 or offsets[-1] != len(blob) or np.any(np.diff(offsets) < 0):
        raise ManifestError(
            f"{dataset_dir}/{manifest.index[f'{name}.offsets'].file}: offsets are not monotonic "
            "within the blob; re-pack the dataset"
        )
    return StringColumn(offsets, blob)


def load_arrays(dataset_dir: Path | str, manifest: Manifest, name: str, dtype: str,
                read: ReadFile | None = None) -> ArrayColumn:
    """Load an array field's column (``dtype`` like ``float64[*,4]``) and check its offsets: from
    0, never decreasing, ending at the values' rows, every record the same rows when the type
    fixes them."""
    kind = array_type(dtype)
    assert kind is not None, dtype
    _, first, inner = kind
    offsets = load_column(dataset_dir, f"{name}.offsets", manifest.index[f"{name}.offsets"],
                          manifest.num_records + 1, read=read)
    counts = np.diff(offsets)
    problem = (counts < 0) if first is None else (counts != first)
    if offsets[0] != 0 or problem.any():
        bad = 0 if offsets[0] != 0 else int(np.flatnonzero(problem)[0])
        raise ManifestError(
            f"{dataset_dir}/{manifest.index[f'{name}.offsets'].file}: record {bad} has "
            f"{int(counts[bad]) if len(counts) else 0} rows, which a {dtype} field cannot hold; "
            "re-pack the dataset")
    row = int(np.prod(inner, dtype=np.int64))
    values = load_column(dataset_dir, f"{name}.values", manifest.index[f"{name}.values"], int(offsets[-1]) * row,
                         read=read)
    return ArrayColumn(offsets, values, inner)
