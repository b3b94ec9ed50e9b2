"""The per-record index of a dataset: every column loaded, checked against the manifest and each other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fastload.errors import ManifestError
from fastload.format.columns import (
    ArrayColumn,
    FileColumn,
    ReadFile,
    StringColumn,
    load_arrays,
    load_column,
    load_strings,
)
from fastload.format.layout import (
    COLUMNS,
    FIELD_PREFIX,
    FILE_COLUMNS,
    FILE_TYPES,
    INDEX_DIR,
    array_type,
)
from fastload.format.manifest import Manifest


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
