"""Your own augmentations inside fastload's pipeline, reproducible however the work is split.

- ``sample_transform(sample, generator)`` runs in the decode threads (or workers) on each decoded
  sample: ``sample`` is ``{"image": uint8 3×H×W tensor, "label": int, "index": int}`` plus the
  dataset's ``fields=`` (a mask, boxes: after the crop), the image a view of its slot in the
  batch; it returns the sample (image of the same shape, uint8; the other fields as it left them).
- ``batch_transform(batch, generator)`` runs on each delivered ``(images, labels)`` batch, on the
  loader's device, after ``mean``/``std``; it returns the batch.

Each call gets a ``torch.Generator`` seeded from ``(seed, epoch, record index)`` (a sample) or
``(seed, epoch, position of the batch's first sample in the epoch)`` (a batch): results do not
depend on the number of workers or threads, and a resumed run draws what the first run drew.
See :mod:`fastload.augment` for ready-made ones (colour jitter, grayscale, mixup, cutmix).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fastload.sampling.order import rewound_rng

SampleTransform = Callable[[dict[str, Any], torch.Generator], dict[str, Any]]
BatchTransform = Callable[[Any, torch.Generator], Any]

_SAMPLE_STREAM = 0x5A17_E000_0000_0001 << 64  # other streams than the crop's for the same record
_BATCH_STREAM = 0xBA7C_E000_0000_0002 << 64


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """The generator a sample transform gets for record ``index`` in ``epoch``."""
    return _seeded(_SAMPLE_STREAM ^ seed, epoch, index, "cpu")


def batch_generator(seed: int, epoch: int, position: int, device: torch.device | str) -> torch.Generator:
    """The generator a batch transform gets for the batch starting at ``position`` of ``epoch``."""
    return _seeded(_BATCH_STREAM ^ seed, epoch, position, device)


def _seeded(stream: int, epoch: int, position: int, device: torch.device | str) -> torch.Generator:
    value = int(rewound_rng(stream, epoch, position).integers(2**63))
    return torch.Generator(device=device).manual_seed(value)


def apply_sample_transform(fn: SampleTransform, image: torch.Tensor, key: tuple[int, int, int], label: int,
                           where: str, values: dict[str, Any] | None = None) -> int:
    """Run ``fn`` on one decoded sample (``image``: its uint8 slot in the batch, written in place;
    ``values``: its other fields, replaced in place by what ``fn`` returns for them); returns its
    label (a transform may change it). Errors name the record."""
    index, epoch, seed = key
    sample = {**(values or {}), "image": image, "label": label, "index": index}
    try:
        out = fn(sample, sample_generator(seed, epoch, index))
    except Exception as exc:
        exc.add_note(f"fastload: raised by sample_transform on {where}")
        raise
    result = out.get("image") if isinstance(out, dict) else None
    if not isinstance(result, torch.Tensor) or result.shape != image.shape or result.dtype != torch.uint8:
        got = (f"a {type(out).__name__}" if not isinstance(out, dict) else
               f"'image' {type(result).__name__}" if not isinstance(result, torch.Tensor) else
               f"'image' {result.dtype} {tuple(result.shape)}")
        raise TypeError(f"{where}: sample_transform must return the sample dict with 'image' a uint8 tensor of "
                        f"shape {tuple(image.shape)} (the batch's slot); it returned {got}")
    if result.data_ptr() != image.data_ptr():
        image.copy_(result)
    if values:
        values.update({name: out[name] for name in values if name in out})
    return int(out.get("label", label))


def apply_batch_transform(fn: BatchTransform, batch: Any, seed: int, epoch: int | None, position: int) -> Any:
    """Run ``fn`` on one delivered batch with its generator (``epoch`` None: the loader has no
    fastload sampler, so the seed comes from torch's global generator, as torch's own random
    transforms draw theirs)."""
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    device = first.device if isinstance(first, torch.Tensor) else torch.device("cpu")
    if epoch is None:
        generator = torch.Generator(device=device).manual_seed(int(torch.randint(2**62, ())))
    else:
        generator = batch_generator(seed, epoch, position, device)
    try:
        return fn(batch, generator)
    except Exception as exc:
        exc.add_note(f"fastload: raised by batch_transform on the batch at position {position} of epoch "
                     f"{epoch if epoch is not None else '(not tracked)'}")
        raise


def apply_tensor_transform(fn: Callable[[torch.Tensor], Any], image: torch.Tensor, where: str) -> torch.Tensor:
    """``PackedDataset(transform=...)`` with ``image_size``: ``fn`` on one decoded uint8 3×H×W
    sample; what it returns must be a tensor. Errors name the record."""
    try:
        out = fn(image)
    except Exception as exc:
        exc.add_note(f"fastload: raised by transform on {where}")
        raise
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{where}: transform must return a tensor (it is given the decoded uint8 3×H×W "
                        f"image); it returned a {type(out).__name__}")
    return out


def stack_transformed(outputs: list[Any], where: Callable[[int], str], height: int, width: int) -> torch.Tensor:
    """The batch of what ``transform`` returned for each sample; samples of other shapes than the
    first's (or dtypes) are refused, naming the first such record (``where(position)``)."""
    if not outputs:
        return torch.empty((0, 3, height, width), dtype=torch.uint8)
    first = outputs[0]
    for j, out in enumerate(outputs):
        if out.shape != first.shape or out.dtype != first.dtype:
            raise ValueError(f"{where(j)}: transform returned {out.dtype} {tuple(out.shape)}, another sample of the "
                             f"batch {first.dtype} {tuple(first.shape)}; a batch stacks one shape and dtype: "
                             "end the transform with a fixed-size crop or resize")
    return torch.stack(outputs)

