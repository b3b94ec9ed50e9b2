"""The baseline users have today: a torchvision-style ImageFolder Dataset over small files.

Pillow opens each file, RandomResizedCrop 224 + horizontal flip, then a uint8 ``3×H×W`` tensor:
what ``torchvision.datasets.ImageFolder(root, transform=Compose([RandomResizedCrop(224),
RandomHorizontalFlip(), PILToTensor()]))`` does, without needing torchvision. Each step is a
method (``read`` → ``decode`` → ``transform``), so ``fastload doctor`` can time them apart and a
subclass can slow one down.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate

from fastload.decode.images import decode_rgb
from fastload.decode.transforms import TrainCrop


class ImageFolderBaseline(torch.utils.data.Dataset):
    """Small image files as ``(uint8 3×H×W tensor, label)`` samples, the torchvision way.

    Args:
        samples: ``(path, label)`` pairs in record order (``from_folder`` lists a folder).
        image_size: side of the RandomResizedCrop output.
        root: the folder they come from (for messages).
    """

    label = "ImageFolder"  # in row names: "torch ImageFolder, defaults"

    def __init__(self, samples: Sequence[tuple[str, int]], image_size: int = 224,
                 root: str | os.PathLike[str] | None = None) -> None:
        self.samples = [(str(p), int(label)) for p, label in samples]
        self.image_size = image_size
        self.root = Path(root) if root is not None else None
        self.crop = TrainCrop(image_size)

    @classmethod
    def from_folder(cls, root: str | os.PathLike[str], image_size: int = 224) -> ImageFolderBaseline:
        """Every image below ``root`` in ``fastload pack``'s record order (ImageFolder or flat)."""
        from fastload.converters.sources.folders import list_source

        listing = list_source(Path(root))
        return cls([(str(item.path), item.label) for item in listing.items], image_size, root)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def files(self) -> list[str]:
        return [path for path, _ in self.samples]

    def mean_size(self, at_most: int = 1000) -> float:
        """Mean file size in bytes, from at most ``at_most`` files spread over the list."""
        step = max(1, len(self.samples) // at_most)
        sizes = [os.stat(path).st_size for path, _ in self.samples[::step]]
        return float(np.mean(sizes)) if sizes else 0.0

    def read(self, i: int) -> bytes:
        """The file's bytes: one open/read/close per sample."""
        with open(self.samples[i][0], "rb") as f:
            return f.read()

    def decode(self, data: bytes) -> Image.Image:
        """Full-size decode to RGB, as ``PIL.Image.open(path).convert("RGB")``."""
        return decode_rgb(data)

    def transform(self, img: Image.Image) -> torch.Tensor:
        """RandomResizedCrop + flip on the decoded image, then a ``uint8`` CHW tensor."""
        plan = self.crop.sample(img.width, img.height, np.random.default_rng())
        left, top, w, h = plan.box
        size = (self.image_size, self.image_size)
        img = img.resize(size, Image.BILINEAR, box=(left, top, left + w, top + h))
        if plan.flip:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)

    def collate(self, samples: list[tuple[torch.Tensor, int]]) -> Any:
        """What torch's DataLoader does with them: ``default_collate`` stacks the tensors."""
        return default_collate(samples)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.decode(self.read(i))), self.samples[i][1]
