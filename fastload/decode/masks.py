"""bytes → values: a mask stored as rows (fastload.format.mask_rows), only its crop's rows decoded."""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np
import torch

from fastload.decode.images import check_pixels
from fastload.decode.transforms import CropPlan
from fastload.errors import CorruptRecordError
from fastload.format.mask_rows import MaskRows, parse_mask_rows

# the loader's dtype for each stored element, as for a mask read from its image file: uint8 class
# ids as uint8, 16- and 32-bit integers as int32, floats as float32
_OUT = {"|u1": np.uint8, "<u2": np.int32, "<i4": np.int32, "<f4": np.float32}
_TORCH = {np.uint8: torch.uint8, np.int32: torch.int32, np.float32: torch.float32}

try:
    from fastload.decode._jpeg_region import mask_rows_into
except ImportError:  # built without a compiler or libjpeg's headers (see setup.py): cut in NumPy
    mask_rows_into = None


def read_mask_rows(data: bytes, *, where: str, max_pixels: int) -> MaskRows:
    """The stored mask in ``data``; CorruptRecordError naming ``where`` when it holds none, or one
    over ``max_pixels``."""
    try:
        mask = parse_mask_rows(data)
    except ValueError as exc:
        raise CorruptRecordError(f"{where}: not a readable stored mask ({exc}); re-pack the dataset") from None
    check_pixels(mask.width, mask.height, where=where, max_pixels=max_pixels)
    return mask


def decode_mask_rows(data: bytes, plan: CropPlan | None, *, where: str, max_pixels: int,
                     out: Callable[[torch.dtype], torch.Tensor | None] | None = None) -> torch.Tensor:
    """A stored mask as an ``H×W`` tensor (see fastload.samples.file_fields for its dtype), cut and
    scaled as ``plan`` cuts its image, nearest neighbour as Pillow cuts a mask file: only the rows
    under the crop's box are read. ``out(dtype)``: where to cut it, asked once its dtype is known
    (a slot of the batch's tensor), or None for a new tensor."""
    mask = read_mask_rows(data, where=where, max_pixels=max_pixels)
    out_dtype = _OUT[mask.element.str]
    if plan is None:
        return torch.from_numpy(np.array(rows_band(mask, 0, mask.height, where), dtype=out_dtype))
    dtype = _TORCH[out_dtype]
    target = out(dtype) if out is not None else None
    if target is None or tuple(target.shape) != plan.out_size:
        target = torch.empty(plan.out_size, dtype=dtype)
    cut_mask(mask, plan, target.numpy(), where)
    return target


def cut_mask(mask: MaskRows, plan: CropPlan, out: np.ndarray, where: str) -> None:
    """Cut ``plan`` from ``mask`` into ``out`` (``plan.out_size``, the mask's loader dtype), in C
    where the native module is built, else in NumPy (the same values: tests/decode/test_mask_cut.py)."""
    if mask_rows_into is None:
        cut_mask_numpy(mask, plan, out, where)
        return
    try:
        mask_rows_into(mask.values, mask.lengths, mask.row_starts, mask.width, mask.height, *plan.box,
                       mask.element.str == "<u2", plan.flip, out)
    except ValueError as exc:
        raise CorruptRecordError(f"{where}: {exc}; re-pack the dataset") from None


def cut_mask_numpy(mask: MaskRows, plan: CropPlan, out: np.ndarray, where: str) -> None:
    """:func:`cut_mask` in NumPy: the box's band of rows repeated out, then its pixels taken."""
    rows, cols = pillow_pixels(plan, mask.width, mask.height, per_pixel=mask.element.str == "<u2")
    first, last = int(rows[0]), int(rows[-1])  # rows only grow: the box's band, top to bottom
    band = rows_band(mask, first, last + 1, where)
    out[...] = band.take(rows - first, axis=0).take(cols, axis=1)  # two takes: 5x faster than one np.ix_ gather


def rows_band(mask: MaskRows, first: int, end: int, where: str) -> np.ndarray:
    """Rows ``first..end-1`` of ``mask`` as a (read-only when raw) ``(end - first) × width`` array."""
    width = mask.width
    if mask.row_starts is None:
        return mask.values[first * width:end * width].reshape(end - first, width)
    start, stop = int(mask.row_starts[first]), int(mask.row_starts[end])
    lengths = mask.lengths[start:stop]  # type: ignore[index]
    if not start <= stop <= len(mask.values) or int(lengths.sum(dtype=np.int64)) != (end - first) * width:
        raise CorruptRecordError(f"{where}: a stored mask whose rows {first}..{end - 1} are not {width} pixels "
                                 "each; re-pack the dataset")
    return np.repeat(mask.values[start:stop], lengths).reshape(end - first, width)


def pillow_pixels(plan: CropPlan, width: int, height: int, *, per_pixel: bool) -> tuple[np.ndarray, np.ndarray]:
    """For each output row and column of ``plan``, the source row and column whose pixel it shows,
    found as Pillow's nearest resize over the box finds them (the way a mask read from its file is
    cut), so that both give the same pixels: the box as C floats, the pixel under each output
    pixel's centre, its position stepped on from the last one (``per_pixel``: computed for each,
    as Pillow does for 16-bit images); mirrored with a flip."""
    left, top, box_w, box_h = plan.box
    out_h, out_w = plan.out_size
    rows = _positions(top, top + box_h, out_h, per_pixel).clip(0, height - 1)
    cols = _positions(left, left + box_w, out_w, per_pixel).clip(0, width - 1)
    return rows, cols[::-1] if plan.flip else cols


def _positions(start: float, end: float, out: int, per_pixel: bool) -> np.ndarray:
    low = np.float32(start)
    step = float(np.float32(end) - low) / out  # (double)(box[2] - box[0]) / xsize, box a float[4]
    if per_pixel:  # ImagingGenericTransform's affine_transform
        at = step * (np.arange(out) + 0.5) + float(low)
    else:  # ImagingScaleAffine: xo = a[2] + a[0] * 0.5, then xo += a[0] pixel after pixel
        steps = np.full(out, step)
        steps[0] = float(low) + step * 0.5
        at = np.cumsum(steps)  # a running sum, added in order as the C loop adds
    return np.where(at < 0, -1, at).astype(np.int64)  # COORD(): truncation


def mask_file(data: bytes, *, where: str, max_pixels: int) -> bytes:
    """A stored mask as an image file of its values: a PNG (8- and 16-bit) or a TIFF (32-bit, float)."""
    from PIL import Image

    mask = read_mask_rows(data, where=where, max_pixels=max_pixels)
    values = rows_band(mask, 0, mask.height, where)
    if mask.element.str == "<i4":
        values = values.astype("=i4")
    elif mask.element.str == "<f4":
        values = values.astype("=f4")
    img = Image.fromarray(np.ascontiguousarray(values))  # "L", "I;16", "I" or "F"
    buffer = io.BytesIO()
    img.save(buffer, "PNG" if mask.element.itemsize < 4 else "TIFF")
    return buffer.getvalue()
