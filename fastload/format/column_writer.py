"""Index columns written: strings and arrays encoded as offsets and values, each column an fsynced .npy with its digest."""

from __future__ import annotations

import io
import itertools
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import xxhash

from fastload.format.files import create_new, ensure_dir, write_all, write_new
from fastload.format.layout import INDEX_DIR, file_digest
from fastload.format.manifest import IndexFile, fsync_dir


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
    fsynced, and return manifest entries with digests.

    Each column goes through a temp file, fsync and rename; the folder is fsynced once, after the
    last rename (its renames are durable before the manifest, written after, names them): one sync
    of the folder instead of one a column, ~10 of a pack's ~20 syncs, which a Ray pack pays per part."""
    ensure_dir(dataset_dir / INDEX_DIR)
    ensure_dir(dataset_dir / folder)
    entries = {}
    for name, array in columns.items():
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
        data = buf.getvalue()
        rel = f"{folder}/{name}.npy"
        path = dataset_dir / rel
        tmp = path.with_name(path.name + ".tmp")
        write_new(tmp, data)  # fsynced; a link planted at either name is replaced, never written through
        os.replace(tmp, path)
        entries[name] = IndexFile(file=rel, dtype=str(array.dtype), digest=file_digest(data))
    fsync_dir(dataset_dir / folder)
    return entries


def write_column_pieces(dataset_dir: Path, name: str, dtype: np.dtype, length: int, pieces: Iterable[np.ndarray],
                        folder: str = INDEX_DIR) -> IndexFile:
    """Write a 1-D column of ``length`` values, given as consecutive ``pieces``, to ``index/<name>.npy``:
    the bytes (and digest) ``write_columns`` writes for the joined column, with one piece in memory
    at a time instead of the column (a Ray pack's finalize joins its tasks' columns so)."""
    ensure_dir(dataset_dir / INDEX_DIR)
    ensure_dir(dataset_dir / folder)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                                  "fortran_order": False, "shape": (length,)})
    rel = f"{folder}/{name}.npy"
    path = dataset_dir / rel
    tmp = path.with_name(path.name + ".tmp")
    digest = xxhash.xxh3_128()
    fd = create_new(tmp, 0o644)  # a link planted at either name is replaced, never written through
    try:
        for data in itertools.chain([header.getvalue()], (_bytes(piece, dtype) for piece in pieces)):
            digest.update(data)
            write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    written = os.path.getsize(tmp) - len(header.getvalue())
    if written != length * np.dtype(dtype).itemsize:
        tmp.unlink()
        raise ValueError(f"{rel}: pieces hold {written} bytes, not the {length} values of {dtype} the header says")
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return IndexFile(file=rel, dtype=str(np.dtype(dtype)), digest=digest.hexdigest())


def _bytes(piece: np.ndarray, dtype: np.dtype) -> memoryview:
    return memoryview(np.ascontiguousarray(piece, dtype=dtype)).cast("B")
