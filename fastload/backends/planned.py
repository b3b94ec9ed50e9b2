"""The read + plan step every decoding tail shares: sampler keys → checked payloads, crop plans, labels.

A backend that decodes somewhere else (DALI, nvImageCodec) must make the same samples as the torch
backend: the same records, the same crop box and flip for each (drawn from ``(seed, epoch, index)``
by the dataset's own pipeline), the same labels. That is decided here, once, before a pixel is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import default_collate

from fastload.decode.images import check_pixels, over_limit
from fastload.decode.transforms import CropPlan
from fastload.errors import CorruptRecordError


@dataclass
class PlannedBatch:
    """One batch of records read and planned, nothing decoded yet.

    Attributes:
        indices: record indices, in the sampler's order.
        payloads: each record's encoded bytes (checked against its checksum); from a worker
            process, read-only views of the buffer it sent (:mod:`fastload.backends.planned_part`).
        plans: each record's crop box, output size and flip.
        sizes: each record's ``(width, height)``, from the index or its header.
        failed: records left out under ``on_error="skip"`` (their errors, by record index).
        lease: the payload slot ``payloads`` are views of (:class:`~fastload.backends.payload_slots.Lease`),
            to be released once nothing reads them; None when they are not in one.
    """

    indices: list[int]
    payloads: list[bytes] | list[memoryview]
    plans: list[CropPlan]
    sizes: list[tuple[int, int]]
    failed: dict[int, CorruptRecordError] = field(default_factory=dict)
    lease: Any = None

    def where(self, dataset: Any, k: int) -> str:
        """The k-th record named for an error message (shard, record, source path)."""
        return dataset.reader.where(self.indices[k])


def read_and_plan(dataset: Any, keys: Sequence[Any], *, skip: bool = False) -> PlannedBatch:
    """Read records ``keys`` (sampler keys or plain indices) and plan their crops.

    A record whose bytes fail their checksum, or whose size is over ``max_pixels``, raises
    CorruptRecordError naming it; with ``skip`` it is left out and its error kept in ``failed``
    (the caller counts it), so that the batch holds the others.
    """
    parsed = [dataset._key(k) for k in keys]
    failed: dict[int, CorruptRecordError] = {}
    indices = [p[0] for p in parsed]
    payloads = dataset._read_skipping(indices, failed) if skip else dataset.reader.read_many(indices)
    widths, heights = dataset.index.width[indices], dataset.index.height[indices]
    kept: list[int] = []
    plans, sizes = [], []
    for k, key in enumerate(parsed):
        if payloads[k] is None:
            continue
        # A record is named only for an error (or to read a size the index lacks): a batch plans
        # hundreds, and the name is a formatted string.
        where = dataset.reader.where(key[0]) if widths[k] < 0 else ""
        try:
            plan, width, height = dataset.pipeline.plan_record(
                payloads[k], key, int(widths[k]), int(heights[k]), where=where, max_pixels=dataset.max_pixels)
            # what decode refuses before decoding a pixel (a size from the index is unchecked so far)
            if width < 1 or height < 1 or over_limit(width, height, dataset.max_pixels) is not None:
                check_pixels(width, height, where=dataset.reader.where(key[0]), max_pixels=dataset.max_pixels)
        except CorruptRecordError as exc:
            if not skip:
                raise
            failed[key[0]] = exc
            continue
        kept.append(k)
        plans.append(plan)
        sizes.append((width, height))
    return PlannedBatch([indices[k] for k in kept], [payloads[k] for k in kept], plans, sizes, failed)


def batch_labels(dataset: Any, indices: Sequence[int]) -> Any:
    """The labels of records ``indices`` as the torch backend collates them: an int64 tensor, or
    what ``target_transform`` then ``default_collate`` make of them."""
    labels: Any = torch.as_tensor(dataset.index.label[list(indices)], dtype=torch.int64)
    if dataset.target_transform is not None:
        labels = default_collate([dataset.target_transform(int(y)) for y in labels.tolist()])
    return labels


def check_dataset(dataset: Any, backend: str, *, skip_ok: bool) -> None:
    """Refuse a dataset whose samples the ``backend`` tail would not make as the torch backend does."""
    from fastload.dataset import PackedDataset

    hint = ("use fastload.PackedDataset(path, image_size=..., train=...) (the built-in pipeline) "
            "or backend='torch'")
    if not isinstance(dataset, PackedDataset):
        raise ValueError(f"backend={backend!r}: the dataset is a {type(dataset).__name__}, which this "
                         f"backend cannot run; {hint}")
    if dataset.transform is not None:
        raise ValueError(f"backend={backend!r}: {dataset.root} has transform={dataset.transform!r}, a "
                         f"Python callable this backend cannot run; {hint}")
    if dataset.pipeline is None:
        raise ValueError(f"backend={backend!r}: {dataset.root} was opened without image_size, so it has "
                         f"no built-in image pipeline; {hint}")
    if dataset.on_error != "raise" and not skip_ok:
        raise ValueError(f"backend={backend!r}: {dataset.root} has on_error={dataset.on_error!r}, and "
                         "this backend cannot leave a damaged record out of a batch it is decoding; open "
                         "it with on_error='raise' or use backend='torch'")


def check_batching(backend: str, collate_fn: Any, batched: bool) -> None:
    """Refuse what a tail that builds whole ``(images, labels)`` batches itself cannot honour."""
    from fastload.samples.collate import collate_images

    if not batched:
        raise ValueError(f"backend={backend!r}: batch_size=None (no batching) is not supported; this "
                         "backend delivers whole batches, pass a batch_size")
    if collate_fn not in (None, collate_images):
        name = getattr(collate_fn, "__name__", collate_fn)
        raise ValueError(f"backend={backend!r}: collate_fn={name!r} cannot run, this backend builds the "
                         "(images, labels) batch itself; drop collate_fn or use backend='torch'")
