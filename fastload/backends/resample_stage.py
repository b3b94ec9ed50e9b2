"""The resample stage of the GPU pipeline: a decoded batch's crops resampled on the resample stream
once the decode's event has passed, the records nvImageCodec did not take decoded by the torch
backend's CPU code into the same batch, labels added; an event marks the end.

Nothing here waits for the GPU: host memory the GPU reads is pinned, and what the GPU still
reads when the stage returns (nvImageCodec's images, the payload slot) is let go by
:class:`~fastload.backends.stream_events.Retiring` once its event has passed.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from fastload.backends.crop_resample import resample_into
from fastload.backends.decode_stage import Decoded
from fastload.backends.planned import PlannedBatch, batch_labels
from fastload.backends.stage_trace import NO_TRACE
from fastload.backends.stream_events import Retiring, in_stream, on_device, pinned, recorded
from fastload.decode.crops import decode_crop
from fastload.decode.pipeline import ThreadDecoder
from fastload.errors import CorruptRecordError
from fastload.loading.transfer import map_tensors


class Made(NamedTuple):
    """One batch's GPU part, ready once ``done`` has passed (None: now)."""

    images: torch.Tensor
    labels: Any
    skipped: int
    done: torch.cuda.Event | None


class ResampleStage:
    """Resamples one decoded batch at a time and decodes its rest on the CPU (the resample thread).

    Args:
        dataset: the PackedDataset.
        device: the loader's device.
        stream: the resample stream (None on the CPU).
        cpu: the threads that decode the records nvImageCodec did not take.
        retiring: where what the GPU still reads waits for its event.
    """

    def __init__(self, dataset: Any, device: torch.device, stream: torch.cuda.Stream | None, cpu: ThreadDecoder,
                 retiring: Retiring) -> None:
        self.dataset, self.device, self.stream = dataset, device, stream
        self.cpu, self.retiring = cpu, retiring
        self.trace: Any = NO_TRACE

    def __call__(self, decoded: Decoded) -> Made:
        batch = decoded.batch
        with on_device(self.device), self.trace.stage("resample", decoded.number), in_stream(self.stream):
            try:
                if decoded.done is not None and self.stream is not None:
                    self.stream.wait_event(decoded.done)
                out_h, out_w = self.dataset.pipeline.out_size
                images = torch.empty((len(batch.indices), 3, out_h, out_w), dtype=torch.uint8, device=self.device)
                resample_into(images, [image.pixels for image in decoded.images], decoded.chunks)
                taken = set(decoded.on_device)
                failed = self._decode_rest(batch, [k for k in range(len(batch.indices)) if k not in taken], images)
                if failed:
                    keep = torch.tensor([k for k in range(len(batch.indices)) if k not in failed], dtype=torch.long)
                    images = images.index_select(0, pinned(keep, self.device))
                labels = batch_labels(self.dataset, [i for k, i in enumerate(batch.indices) if k not in failed])
                labels = map_tensors(labels, lambda t: pinned(t, self.device))
            finally:
                done = recorded(self.stream)
                # nvImageCodec's images until the resample has read them; the slot until the decode has.
                self.retiring.add(done, keep=decoded.images)
                self.retiring.add(decoded.done, release=batch.lease.release if batch.lease is not None else None)
        errors = {batch.indices[k]: exc for k, exc in failed.items()} | batch.failed
        skipped = len(failed) + len(batch.failed)
        if skipped:
            self.dataset._count_skips(errors, skipped)
        return Made(images, labels, skipped, done)

    def _decode_rest(self, batch: PlannedBatch, ks: list[int], images: torch.Tensor) -> dict[int, CorruptRecordError]:
        """Decode records ``ks`` with the torch backend's CPU code into their slots of ``images``;
        returns the records that failed under ``on_error="skip"`` (else their error is raised)."""
        if not ks:
            return {}
        out_h, out_w = self.dataset.pipeline.out_size
        host = torch.empty((len(ks), out_h, out_w, 3), dtype=torch.uint8, pin_memory=self.device.type == "cuda")
        failed: dict[int, CorruptRecordError] = {}

        def one(j: int) -> None:
            k = ks[j]
            try:
                payload = batch.payloads[k]  # decode_crop searches bytes: a view of a worker's buffer is copied
                decode_crop(payload if isinstance(payload, bytes) else bytes(payload), batch.plans[k],
                            out=host[j].numpy(), where=batch.where(self.dataset, k), max_pixels=self.dataset.max_pixels)
            except CorruptRecordError as exc:
                if self.dataset.on_error != "skip":
                    raise
                failed[k] = exc

        self.cpu.map(one, len(ks))
        # Copied whole (channels last, as decoded), then put in place channels first on the device.
        slots = pinned(torch.tensor(ks, dtype=torch.long), self.device)
        images.index_copy_(0, slots, host.to(self.device, non_blocking=True).permute(0, 3, 1, 2))
        return failed
