"""The collate stage: decoded samples already sit in one preallocated batch tensor."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate

from fastload.loading.batch_memory import recycled_uint8
from fastload.loading.transfer import map_tensors


class ImageBatch(list):
    """A list of ``(image, label)`` samples whose images are views of one ``N×3×H×W`` uint8 tensor.

    Any collate function sees an ordinary list of samples (torch's ``default_collate`` stacks them,
    one copy); :func:`collate_images` returns the preallocated tensors as they are, with no copy.
    ``skipped``: records ``on_error="skip"`` dropped from this batch (None: the dataset raises).
    ``pixel_counts``: ``(hits, misses, stored)`` of the dataset's pixel cache in this batch (None: it has none).
    """

    skipped: int | None = None
    pixel_counts: tuple[int, int, int] | None = None
    fields: dict[str, Any] | tuple[Any, ...] | None = None  # the batch's fields (PackedDataset(fields=...))
    samples: list[dict[str, Any]] | None = None  # each sample's fields before collation

    def __init__(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        super().__init__(zip(images, labels.tolist()))
        self.images = images
        self.labels = labels


def new_image_batch(count: int, height: int, width: int) -> torch.Tensor:
    """An uninitialised uint8 ``count×3×height×width`` batch (see :func:`new_batch_tensor`)."""
    return new_batch_tensor((count, 3, height, width))


def new_batch_tensor(shape: tuple[int, ...], dtype: torch.dtype = torch.uint8) -> torch.Tensor:
    """An uninitialised batch tensor; in a DataLoader worker it is made in shared memory, so
    handing it to the main process needs no copy; elsewhere in recycled memory (batch_memory)."""
    if torch.utils.data.get_worker_info() is None:
        size = torch.empty(0, dtype=dtype).element_size()
        memory = recycled_uint8((*shape[:-1], shape[-1] * size))  # bytes, seen as ``dtype`` below
        return memory if dtype == torch.uint8 else memory.view(dtype)
    # Straight into shared memory, as torch's default_collate does in a worker: share_memory_()
    # on a new tensor would also fault in private pages and copy them over (~7 ms a batch of
    # 64 images at 224 px, against ~3).
    elem = torch.empty(0, dtype=dtype)
    storage = elem._typed_storage()._new_shared(int(np.prod(shape)), device=elem.device)
    return elem.new(storage).resize_(shape)


def collate_field(dtype: str, values: list[Any], pad: float | None = None) -> Any:
    """One field of a batch, by its type (see fastload.format.layout): numbers as a tensor, text as
    a list of str, arrays stacked when they share a shape, else a list of tensors, or with ``pad``
    a ``(padded tensor, lengths)`` pair (``N×max×…``, filled with ``pad``)."""
    from fastload.format.layout import FILE_TYPES, array_type

    if dtype in ("str", "file"):
        return list(values)
    if dtype in FILE_TYPES:  # decoded files: tensors stacked when they share a shape, else a list
        same = all(isinstance(v, torch.Tensor) for v in values) and len({v.shape for v in values}) == 1
        return torch.stack(values) if same else list(values)
    kind = array_type(dtype)
    if kind is None:
        return torch.tensor(values, dtype={"float64": torch.float64, "bool": torch.bool}.get(dtype, torch.int64))
    arrays = [torch.from_numpy(np.array(v)) for v in values]  # copies: the index columns stay read-only
    if pad is None:
        same = len({tuple(a.shape) for a in arrays}) <= 1
        return torch.stack(arrays) if same and arrays else arrays
    lengths = torch.tensor([len(a) for a in arrays], dtype=torch.int64)
    if not arrays:
        return torch.zeros((0, 0, *kind[2]), dtype=torch.float64), lengths
    return torch.nn.utils.rnn.pad_sequence(arrays, batch_first=True, padding_value=pad), lengths


def collate_images(batch: Any) -> Any:
    """``(images uint8 N×3×H×W, labels int64 N)`` from an ImageBatch (with ``fields``: a dict of
    the fields asked, the images under ``"image"``); anything else as torch would.

    A batch from a dataset with ``on_error="skip"`` (or a pixel cache) comes out as a
    :class:`SkipCounted` tuple or list that also carries how many records were dropped from it
    (and the cache's counts; see :func:`keep_skips`).
    """
    skipped = skipped_in(batch)
    if isinstance(batch, ImageBatch) and batch.fields is not None:
        out: Any = batch.fields
    elif isinstance(batch, ImageBatch):
        out = (batch.images, batch.labels)
    elif skipped is not None and len(batch) == 0:
        out = []  # every record of this batch was skipped: nothing to collate
    else:
        out = default_collate(batch)
    return with_counts(out, batch)


# --- carrying on_error="skip" counts from the worker that skipped to loader.stats() ---------------
# The count rides inside the collated batch: it is pickled with it out of a worker process, kept
# when torch pins it (pin_memory below), and read by the loader before the batch goes to the device.
# The pixel cache's counts of the batch (hits, misses, stored) ride the same way.


def skipped_in(batch: Any) -> int | None:
    """Records dropped from ``batch`` by ``on_error="skip"``; None when it does not say."""
    skipped = getattr(batch, "skipped", None)
    return skipped if isinstance(skipped, int) else None


def pixels_in(batch: Any) -> tuple[int, int, int] | None:
    """The pixel cache's ``(hits, misses, stored)`` in ``batch``; None when it does not say."""
    pixels = getattr(batch, "pixel_counts", None)
    return pixels if isinstance(pixels, tuple) else None


def with_counts(out: Any, batch: Any) -> Any:
    """``out``, collated from ``batch``, carrying ``batch``'s counts (if it has any)."""
    skipped, pixels = skipped_in(batch), pixels_in(batch)
    if skipped is None and pixels is None:
        return out
    return with_skips(out, skipped or 0, pixels)


def _pin(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.pin_memory()


class SkipCounted:
    """Mixin of the batch containers below: ``skipped`` survives pickling and pinning."""

    skipped: int
    pixel_counts: tuple[int, int, int] | None
    _plain: type

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self._plain(self), self.skipped, self.pixel_counts)

    def pin_memory(self) -> Any:
        """Pinned copy, counts kept (torch's pin-memory thread calls this on custom batch types)."""
        return type(self)(map_tensors(self._plain(self), _pin), self.skipped, self.pixel_counts)


class SkipCountedTuple(SkipCounted, tuple):
    """A collated tuple batch, e.g. ``(images, labels)``, and how many records were skipped."""

    _plain = tuple

    def __new__(cls, items: Any = (), skipped: int = 0,
                pixels: tuple[int, int, int] | None = None) -> SkipCountedTuple:
        batch = super().__new__(cls, items)
        batch.skipped, batch.pixel_counts = skipped, pixels
        return batch


class SkipCountedList(SkipCounted, list):
    """A list of samples or a collated list batch, and how many records were skipped."""

    _plain = list

    def __init__(self, items: Any = (), skipped: int = 0, pixels: tuple[int, int, int] | None = None) -> None:
        super().__init__(items)
        self.skipped, self.pixel_counts = skipped, pixels


class SkipCountedDict(SkipCounted, dict):
    """A collated dict batch, and how many records were skipped."""

    _plain = dict

    def __init__(self, items: Any = (), skipped: int = 0, pixels: tuple[int, int, int] | None = None) -> None:
        super().__init__(items)
        self.skipped, self.pixel_counts = skipped, pixels


def with_skips(batch: Any, skipped: int, pixels: tuple[int, int, int] | None = None) -> Any:
    """``batch`` as a container that also carries ``skipped`` (and the pixel cache's counts)."""
    if isinstance(batch, tuple) and not hasattr(batch, "_fields"):
        return SkipCountedTuple(batch, skipped, pixels)
    if isinstance(batch, list):
        return SkipCountedList(batch, skipped, pixels)
    if isinstance(batch, dict):
        return SkipCountedDict(batch, skipped, pixels)
    raise TypeError(f"collate_fn returned a {type(batch).__name__}: with on_error='skip' a batch "
                    "must be a tuple, list or dict, so that it can carry its count of skipped records "
                    "to loader.stats(); return one of those")


class KeepSkips:
    """A collate_fn that runs ``collate_fn`` and keeps the batch's ``on_error="skip"`` count."""

    def __init__(self, collate_fn: Callable[[Any], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, batch: Any) -> Any:
        return with_counts(self.collate_fn(batch), batch)

    def __repr__(self) -> str:
        return f"keep_skips({self.collate_fn!r})"


def keep_skips(collate_fn: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    """The collate_fn a loader over an ``on_error="skip"`` dataset (or one with a pixel cache) uses:
    ``collate_fn`` (None: :func:`collate_images`) made to pass each batch's counts on to ``loader.stats()``."""
    if collate_fn is None or collate_fn is collate_images or isinstance(collate_fn, KeepSkips):
        return collate_fn or collate_images
    return KeepSkips(collate_fn)
