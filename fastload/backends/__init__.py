"""Backends: interchangeable tails that turn the sampler's key batches into ``(images, labels)``."""

from __future__ import annotations

from typing import Any, Literal

from fastload.backends.dali import DaliBackend
from fastload.backends.nvimgcodec import NvImageCodecBackend

Backend = Literal["torch", "dali", "nvimgcodec"]

BACKENDS: dict[str, type[Any] | None] = {
    "torch": None,  # torch's own DataLoader iterator (workers or threads), the loader's base class
    "dali": DaliBackend,  # NVIDIA DALI decodes, resizes, flips and normalises (GPU or CPU)
    "nvimgcodec": NvImageCodecBackend,  # nvImageCodec decodes crop regions on the GPU, torch resamples
}

GPU_DECODE = ("dali", "nvimgcodec")
"""The backends that decode the batch themselves: no sample_transform, no fields= (dict samples)."""


def backend_class(name: str) -> type[Any] | None:
    """The tail registered as ``name`` (None: torch's own iterator); unknown names are refused."""
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(f"backend={name!r} is not a fastload backend; choose one of "
                         + ", ".join(repr(b) for b in BACKENDS))
    return BACKENDS[name]


__all__ = ["BACKENDS", "GPU_DECODE", "Backend", "DaliBackend", "NvImageCodecBackend", "backend_class"]
