"""Pin + device transfer: batches copied to the GPU on a side stream, one batch ahead, then normalised."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

_warned_no_cuda = False


def resolve_device(device: str | torch.device | None) -> torch.device | None:
    """The device batches are delivered on; ``cuda`` without CUDA falls back to CPU, said once."""
    global _warned_no_cuda
    if device is None:
        return None
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        if not _warned_no_cuda:
            warnings.warn("fastload: device='cuda' asked for, but CUDA is not available; batches "
                          "are delivered on the CPU and normalised there", stacklevel=3)
            _warned_no_cuda = True
        return torch.device("cpu")
    return device


def map_tensors(batch: Any, fn: Callable[[Any], Any], kind: type = torch.Tensor) -> Any:
    """Apply ``fn`` to every tensor (or other ``kind``) in a nested tuple/list/dict batch."""
    if isinstance(batch, kind):
        return fn(batch)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_tensors(b, fn, kind) for b in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_tensors(b, fn, kind) for b in batch)
    if isinstance(batch, dict):
        return {k: map_tensors(v, fn, kind) for k, v in batch.items()}
    return batch


class Normalizer:
    """``(x / 255 - mean) / std`` on uint8 ``N×C×H×W`` images, as one fused multiply-add in float32."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], image_at: int = 0) -> None:
        if len(mean) != len(std) or any(s <= 0 for s in std):
            raise ValueError(f"mean={list(mean)} and std={list(std)}: need equal lengths and std > 0")
        self.image_at = image_at  # the images' place in a tuple batch (fields= asked as tuples)
        self.scale = torch.tensor([1.0 / (255.0 * s) for s in std]).view(1, -1, 1, 1)
        self.shift = torch.tensor([-m / s for m, s in zip(mean, std)]).view(1, -1, 1, 1)
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, batch: Any) -> Any:
        """Normalise the batch's images when they are a uint8 image tensor (see ``on_images``)."""
        return on_images(batch, self.image_at, self._normalise)  # (a skip count was read before)

    def _normalise(self, images: torch.Tensor) -> torch.Tensor:
        if images.device not in self._on:
            self._on[images.device] = (self.scale.to(images.device), self.shift.to(images.device))
        scale, shift = self._on[images.device]
        return torch.addcmul(shift, images.float(), scale)


class ImageLayout:
    """The delivered images' dtype (``float16``/``bfloat16``: cast after ``mean``/``std``, which
    compute in float32) and memory format (``torch.channels_last``), on the device."""

    def __init__(self, dtype: torch.dtype | None, memory_format: torch.memory_format, image_at: int = 0,
                 normalised: bool = False) -> None:
        if dtype not in (None, torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"dtype={dtype}: choose torch.float32, torch.float16 or torch.bfloat16")
        if dtype is not None and not normalised:
            raise ValueError(f"dtype={dtype}: the images are delivered as uint8 unless mean and std are given; "
                             "dtype is what normalised images are delivered as: pass mean and std too")
        if memory_format not in (torch.contiguous_format, torch.channels_last):
            raise ValueError(f"memory_format={memory_format}: choose torch.contiguous_format or torch.channels_last")
        self.dtype, self.memory_format, self.image_at = dtype, memory_format, image_at

    def __call__(self, batch: Any) -> Any:
        return on_images(batch, self.image_at, self._convert, uint8_only=False)

    def _convert(self, images: torch.Tensor) -> torch.Tensor:
        if self.dtype is not None and images.is_floating_point():
            images = images.to(self.dtype)
        return images.contiguous(memory_format=self.memory_format)


def on_images(batch: Any, image_at: int, fn: Any, *, uint8_only: bool = True) -> Any:
    """``batch`` with ``fn`` applied to its N×C×H×W images: its first element, or its
    ``image_at``-th (a dict batch: its ``"image"``); anything else is returned as it is."""
    if isinstance(batch, dict) and isinstance(batch.get("image"), torch.Tensor):
        return {**batch, "image": on_images((batch["image"],), 0, fn, uint8_only=uint8_only)[0]}
    if image_at and isinstance(batch, tuple) and len(batch) > image_at:
        return (*batch[:image_at], on_images((batch[image_at],), 0, fn, uint8_only=uint8_only)[0],
                *batch[image_at + 1:])
    if not (isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], torch.Tensor)
            and batch[0].dim() == 4 and (batch[0].dtype == torch.uint8 or not uint8_only)):
        return batch
    out = fn(batch[0])
    return type(batch)([out, *batch[1:]]) if isinstance(batch, list) else (out, *batch[1:])


class DeviceFeed:
    """Batches delivered on ``device``; on CUDA the copy of batch k+1 overlaps the loop's use of k.

    An iterator object, not a generator: an error from the source (one batch's ``__getitem__``
    raised) is raised to the loop in its place, after the batch copied ahead of it, and the next
    ``next()`` carries on with the following batch, as torch's loader does.
    """

    def __init__(self, batches: Iterator[Any], device: torch.device | None,
                 normalizer: Normalizer | None) -> None:
        self.batches, self.device, self.normalizer = batches, device, normalizer
        self.stream = torch.cuda.Stream(device) if device is not None and device.type == "cuda" else None
        self.ahead: Any = None
        self.failed: BaseException | None = None  # the source's error, raised after ``ahead``

    def __iter__(self) -> DeviceFeed:
        return self

    def __next__(self) -> Any:
        if self.stream is None:
            batch = next(self.batches)
            if self.device is not None:
                batch = map_tensors(batch, lambda t: t.to(self.device))
            return self.normalizer(batch) if self.normalizer else batch
        if self.failed is not None:
            failed, self.failed = self.failed, None
            raise failed
        if self.ahead is None:
            self.ahead = self._start_copy(next(self.batches))
        current, self.ahead = self.ahead, None
        try:
            self.ahead = self._start_copy(next(self.batches))
        except StopIteration:
            pass
        except Exception as exc:  # noqa: BLE001 - raised in its own turn, after ``current``
            self.failed = exc
        return ready_on_loop_stream(current, self.stream)

    def _start_copy(self, batch: Any) -> Any:
        with torch.cuda.stream(self.stream):
            moved = map_tensors(batch, lambda t: t.to(self.device, non_blocking=True))
            return self.normalizer(moved) if self.normalizer else moved


def ready_on_loop_stream(batch: Any, stream: torch.cuda.Stream) -> Any:
    """Make the loop's stream wait for ``stream``'s work on ``batch`` (a copy, a decode), and keep
    the batch's memory alive for the loop's stream."""
    current = torch.cuda.current_stream(stream.device)
    current.wait_stream(stream)

    def keep(t: torch.Tensor) -> torch.Tensor:
        if t.is_cuda:
            t.record_stream(current)
        return t

    return map_tensors(batch, keep)
