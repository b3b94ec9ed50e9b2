"""Per-record index columns as NumPy files: written with digests, loaded memory-mapped and checked."""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastload.errors import ManifestError
from fastload.format.files import ensure_dir, read_regular
from fastload.format.layout import (
    COLUMNS, FIELD_PREFIX, FILE_COLUMNS, FILE_TYPES, INDEX_DIR, array_type, file_digest,
)
from fastload.format.manifest import IndexFile, Manifest, write_atomically


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


def _typed_columns(root: Path | str, manifest: Manifest, dtypes: dict[str, str], read: ReadFile | None,
                   prefix: str = "") -> dict[str, np.ndarray]:
    """The columns ``prefix + name`` of ``dtypes``, one per record, each of its dtype; a column
    of another dtype raises ManifestError naming its file."""
    cols = {}
    for name, dtype in dtypes.items():
        column = prefix + name
        cols[name] = load_column(root, column, manifest.index[column], manifest.num_records, read=read)
        if str(cols[name].dtype) != dtype:
            raise ManifestError(f"{root}/{manifest.index[column].file}: column {column!r} is "
                                f"{cols[name].dtype}, expected {dtype}; re-pack the dataset")
    return cols


def encode_arrays(arrays: Sequence[np.ndarray], element: str) -> tuple[np.ndarray, np.ndarray]:
    """Offsets (int64, N+1, in rows of the first dimension) and the flattened values of ``arrays``."""
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([len(a) for a in arrays], out=offsets[1:])
    flat = [np.asarray(a, dtype=element).reshape(-1) for a in arrays]
    values = np.concatenate(flat) if flat else np.zeros(0, dtype=element)
    return offsets, values.astype(element, copy=False)


def encode_strings(values: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Offsets (int64, N+1) and UTF-8 blob (uint8) for ``values``."""
    encoded = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    return offsets, blob


def write_columns(dataset_dir: Path, columns: dict[str, np.ndarray]) -> dict[str, IndexFile]:
    """Write each column to ``index/<name>.npy`` (fsynced) and return manifest entries with digests."""
    ensure_dir(dataset_dir / INDEX_DIR)
    entries = {}
    for name, array in columns.items():
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
        data = buf.getvalue()
        rel = f"{INDEX_DIR}/{name}.npy"
        write_atomically(dataset_dir / rel, data)
        entries[name] = IndexFile(file=rel, dtype=str(array.dtype), digest=file_digest(data))
    return entries


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
    except OSError as exc:
        raise ManifestError(
            f"{path}: index column {name!r} cannot be read ({exc.strerror}); re-pack the dataset"
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


class RecordIndex:
    """Every per-record column of a dataset, checked against the manifest and against each other."""

    def __init__(self, root: Path | str, manifest: Manifest, read: ReadFile | None = None) -> None:
        self.root = root
        self.manifest = manifest
        n = manifest.num_records
        cols = _typed_columns(root, manifest, {name: dtype for name, dtype in COLUMNS.items() if dtype != "str"},
                              read)
        self.label: np.ndarray = cols["label"]
        self.shard: np.ndarray = cols["shard"]
        self.position: np.ndarray = cols["position"]
        self.offset: np.ndarray = cols["offset"]
        self.size: np.ndarray = cols["size"]
        self.checksum: np.ndarray = cols["checksum"]
        self.width: np.ndarray = cols["width"]
        self.height: np.ndarray = cols["height"]
        self.path = load_strings(root, manifest, "path", read)
        self.fields: dict[str, np.ndarray | StringColumn | ArrayColumn] = {}
        self.files: dict[str, FileColumn] = {}  # file fields: where each record's file is
        for name, dtype in manifest.fields.items():
            column = FIELD_PREFIX + name
            if dtype in FILE_TYPES:
                self.files[name] = FileColumn(_typed_columns(root, manifest, FILE_COLUMNS, read, f"{column}."))
                continue
            self.fields[name] = (load_strings(root, manifest, column, read) if dtype == "str" else
                                 load_arrays(root, manifest, column, dtype, read) if array_type(dtype) else
                                 load_column(root, column, manifest.index[column], n, read=read))
        self._check_consistent()

    def field(self, name: str, i: int) -> Any:
        """Record ``i``'s value of the extra field ``name``: a Python number, a str, or a read-only
        array view (an array field). File fields are read from the shards (``files``)."""
        value = self.fields[name][i]
        return value.item() if isinstance(value, np.generic) else value

    def _check_consistent(self) -> None:
        """Refuse index values that would point outside their shards or mean nothing (damage or
        hostile input), naming the first bad record. Written so no sum can wrap int64."""
        shards = self.manifest.shards
        where = f"{self.root}/{INDEX_DIR}"
        if not len(self.shard):
            return
        bad_shard = (self.shard < 0) | (self.shard >= len(shards))
        if bad_shard.any():
            bad = int(np.flatnonzero(bad_shard)[0])
            raise ManifestError(f"{where}: record {bad} has shard {int(self.shard[bad])}: shard numbers "
                                f"outside 0..{len(shards) - 1} do not exist; re-pack the dataset")
        for name, places in [("", self), *self.files.items()]:
            self._check_places(places, f"{where}: record {{bad}}" + (f" field {name!r}" if name else ""))
        self._check_labels(where)

    def _check_places(self, places: Any, what: str) -> None:
        """Every payload of ``places`` (the records' files, or a file field's) inside its shard,
        and sized -1 or at least 1x1; ``what`` names the first bad one (``{bad}``: its record)."""
        shards = self.manifest.shards
        # Manifest counts and sizes are at most 2**53 (parse_manifest): these hold them exactly.
        counts = np.array([s.entries for s in shards], dtype=np.int64)[self.shard]
        data_bytes = np.array([s.data_bytes for s in shards], dtype=np.int64)[self.shard]
        # offset <= data_bytes - size, never offset + size: an offset near 2**63 would wrap the sum.
        # The clip keeps the subtraction inside 0..data_bytes for rows whose size is refused anyway.
        room = data_bytes - np.clip(places.size, 0, data_bytes)
        in_range = ((places.position >= 0) & (places.position < counts)
                    & (places.size >= 0) & (places.size <= data_bytes)
                    & (places.offset >= 0) & (places.offset <= room))
        if not in_range.all():
            bad = int(np.flatnonzero(~in_range)[0])
            shard = shards[int(self.shard[bad])]
            raise ManifestError(
                f"{what.format(bad=bad)} points outside shard {shard.file} (position "
                f"{int(places.position[bad])}, offset {int(places.offset[bad])}, size {int(places.size[bad])}; "
                f"the shard holds {shard.entries} payloads, {shard.data_bytes} data bytes); "
                "re-pack the dataset")
        # An image is at least 1x1; a record that is not one (or was not measured) has -1 for both.
        sized = ((places.width >= 1) & (places.height >= 1)) | ((places.width == -1) & (places.height == -1))
        if not sized.all():
            bad = int(np.flatnonzero(~sized)[0])
            start, end = int(self.path.offsets[bad]), int(self.path.offsets[bad + 1])
            path = self.path.blob[start:end].tobytes().decode("utf-8", errors="replace")
            raise ManifestError(
                f"{what.format(bad=bad)} ({path}) has width {int(places.width[bad])} and height "
                f"{int(places.height[bad])}; an image is at least 1x1, and a record without a size has -1 "
                "for both; re-pack the dataset")

    def _check_labels(self, where: str) -> None:
        # Without class names a label is any class id >= 0: nothing may allocate by its value.
        labels_ok = self.label >= -1
        if self.manifest.classes is not None:
            labels_ok &= self.label < len(self.manifest.classes)
        if not labels_ok.all():
            bad = int(np.flatnonzero(~labels_ok)[0])
            allowed = (f"outside the class list (-1 or 0..{len(self.manifest.classes) - 1})"
                       if self.manifest.classes is not None else
                       "outside -1 (unlabeled) and the class ids 0 and up")
            raise ManifestError(f"{where}: record {bad} has label {int(self.label[bad])}, {allowed}; "
                                "re-pack the dataset")

