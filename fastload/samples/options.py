"""PackedDataset's arguments, judged alone, together, and against what the dataset holds."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastload.decode.files import FileDecode, check_decode
from fastload.samples.user_transforms import SampleTransform


def check_options(*, on_error: str, transform: Callable[[Any], Any] | None,
                  target_transform: Callable[[int], Any] | None, image_size: int | tuple[int, int] | None,
                  sample_transform: SampleTransform | None, decode: FileDecode, decode_threads: int | None,
                  fields: Sequence[str] | None, pad_fields: Mapping[str, float] | None, boxes: str | None,
                  box_fields: Sequence[str], sample_as: str) -> None:
    """Refuse arguments that are wrong alone or together, before the dataset is opened."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error={on_error!r}: must be 'raise' or 'skip'")
    if transform is not None and not callable(transform):
        raise TypeError(f"transform={transform!r}: must be a callable")
    if sample_transform is not None and image_size is None:
        raise ValueError("sample_transform= runs on the built-in pipeline's decoded uint8 tensors: pass "
                         "image_size= too (with transform=, your callable already sees every sample)")
    if sample_transform is not None and not callable(sample_transform):
        raise TypeError(f"sample_transform={sample_transform!r}: must be a callable (sample, generator) -> sample")
    check_decode(decode)
    if decode_threads is not None and decode_threads < 1:
        raise ValueError(f"decode_threads={decode_threads}: must be at least 1")
    if sample_as not in ("dict", "tuple"):
        raise ValueError(f"sample_as={sample_as!r}: must be 'dict' or 'tuple'")
    if fields is None and (pad_fields or boxes or box_fields or sample_as != "dict"):
        raise ValueError("pad_fields=, boxes=, box_fields= and sample_as= are about samples with fields: "
                         "pass fields= too")
    if fields is not None and target_transform is not None:
        raise ValueError("fields= gives dict samples; target_transform= is for (image, label) samples: "
                         "change the 'label' entry in a sample_transform or batch_transform instead")


def check_kind(kind: str, root: object, *, image_pipeline: bool, decode: FileDecode) -> None:
    """Refuse the built-in image pipeline, or ``decode=``, for a dataset whose files (``kind``,
    from its manifest) they do not fit."""
    if image_pipeline and kind != "images":
        raise ValueError(f"{root}: holds files that are not all images; the built-in "
                         "image pipeline (image_size=) needs an image dataset")
    if decode != "bytes" and kind == "images":
        raise ValueError(f"decode={decode!r} is for datasets of other files; {root} holds images: "
                         "they decode with image_size= (or transform= on a PIL image)")
