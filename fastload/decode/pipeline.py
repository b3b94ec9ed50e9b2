"""The decode stage of the built-in image pipeline: keys → crop plans → pixels in one batch tensor."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fastload.samples.collate import ImageBatch, new_image_batch
from fastload.decode.crops import decode_crop
from fastload.decode.images import MAX_PIXELS, image_size
from fastload.errors import CorruptRecordError
from fastload.sampling.order import rewound_rng
from fastload.decode.transforms import CropPlan, EvalCrop, TrainCrop
from fastload.samples.user_transforms import (
    SampleTransform, apply_sample_transform, apply_tensor_transform, stack_transformed,
)

if TYPE_CHECKING:
    from fastload.pixels.batch import BatchPixels


@dataclass(frozen=True)
class ImagePipeline:
    """ImageNet-style geometry without torchvision.

    ``train=True``: RandomResizedCrop(image_size, scale, ratio) + horizontal flip.
    ``train=False``: resize the shorter side to ``image_size / resize_ratio``, centre crop.
    Randomness comes from ``(seed, epoch, record index)`` only, so a record gets the same crop
    whatever the worker count or batch it lands in.
    """

    image_size: int | tuple[int, int] = 224
    train: bool = True
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    resize_ratio: float = 0.875

    geometry: TrainCrop | EvalCrop = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Built (and validated) once: plan() runs for every sample.
        geometry = (TrainCrop(self.image_size, scale=self.scale, ratio=self.ratio) if self.train
                    else EvalCrop(self.image_size, resize_ratio=self.resize_ratio))
        object.__setattr__(self, "geometry", geometry)

    @property
    def out_size(self) -> tuple[int, int]:
        size = self.image_size
        return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))

    def plan(self, index: int, epoch: int, seed: int, width: int, height: int) -> CropPlan:
        rng = rewound_rng(seed, epoch, index) if self.train else None
        return self.geometry.sample(width, height, rng)  # type: ignore[arg-type]

    def plan_record(self, payload: bytes, key: tuple[int, int, int], width: int, height: int, *,
                    where: str, max_pixels: int) -> tuple[CropPlan, int, int]:
        """The plan for one record, with the size it came from: the index's, or the header's when
        the index has none (-1: not measured at pack time; reading it checks ``max_pixels``)."""
        if width < 0:
            width, height = image_size(payload, where=where, max_pixels=max_pixels)
        index, epoch, seed = key
        return self.plan(index, epoch, seed, width, height), width, height


class ThreadDecoder:
    """Decodes a batch on a per-process thread pool (Pillow releases the GIL while decoding)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {"threads": self.threads, "_pool": None, "_pid": -1}

    def map(self, fn: Any, count: int) -> None:
        """Run ``fn(k)`` for every k in range(count), in threads when that can help; then
        re-raise the error of the lowest k that failed."""
        if self.threads <= 1 or count <= 1:
            for k in range(count):
                fn(k)
            return
        if self._pid != os.getpid() or self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="fastload-decode")
            self._pid = os.getpid()
        # One task per thread, each taking the next k as it gets free: a future per sample costs
        # a lock handshake with the GIL held, ~5 % of a core at a thousand samples a second.
        todo = itertools.count()  # next() on it is atomic under the GIL
        errors: dict[int, BaseException] = {}

        def drain() -> None:
            for k in todo:
                if k >= count:
                    return
                try:
                    fn(k)
                except BaseException as exc:  # noqa: BLE001 - every k runs, as a map would
                    errors[k] = exc

        for future in [self._pool.submit(drain) for _ in range(min(self.threads, count))]:
            future.result()
        if errors:
            raise errors[min(errors)]


def decode_batch(pipeline: ImagePipeline, read: Callable[[int], bytes],
                 keys: list[tuple[int, int, int]], widths: np.ndarray, heights: np.ndarray,
                 labels: np.ndarray, decoder: ThreadDecoder, where: Any, *,
                 max_pixels: int = MAX_PIXELS,
                 failed: dict[int, CorruptRecordError] | None = None,
                 sample_transform: SampleTransform | None = None,
                 values: Callable[[int, CropPlan, str], dict[str, Any]] | None = None,
                 tensor_transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 pixels: BatchPixels | None = None) -> ImageBatch:
    """Read (``read(record index)``) and decode records ``keys`` into one preallocated
    ``N×3×H×W`` uint8 batch.

    Each decode thread reads the record it decodes next: reads (``pread`` releases the GIL)
    overlap the other threads' decoding instead of all coming first, and a batch's payloads are
    never all held at once. A record that cannot be read or decoded raises CorruptRecordError
    naming it; with a ``failed`` dict, its error is put there under its position in ``keys``
    and the batch holds the others. ``sample_transform`` runs on each decoded sample in the same
    thread (see :mod:`fastload.samples.user_transforms`). ``values(index, plan, where)``: a sample's
    other fields (masks and boxes through its crop ``plan``), computed in the same thread, given
    to ``sample_transform`` with the image, and kept in the batch's ``samples``.
    ``tensor_transform(image) -> tensor`` runs last on each sample, in its thread; the batch's
    images are then what it returned, stacked. ``pixels``: the pixel cache's side of the batch
    (records it holds are cropped from their stored pixels, unread; others decoded whole, stored
    and cropped while it has room).
    """
    out_h, out_w = pipeline.out_size
    images = new_image_batch(len(keys), out_h, out_w)
    if sample_transform is not None:
        labels = np.array(labels, dtype=np.int64)  # a transform may change a sample's label
    samples: list[dict[str, Any]] = [{} for _ in keys]
    transformed: list[torch.Tensor | None] = [None] * len(keys)

    def crop(k: int, index: int, at: str, slot: np.ndarray) -> CropPlan:
        """Sample ``k``'s crop into its slot: from the pixel cache's stored pixels, else from its bytes."""
        if pixels is not None:
            plan = pixels.crop(k, lambda width, height: pipeline.plan(*keys[k], width, height), slot)
            if plan is not None:
                return plan
        payload = read(index)
        plan, width, height = pipeline.plan_record(payload, keys[k], int(widths[k]), int(heights[k]),
                                                   where=at, max_pixels=max_pixels)
        if pixels is None or not pixels.fill(k, index, payload, plan, (width, height), slot, where=at,
                                             max_pixels=max_pixels):
            decode_crop(payload, plan, out=slot, where=at, max_pixels=max_pixels)
        return plan

    def one(k: int) -> None:
        index = keys[k][0]
        try:
            at = where(index)
            # An HWC view of this sample's CHW slot: the decoder writes pixels straight into the batch.
            plan = crop(k, index, at, images[k].permute(1, 2, 0).numpy())
            if values is not None:
                samples[k] = values(index, plan, at)
            if sample_transform is not None:
                labels[k] = apply_sample_transform(sample_transform, images[k], keys[k], int(labels[k]), at,
                                                   samples[k])
            if tensor_transform is not None:
                transformed[k] = apply_tensor_transform(tensor_transform, images[k], at)
        except CorruptRecordError as exc:
            if failed is None:
                raise
            failed[k] = exc  # one key per thread: dict item assignment is atomic

    decoder.map(one, len(keys))
    labels_t = torch.as_tensor(labels, dtype=torch.int64)
    if failed:
        # The decoded samples, packed into a batch of their own (in shared memory in a worker).
        keep = torch.tensor([k for k in range(len(keys)) if k not in failed], dtype=torch.int64)
        kept = new_image_batch(len(keep), out_h, out_w)
        torch.index_select(images, 0, keep, out=kept)
        images, labels_t = kept, labels_t[keep]
        samples = [sample for k, sample in enumerate(samples) if k not in failed]
        transformed = [t for k, t in enumerate(transformed) if k not in failed]
    if tensor_transform is not None:
        kept_keys = [key for k, key in enumerate(keys) if not failed or k not in failed]
        images = stack_transformed(transformed, lambda j: where(kept_keys[j][0]), out_h, out_w)
    batch = ImageBatch(images, labels_t)
    batch.samples = samples
    return batch
