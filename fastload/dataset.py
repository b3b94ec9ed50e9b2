"""PackedDataset: a packed directory as a map-style torch Dataset (reader + decode + transforms)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch.utils.data

from fastload.collate import collate_images
from fastload.config import available_cpus
from fastload.decode import decode_rgb
from fastload.epoch_sampler import SampleKey
from fastload.format import Manifest, RecordIndex, read_manifest
from fastload.pipeline import ImagePipeline, ThreadDecoder, decode_batch
from fastload.readers import READERS, ShardReader


class PackedDataset(torch.utils.data.Dataset):
    """Read-only random access to a dataset written by ``fastload pack``.

    Args:
        path: the packed dataset directory (the one holding ``manifest.json``).
        transform: applied to the PIL image, as in torchvision's ImageFolder (the slow, general path).
        target_transform: applied to the label.
        image_size: turns on the built-in image pipeline: samples are ``uint8`` ``3×H×W`` tensors.
        train: built-in pipeline mode: RandomResizedCrop + flip (True) or resize + centre crop (False).
        scale, ratio: RandomResizedCrop's area and aspect-ratio ranges.
        resize_ratio: eval crop side over resized shorter side (224/256 = 0.875).
        decode_threads: threads decoding a batch in ``__getitems__``; None: every core in the main
            process, one inside a DataLoader worker process.

    Without ``image_size``, ``ds[i]`` is ``(PIL.Image in RGB, label)`` (``(bytes, label)`` when the
    packed files are not all images); with it, ``(uint8 tensor, label)``, and ``__getitems__``
    reads and decodes a whole batch into one preallocated tensor.
    ``ds.record(i)`` gives the stored bytes and metadata.
    Shard handles open lazily in the process that reads, so the dataset can go to DataLoader workers
    under fork or spawn; per-record metadata lives in NumPy arrays, never Python lists.
    """

    def __init__(self, path: str | os.PathLike[str], transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[int], Any] | None = None, *,
                 image_size: int | tuple[int, int] | None = None, train: bool = True,
                 scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3),
                 resize_ratio: float = 0.875, decode_threads: int | None = None) -> None:
        self.root = Path(path)
        self.transform = transform
        self.target_transform = target_transform
        if image_size is not None and transform is not None:
            raise ValueError("pass either transform= (a PIL callable) or image_size= (the built-in "
                             "pipeline), not both")
        self.pipeline = (ImagePipeline(image_size, train, scale, ratio, resize_ratio)
                         if image_size is not None else None)
        if decode_threads is not None and decode_threads < 1:
            raise ValueError(f"decode_threads={decode_threads}: must be at least 1")
        self.decode_threads = decode_threads
        self._decoder: ThreadDecoder | None = None
        self._open()
        if self.pipeline is not None and self.manifest.kind != "images":
            raise ValueError(f"{self.root}: holds files that are not all images; the built-in "
                             "image pipeline (image_size=) needs an image dataset")

    def _open(self) -> None:
        self.manifest: Manifest = read_manifest(self.root)
        self.index = RecordIndex(self.root, self.manifest)
        self.reader: ShardReader = READERS[self.manifest.storage](self.root, self.manifest, self.index)

    def __getstate__(self) -> dict[str, Any]:
        # Spawned workers re-open from the directory instead of receiving pickled arrays.
        state = self.__dict__.copy()
        for name in ("manifest", "index", "reader", "_decoder"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._decoder = None
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

    def _key(self, key: int | SampleKey | tuple[int, int, int]) -> tuple[int, int, int]:
        """``(index, epoch, seed)``: from fastload's sampler as given (reproducible crops); for a
        plain index, the seed is drawn from torch's RNG, as torchvision's random transforms do."""
        if isinstance(key, tuple):
            index, epoch, seed = key
            return self._check(index), int(epoch), int(seed)
        seed = int(torch.randint(2**62, ())) if self.pipeline is not None and self.pipeline.train else 0
        return self._check(key), 0, seed

    def __getitem__(self, key: int | SampleKey) -> tuple[Any, Any]:
        if self.pipeline is not None:
            images, labels = collate_images(self.__getitems__([key]))
            label: Any = int(labels[0])
            return images[0], (self.target_transform(label) if self.target_transform else label)
        i = self._key(key)[0]
        image = self.payload(i, self.reader.read(i))
        label = int(self.index.label[i])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    def __getitems__(self, keys: list[int | SampleKey]) -> list[Any]:
        """A whole batch: one read pass, one decode pass (threads), one preallocated tensor.

        torch's DataLoader calls this instead of ``__getitem__`` once per sample.
        """
        parsed = [self._key(k) for k in keys]
        indices = [p[0] for p in parsed]
        payloads = self.reader.read_many(indices)
        if self.pipeline is None:
            return [self._finish(i, self.payload(i, data)) for i, data in zip(indices, payloads)]
        batch = decode_batch(self.pipeline, payloads, parsed, self.index.width[indices],
                             self.index.height[indices], self.index.label[indices],
                             self.decoder, self.reader.where)
        if self.target_transform is not None:
            return [(image, self.target_transform(label)) for image, label in batch]
        return batch

    def _finish(self, i: int, image: Any) -> tuple[Any, Any]:
        label: Any = int(self.index.label[i])
        if self.transform is not None:
            image = self.transform(image)
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    @property
    def decoder(self) -> ThreadDecoder:
        if self._decoder is None:
            threads = self.decode_threads
            if threads is None:
                in_worker = torch.utils.data.get_worker_info() is not None
                threads = 1 if in_worker else available_cpus()
            self._decoder = ThreadDecoder(threads)
        return self._decoder

    def payload(self, i: int, data: bytes) -> Any:
        """Record ``i`` as a sample: an RGB PIL image, or its bytes in a dataset of other files."""
        return self.load_image(i, data) if self.manifest.kind == "images" else data

    def load_image(self, i: int, data: bytes) -> Any:
        """Full decode to an RGB PIL image; damage raises CorruptRecordError naming the record."""
        return decode_rgb(data, where=self.reader.where(i))

    def __repr__(self) -> str:
        return (f"PackedDataset({str(self.root)!r}, records={len(self)}, classes={len(self.classes)}, "
                f"storage={self.manifest.storage!r})")
