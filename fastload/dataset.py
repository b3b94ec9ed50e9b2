"""PackedDataset: a packed directory as a map-style torch Dataset (reader + decode + transforms)."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data

from fastload.format import Manifest, RecordIndex, read_manifest
from fastload.readers import READERS, ShardReader


class PackedDataset(torch.utils.data.Dataset):
    """Read-only random access to a dataset written by ``fastload pack``.

    Args:
        path: the packed dataset directory (the one holding ``manifest.json``).
        transform: applied to the PIL image, as in torchvision's ImageFolder.
        target_transform: applied to the label.

    ``ds[i]`` is ``(PIL.Image in RGB, label)``; ``ds.record(i)`` gives the stored bytes and metadata.
    Shard handles open lazily in the process that reads, so the dataset can go to DataLoader workers
    under fork or spawn; per-record metadata lives in NumPy arrays, never Python lists.
    """

    def __init__(self, path: str | os.PathLike[str], transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[int], Any] | None = None) -> None:
        self.root = Path(path)
        self.transform = transform
        self.target_transform = target_transform
        self._open()

    def _open(self) -> None:
        self.manifest: Manifest = read_manifest(self.root)
        self.index = RecordIndex(self.root, self.manifest)
        self.reader: ShardReader = READERS[self.manifest.storage](self.root, self.manifest, self.index)

    def __getstate__(self) -> dict[str, Any]:
        # Spawned workers re-open from the directory instead of receiving pickled arrays.
        state = self.__dict__.copy()
        for name in ("manifest", "index", "reader"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open()

    def __len__(self) -> int:
        return self.manifest.num_records

    @property
    def classes(self) -> list[str]:
        """Class names in label order (empty when the source had no labels)."""
        return list(self.manifest.classes or [])

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.classes)}

    @property
    def targets(self) -> np.ndarray:
        """Every record's label as a read-only int64 array (-1 where unlabeled)."""
        return self.index.label

    def _check(self, i: int) -> int:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record index {i} is out of range for a dataset of {n} records")
        return i + n if i < 0 else int(i)

    def record(self, i: int) -> dict[str, Any]:
        """The stored record: ``data`` (bytes), ``label``, ``path``, ``width``, ``height`` and extra fields."""
        i = self._check(i)
        out: dict[str, Any] = {
            "data": self.reader.read(i), "label": int(self.index.label[i]), "path": self.index.path[i],
            "width": int(self.index.width[i]), "height": int(self.index.height[i]),
        }
        for name, column in self.index.fields.items():
            value = column[i]
            out[name] = value.item() if isinstance(value, np.generic) else value
        return out

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        i = self._check(i)
        image = self.load_image(i, self.reader.read(i))
        label: Any = int(self.index.label[i])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    def load_image(self, i: int, data: bytes) -> Any:
        """Full decode to an RGB PIL image; damage raises CorruptRecordError naming the record."""
        from PIL import Image

        try:
            image = Image.open(io.BytesIO(data))
            return image.convert("RGB")
        except Exception as exc:
            raise self.reader.corrupt(i, f"does not decode as an image ({exc})") from None

    def __repr__(self) -> str:
        return (f"PackedDataset({str(self.root)!r}, records={len(self)}, classes={len(self.classes)}, "
                f"storage={self.manifest.storage!r})")
