"""Decode stage: a record decoded whole into the planes the pixel cache stores (its Y at the stored
size, Cb and Cr at half of it: fastload/pixels/layout.py), and the crops cut from stored planes.

A YCbCr or grey JPEG goes through the native fill (``fill_decode.c``): libjpeg's raw planes (no
upsampling, no colour conversion), decoded at 1/1 (1/2, 1/4, 1/8 where that still leaves the
stored size), every plane's rows shrunk as they leave the decoder with Pillow's bilinear filter in
14-bit fixed point, rows first (``fill_resize.c``). Anything else (CMYK and YCCK JPEGs, PNGs and
the other formats), and a JPEG the native code refuses, goes through
:func:`fastload.decode.crops.decode_crop` (Pillow decides what a bad record is) to RGB at the
stored size, then into planes (``fill_colour.c``: JFIF's YCbCr, each chroma sample the mean of
the 2 x 2 pixels it covers). A sample's crop from stored planes, in epoch 1 as in every later
one, is ``crop_planes_into`` (``fill_crop.c``): the same resize over the box's rows and columns
of each plane (Y to the output, Cb and Cr to half of it, then upsampled 2x as libjpeg's "fancy"
upsampling does), then RGB.
"""

from __future__ import annotations

import numpy as np

from fastload.decode.crops import REGION_DECODE, _ends_whole, decode_crop, draft_scale
from fastload.decode.transforms import CropPlan

try:
    from fastload.decode._jpeg_region import (
        RegionDecodeError, crop_planes_into, decode_planes_into, planes_from_rgb,
    )
except ImportError:  # not built: the pixel cache is off without it (fastload.pixels.cache)
    crop_planes_into = decode_planes_into = planes_from_rgb = None  # type: ignore[assignment]


def decode_stored(data: bytes, width: int, height: int, out: np.ndarray, stored: tuple[int, int], *,
                  where: str, max_pixels: int) -> np.ndarray:
    """``data`` (a ``width`` x ``height`` image) decoded whole into its planes at the ``stored``
    size ``(width, height)``, no larger than the image, in ``out`` (C-contiguous ``uint8``, the
    planes' bytes: :func:`fastload.pixels.layout.stored_bytes`).

    Raises:
        CorruptRecordError: as :func:`~fastload.decode.crops.decode_crop` does for the record.
    """
    stored_w, stored_h = stored
    if REGION_DECODE and data[:3] == b"\xff\xd8\xff" and _ends_whole(data):
        scale = draft_scale((0, 0, width, height), (stored_h, stored_w))
        try:
            decode_planes_into(data, scale, width, height, out, stored_w, stored_h, max_pixels)
            return out
        except (RegionDecodeError, OverflowError):  # OverflowError: a size from a damaged index
            pass  # Pillow's path says what is wrong with the record, or decodes what the fill does not read
    rgb = decode_crop(data, CropPlan((0, 0, width, height), (stored_h, stored_w)), where=where,
                      max_pixels=max_pixels)
    planes_from_rgb(np.ascontiguousarray(rgb), out)
    return out


def fill_method(native: bool = REGION_DECODE) -> str:
    """How stored planes are made, natively or (``FASTLOAD_JPEG_DECODER=pillow``) by Pillow alone;
    part of the pixel cache's key: planes made another way are another folder's."""
    others = "others: Pillow's RGB at the stored size, then planes (chroma 2 x 2 means, fill_colour.c)"
    if native:
        return ("YCbCr and grey JPEGs: raw planes, whole at the largest 1/1, 1/2, 1/4 or 1/8 scale that leaves "
                "the stored size, each plane through Pillow's bilinear filter in 14-bit fixed point, rows first "
                f"(fill_resize.c); {others}")
    return f"Pillow: whole at the largest 1/1, 1/2, 1/4 or 1/8 JPEG scale, then its resize; {others}"


def crop_stored(planes: np.ndarray, stored: tuple[int, int], plan: CropPlan, image_size: tuple[int, int],
                out: np.ndarray) -> None:
    """``plan`` (drawn on an image of ``image_size``) cut from its ``planes`` stored at ``stored``
    ``(width, height)``, into ``out`` (HWC uint8, any strides: a batch slot)."""
    (stored_w, stored_h), (width, height) = stored, image_size
    left, top, box_w, box_h = plan.box
    # Multiplied first: a box edge on the image's edge lands exactly on the stored pixels' edge.
    crop_planes_into(planes, stored_w, stored_h, left * stored_w / width, top * stored_h / height,
                     (left + box_w) * stored_w / width, (top + box_h) * stored_h / height, plan.crop_first,
                     plan.flip, out)
