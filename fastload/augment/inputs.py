"""User augmentation stage: a sample dict or an (images, labels) batch, its images out and back."""

from __future__ import annotations

from typing import Any

import torch


def _images_of(data: Any, name: str) -> tuple[torch.Tensor, bool]:
    """The images as N×3×H×W and whether ``data`` is a sample dict."""
    if isinstance(data, dict):
        image = data.get("image")
        if not isinstance(image, torch.Tensor) or image.dim() != 3 or image.shape[0] != 3:
            raise ValueError(f"{name}: the sample's 'image' must be a 3×H×W tensor, got "
                             f"{_describe(image)}")
        return image.unsqueeze(0), True
    if isinstance(data, (tuple, list)) and data and isinstance(data[0], torch.Tensor):
        images = data[0]
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"{name}: a batch's images must be N×3×H×W, "
                             f"got {_describe(images)}")
        return images, False
    raise TypeError(f"{name}: expected a sample dict {{'image', 'label', 'index'}} or an "
                    f"(images, labels) batch, got {type(data).__name__}")


def _replace(data: Any, images: torch.Tensor, is_sample: bool) -> Any:
    if is_sample:
        return {**data, "image": images[0]}
    return (images, *data[1:])


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _batch_only(data: Any, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(data, dict):
        raise TypeError(f"{name} is a batch transform: pass it as DataLoader(batch_transform=...), "
                        "not as PackedDataset(sample_transform=...) (it was given a sample dict)")
    if not isinstance(data, (tuple, list)) or len(data) < 2:
        raise TypeError(f"{name}: expected an (images, labels) batch, got {type(data).__name__}")
    images, _ = _images_of(data, name)
    return images, data[1]
