"""The collate stage: decoded samples already sit in one preallocated batch tensor."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import default_collate


class ImageBatch(list):
    """A list of ``(image, label)`` samples whose images are views of one ``N×3×H×W`` uint8 tensor.

    Any collate function sees an ordinary list of samples (torch's ``default_collate`` stacks them,
    one copy); :func:`collate_images` returns the preallocated tensors as they are, with no copy.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        super().__init__(zip(images, labels.tolist()))
        self.images = images
        self.labels = labels


def new_image_batch(count: int, height: int, width: int) -> torch.Tensor:
    """An uninitialised uint8 batch; in a DataLoader worker it is made in shared memory, so
    handing it to the main process needs no copy."""
    images = torch.empty((count, 3, height, width), dtype=torch.uint8)
    if torch.utils.data.get_worker_info() is not None:
        images.share_memory_()
    return images


def collate_images(batch: Any) -> Any:
    """``(images uint8 N×3×H×W, labels int64 N)`` from an ImageBatch; anything else as torch would."""
    if isinstance(batch, ImageBatch):
        return batch.images, batch.labels
    return default_collate(batch)
