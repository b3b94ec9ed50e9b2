"""Decode stage: a record decoded whole and shrunk to the size the pixel cache stores it at, and
the crops cut from stored pixels.

A JPEG goes through the native fill (``fill_decode.c``): decoded at 1/1 (1/2, 1/4, 1/8 where that
still leaves the stored size), every row shrunk as it leaves the decoder, with Pillow's bilinear
filter in 14-bit fixed point, rows first (``fill_resize.c``). Anything else, and a JPEG the native
code refuses, goes through :func:`fastload.decode.crops.decode_crop` (Pillow decides what a bad
record is); its pixels are Pillow's resize, within a level of the native fill's. A sample's crop
from stored pixels, in epoch 1 as in every later one, is ``crop_stored_into`` (``fill_crop.c``):
the same resize, reading only the box's rows and columns.
"""

from __future__ import annotations

import numpy as np

from fastload.decode.crops import REGION_DECODE, _ends_whole, decode_crop, draft_scale
from fastload.decode.transforms import CropPlan

try:
    from fastload.decode._jpeg_region import RegionDecodeError, crop_stored_into, decode_stored_into
except ImportError:  # not built: the pixel cache is off without it (fastload.pixels.cache)
    crop_stored_into = decode_stored_into = None  # type: ignore[assignment]


def decode_stored(data: bytes, width: int, height: int, out: np.ndarray, *, where: str,
                  max_pixels: int) -> np.ndarray:
    """``data`` (a ``width`` x ``height`` image) decoded whole and shrunk into ``out``, a
    C-contiguous ``uint8`` array ``(stored height, stored width, 3)`` no larger than the image.

    Raises:
        CorruptRecordError: as :func:`~fastload.decode.crops.decode_crop` does for the record.
    """
    stored_h, stored_w = out.shape[:2]
    if REGION_DECODE and data[:3] == b"\xff\xd8\xff" and _ends_whole(data):
        scale = draft_scale((0, 0, width, height), (stored_h, stored_w))
        try:
            decode_stored_into(data, scale, width, height, out, max_pixels)
            return out
        except (RegionDecodeError, OverflowError):  # OverflowError: a size from a damaged index
            pass  # Pillow's path says what is wrong with the record, or decodes what libjpeg would not
    return decode_crop(data, CropPlan((0, 0, width, height), (stored_h, stored_w)), out=out, where=where,
                       max_pixels=max_pixels)


def fill_method(native: bool = REGION_DECODE) -> str:
    """How stored pixels are made, natively or (``FASTLOAD_JPEG_DECODER=pillow``) by Pillow alone;
    part of the pixel cache's key: pixels made another way are another folder's."""
    if native:
        return ("JPEG: whole at the largest 1/1, 1/2, 1/4 or 1/8 scale that leaves the stored size, then "
                "Pillow's bilinear filter in 14-bit fixed point, rows first (fill_resize.c); others: Pillow's")
    return "Pillow: whole at the largest 1/1, 1/2, 1/4 or 1/8 JPEG scale, then its resize"
