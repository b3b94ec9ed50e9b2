"""Backends: interchangeable tails that turn the sampler's key batches into ``(images, labels)``."""

from __future__ import annotations

from typing import Literal

from fastload.backends.dali import DaliBackend

Backend = Literal["torch", "dali"]

BACKENDS: dict[str, type[DaliBackend] | None] = {
    "torch": None,  # torch's own DataLoader iterator (workers or threads), the loader's base class
    "dali": DaliBackend,  # NVIDIA DALI decodes, resizes, flips and normalises (GPU or CPU)
}


def backend_class(name: str) -> type[DaliBackend] | None:
    """The tail registered as ``name`` (None: torch's own iterator); unknown names are refused."""
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(f"backend={name!r} is not a fastload backend; choose one of "
                         + ", ".join(repr(b) for b in BACKENDS))
    return BACKENDS[name]


__all__ = ["BACKENDS", "Backend", "DaliBackend", "backend_class"]
