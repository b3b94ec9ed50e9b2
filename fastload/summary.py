"""What a packed dataset holds, as a plain dict (``fastload info``), and what a folder that is not one is."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from fastload.errors import DatasetNotFoundError
from fastload.format import INDEX_DIR, MANIFEST_NAME, PACK_LOCK_NAME, PACK_STATE_DIR, RecordIndex, read_manifest
from fastload.format.layout import SHARD_NAME

_LOOK_AT = 2000  # entries looked at to tell an image folder from anything else


def describe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Records, classes with counts, shards, sizes, storage kind and how and when it was packed."""
    root = Path(path)
    require_dataset(root)
    manifest = read_manifest(root)
    index = RecordIndex(root, manifest)
    classes = manifest.classes or []
    # Counted by value, never allocated by value: a label may be 2**40 when there are no class names.
    found, counts = np.unique(index.label[index.label >= 0], return_counts=True)
    per_label = dict(zip(found.tolist(), counts.tolist()))
    return {
        "path": str(root),
        "storage": manifest.storage,
        "format_version": manifest.format_version,
        "kind": manifest.kind,
        "records": manifest.num_records,
        "payload_bytes": manifest.total_bytes,
        "disk_bytes": sum(s.bytes for s in manifest.shards),
        "unlabeled": int((index.label < 0).sum()),
        "labels": len(per_label),
        "classes": [{"name": name, "label": i, "records": int(per_label.get(i, 0))}
                    for i, name in enumerate(classes)],
        "fields": manifest.fields,
        "shards": [{"file": s.file, "records": s.num_records, "bytes": s.bytes} for s in manifest.shards],
        "packed": manifest.packed,
    }


def require_dataset(path: str | os.PathLike[str]) -> None:
    """Raise DatasetNotFoundError saying what an existing folder without a manifest is, and what
    to do: a source folder of images, an empty folder, or the shards of an unfinished pack.

    Anything else (a missing path, a file, a finished dataset) is left to ``read_manifest``.
    """
    root = Path(path)
    if not root.is_dir() or (root / MANIFEST_NAME).exists():
        return
    try:
        with os.scandir(root) as it:
            names = [entry.name for _, entry in zip(range(_LOOK_AT), it)]
    except OSError:
        return  # read_manifest names the problem
    if not names:
        raise DatasetNotFoundError(f"{root}: is empty, not a packed dataset; pass the folder "
                                   f"`fastload pack` wrote (it holds {MANIFEST_NAME})")
    if any(_left_by_a_pack(name) for name in names):
        raise DatasetNotFoundError(
            f"{root}: holds an unfinished pack (shards, no {MANIFEST_NAME}), so it is not a finished "
            "dataset yet; run the same `fastload pack` command again to finish it")
    if _holds_images(root):
        out = root.with_name(root.name + ".fl")
        done = f" (a packed copy is already there: `fastload info {out}`)" if (out / MANIFEST_NAME).exists() else ""
        raise DatasetNotFoundError(f"{root}: is a folder of images, not a packed dataset; pack it with "
                                   f"`fastload pack {root} -o {out}`{done}")
    raise DatasetNotFoundError(f"{root}: has no {MANIFEST_NAME} and holds no images or shards, so it is "
                               f"not a packed dataset; pass the folder `fastload pack` wrote")


def _left_by_a_pack(name: str) -> bool:
    shard = name.removesuffix(".tmp").removesuffix(".exact")
    return bool(SHARD_NAME.match(shard)) or name in (PACK_STATE_DIR, PACK_LOCK_NAME, INDEX_DIR)


def _holds_images(root: Path) -> bool:
    """An image file in ``root`` or one level below (an ImageFolder's class folders)."""
    from converters.sources import IMAGE_EXTENSIONS

    seen = 0
    for directory in (root, *sorted(p for p in _entries(root) if p.is_dir())):
        for entry in _entries(directory):
            seen += 1
            if entry.name.lower().endswith(IMAGE_EXTENSIONS) and entry.is_file():
                return True
            if seen >= _LOOK_AT:
                return False
    return False


def _entries(directory: Path) -> list[Path]:
    try:
        with os.scandir(directory) as it:
            return [Path(e.path) for _, e in zip(range(_LOOK_AT), it)]
    except OSError:
        return []
