"""User augmentation stage: several augmentations run in turn as one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class Compose:
    """Several transforms in turn, each given the same generator (so they draw one after another).

    Args:
        *transforms: Callables ``fn(data, generator) -> data``.
    """

    def __init__(self, *transforms: Callable[[Any, torch.Generator], Any]) -> None:
        for i, t in enumerate(transforms):
            if not callable(t):
                raise TypeError(f"Compose: transform {i} is not callable: {t!r}")
        self.transforms = transforms

    def __repr__(self) -> str:
        return f"Compose({', '.join(map(repr, self.transforms))})"

    def __call__(self, data: Any, generator: torch.Generator) -> Any:
        for t in self.transforms:
            data = t(data, generator)
        return data
