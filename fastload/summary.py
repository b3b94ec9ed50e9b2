"""What a packed dataset holds, as a plain dict (``fastload info``)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from fastload.format import RecordIndex
from fastload.storage.packed import locate_packed


def describe(path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Records, classes with counts, shards, sizes, storage kind and how and when it was packed."""
    location = locate_packed(path, storage_options)
    root = location.root
    manifest = location.manifest()
    index = RecordIndex(root, manifest, location.read)
    classes = manifest.classes or []
    # Counted by value, never allocated by value: a label may be 2**40 when there are no class names.
    found, counts = np.unique(index.label[index.label >= 0], return_counts=True)
    per_label = dict(zip(found.tolist(), counts.tolist()))
    return {
        "path": str(root),
        "storage": manifest.storage,
        "format_version": manifest.format_version,
        "version": manifest.version,
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
        "pixel_cache": _pixel_cache(index) if manifest.kind == "images" else None,
    }


def _pixel_cache(index: RecordIndex, image_size: int = 224) -> dict[str, Any]:
    """What ``PackedDataset(image_size=224, pixel_cache=True)`` would store: an estimate from the
    index's image sizes."""
    from fastload.pixels.layout import default_side, folder_bytes

    side = default_side((image_size, image_size), 0.875)
    total = folder_bytes(index.width, index.height, side)
    return {"image_size": image_size, "side": side, "bytes": total,
            "bytes_per_image": total / max(1, len(index.width))}
