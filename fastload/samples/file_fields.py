"""The decode stage of file fields (a record's mask, second image, array): through its image's crop.

A file field's type (fastload.format.layout) says how its bytes become a value:

- ``"mask"``: a one-channel image (class ids, a palette image's indices, 16-bit depth) as an
  ``H×W`` tensor whose values are kept: ``uint8``, or ``int32`` for 16- and 32-bit images,
  ``float32`` for floating-point ones. Through a crop each output pixel takes the nearest source
  pixel (never a blend of two class ids), so it lines up with the image's pixels.
- ``"mask-rows"``: a mask as a pack stores it by default (fastload.format.mask_rows): the same
  values, dtypes and pixels as ``"mask"``, but through a crop only the rows under its box are
  decoded (fastload.decode.masks), with no inflate of the whole file.
- ``"image"``: decoded like the record's image: ``uint8 3×H×W`` with the same crop and flip
  (without ``image_size``, an RGB PIL image, like the record's).
- ``"npy"``: a NumPy array as a tensor; one whose first two dimensions are the image's height and
  width (a depth map, a feature map) goes through the crop as a mask does.
- ``"file"``: the bytes as packed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from PIL import Image

from fastload.decode.crops import decode_crop
from fastload.decode.images import decode_as_stored, decode_rgb
from fastload.decode.files import decode_npy
from fastload.decode.masks import decode_mask_rows
from fastload.errors import CorruptRecordError
from fastload.format.layout import MASK_MODES
from fastload.decode.transforms import CropPlan

# a mask's values kept: 8-bit (and 1-bit, palette) modes as uint8, 16- and 32-bit integers as int32
_MASK_DTYPES = {mode: np.int32 if mode.startswith("I") else np.float32 if mode == "F" else np.uint8
                for mode in MASK_MODES}
_TORCH_DTYPES = {np.uint8: torch.uint8, np.int32: torch.int32, np.float32: torch.float32}


def decode_file_field(kind: str, data: bytes, plan: CropPlan | None, *, where: str, max_pixels: int,
                      out: Callable[[torch.dtype], torch.Tensor | None] | None = None) -> Any:
    """Record bytes of a file field of type ``kind`` as its value, moved by ``plan`` when given
    (give one only to a field the size of its image: the index has its width and height).
    ``out(dtype)``: where a mask's cut goes (a slot of its batch's tensor; see
    :class:`fastload.samples.field_slots.FieldSlots`); other kinds make tensors of their own."""
    if kind == "file":
        return data
    if kind == "npy":
        array = decode_npy(data, where)
        return array if plan is None else torch.from_numpy(_spatial(array.numpy(), plan))
    if kind == "image":
        if plan is None:
            return decode_rgb(data, where=where, max_pixels=max_pixels)
        pixels = np.empty((*plan.out_size, 3), dtype=np.uint8)
        decode_crop(data, plan, out=pixels, where=where, max_pixels=max_pixels)
        return torch.from_numpy(pixels).permute(2, 0, 1)
    if kind == "mask-rows":
        return decode_mask_rows(data, plan, where=where, max_pixels=max_pixels, out=out)
    img = decode_as_stored(data, where=where, max_pixels=max_pixels)
    dtype = _MASK_DTYPES.get(img.mode)
    if dtype is None:
        raise CorruptRecordError(f"{where}: is a {img.mode} image, not a one-channel mask; re-pack it")
    if plan is not None:
        # Pillow's nearest resize over the box picks the source pixel under each output pixel's
        # centre, as source_pixels does (equal on random plans: tests/samples/test_masks.py), 4x faster.
        left, top, width, height = plan.box
        img = img.resize(plan.out_size[::-1], Image.Resampling.NEAREST, box=(left, top, left + width, top + height))
        if plan.flip:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        target = out(_TORCH_DTYPES[dtype]) if out is not None else None
        if target is not None and tuple(target.shape) == plan.out_size:
            target.numpy()[...] = np.asarray(img, dtype=dtype)
            return target
    return torch.from_numpy(np.array(img, dtype=dtype))


def source_pixels(plan: CropPlan, width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """For each output row and column of ``plan``, the source row and column whose pixel it shows:
    the one under the output pixel's centre (nearest neighbour), mirrored with a flip."""
    left, top, box_w, box_h = plan.box
    out_h, out_w = plan.out_size
    cols = np.floor(left + (np.arange(out_w) + 0.5) * (box_w / out_w)).astype(np.int64).clip(0, width - 1)
    rows = np.floor(top + (np.arange(out_h) + 0.5) * (box_h / out_h)).astype(np.int64).clip(0, height - 1)
    return rows, cols[::-1] if plan.flip else cols


def _spatial(array: np.ndarray, plan: CropPlan) -> np.ndarray:
    """``array`` (``H×W…``) cut and scaled as ``plan`` cuts its image, nearest neighbour (a new array)."""
    rows, cols = source_pixels(plan, array.shape[1], array.shape[0])
    return array[rows[:, None], cols]
