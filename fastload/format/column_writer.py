"""Index columns written: strings and arrays encoded as offsets and values, each column an fsynced .npy with its digest."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fastload.format.files import ensure_dir
from fastload.format.layout import INDEX_DIR, file_digest
from fastload.format.manifest import IndexFile, write_atomically


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


def write_columns(dataset_dir: Path, columns: dict[str, np.ndarray], folder: str = INDEX_DIR) -> dict[str, IndexFile]:
    """Write each column to ``index/<name>.npy`` (an appended version's: ``index/v00002/<name>.npy``),
    fsynced, and return manifest entries with digests."""
    ensure_dir(dataset_dir / INDEX_DIR)
    ensure_dir(dataset_dir / folder)
    entries = {}
    for name, array in columns.items():
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
        data = buf.getvalue()
        rel = f"{folder}/{name}.npy"
        write_atomically(dataset_dir / rel, data)
        entries[name] = IndexFile(file=rel, dtype=str(array.dtype), digest=file_digest(data))
    return entries
