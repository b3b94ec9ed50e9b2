"""The collate stage of cut masks: one batch tensor per field, each sample's mask cut into its slot.

The decode threads cut a sample's mask (a ``"mask-rows"`` or ``"mask"`` field through its crop)
straight into its row of the batch's tensor, as they decode its image into the image batch: the
batch's field is that tensor, with no per-sample tensor to allocate and no stack to copy them
into. The tensor is made when the batch's first mask knows its dtype (in shared memory in a worker).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

from fastload.samples.collate import new_batch_tensor


class FieldSlots:
    """Where a batch's cut masks go: field → an ``N×H×W`` tensor, sample ``k``'s mask in row ``k``.

    Args:
        indices: the batch's record indices, in its order. A record met twice in one batch gets
            no slot (its two crops may differ): its masks are tensors of their own, stacked.
        out_size: ``(height, width)`` of every cut.
    """

    def __init__(self, indices: Sequence[int], out_size: tuple[int, int]) -> None:
        counts = Counter(indices)
        self.position = {index: k for k, index in enumerate(indices) if counts[index] == 1}
        self.count, self.out_size = len(indices), out_size
        self.tensors: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()

    def slot_of(self, name: str, index: int) -> Callable[[torch.dtype], torch.Tensor | None]:
        """``out(dtype)`` for record ``index``'s cut of field ``name``: its slot, or None when it
        has none (a record met twice; a dtype other than the field's first mask's)."""
        return lambda dtype: self._slot(name, index, dtype)

    def _slot(self, name: str, index: int, dtype: torch.dtype) -> torch.Tensor | None:
        k = self.position.get(index)
        if k is None:
            return None
        tensor = self.tensors.get(name)
        if tensor is None:
            with self._lock:  # two decode threads may bring a batch's first masks at once
                tensor = self.tensors.get(name)
                if tensor is None:
                    tensor = self.tensors[name] = new_batch_tensor((self.count, *self.out_size), dtype)
        return tensor[k] if tensor.dtype == dtype else None

    def collated(self, name: str, values: list[Any]) -> torch.Tensor | None:
        """The field's batch tensor, when each of ``values`` (the batch's samples' values, none
        dropped) is still its own slot (a sample transform may have replaced one); else None."""
        tensor = self.tensors.get(name)
        if tensor is None or len(values) != self.count:
            return None
        start, step = tensor.data_ptr(), tensor.stride(0) * tensor.element_size()
        for k, value in enumerate(values):
            if not isinstance(value, torch.Tensor) or value.data_ptr() != start + k * step \
                    or value.dtype != tensor.dtype or value.shape != tensor.shape[1:] \
                    or value.stride() != tensor.stride()[1:]:
                return None
        return tensor
