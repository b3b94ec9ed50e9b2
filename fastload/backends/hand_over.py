"""The training loop's end of the GPU pipeline: each batch handed over on the loop's stream.

With worker processes, a batch's CPU part (decoded by them, pinned by torch's pin-memory thread)
is copied to the GPU on a side stream as soon as it arrives, ahead of the loop; the GPU part comes
from the resample stage. The loop's stream waits on each part's event (the host does not), the
parts' memory is marked as used by that stream, and the two are joined in the sampler's order.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from fastload.backends.resample_stage import Made
from fastload.backends.stream_events import in_stream, on_device, recorded
from fastload.backends.worker_parts import FailedPart
from fastload.loading.transfer import Normalizer, map_tensors
from fastload.samples.collate import skipped_in, with_skips


class CopiedPart(NamedTuple):
    """A CPU part on the device, ready once ``done`` has passed (None: now)."""

    images: torch.Tensor
    labels: torch.Tensor
    skipped: int
    done: torch.cuda.Event | None


def copied(part: Any, device: torch.device, stream: torch.cuda.Stream | None) -> CopiedPart | FailedPart:
    """A worker's CPU part copied to ``device`` on ``stream`` (the copy thread calls this); a
    failed part as it is."""
    if isinstance(part, FailedPart):
        return part
    with on_device(device), in_stream(stream):
        images = part[0].to(device, non_blocking=True)
        labels = part[1].to(device, non_blocking=True)
        return CopiedPart(images, labels, skipped_in(part) or 0, recorded(stream))


def hand_over(device: torch.device, normalizer: Normalizer | None, made: Made | None,
              cpu_part: CopiedPart | None = None) -> Any:
    """The batch on the loop's stream: the CPU part, then the GPU part, normalised; with the count
    of records ``on_error="skip"`` left out."""
    parts = [p for p in (cpu_part, made) if p is not None]
    if device.type == "cuda":
        loop = torch.cuda.current_stream(device)
        for part in parts:
            if part.done is not None:
                loop.wait_event(part.done)
            map_tensors((part.images, part.labels), lambda t: t.record_stream(loop) if t.is_cuda else None)
    if len(parts) == 1:
        images, labels = parts[0].images, parts[0].labels
    else:
        images, labels = torch.cat([p.images for p in parts]), torch.cat([p.labels for p in parts])
    if normalizer is not None:
        images = normalizer((images,))[0]
    skipped = sum(p.skipped for p in parts)
    batch: Any = (images, labels)
    return with_skips(batch, skipped) if skipped else batch
