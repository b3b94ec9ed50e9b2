"""Decode stage: a record's crop straight to its output size; JPEGs decode only their box.

Two paths give the same pixels, to the bit. The native one (``fastload.decode._jpeg_region``, built
against the system's libjpeg-turbo) decodes only the rows and iMCU columns of a JPEG that the
crop's resize reads (and when the file's restart markers tile its rows, ``fastload pack
--restart-markers``, only the restart intervals under them), then resizes with Pillow's own
bilinear arithmetic straight into the batch tensor, the GIL released throughout. Pillow decodes
the whole image (:mod:`fastload.decode.images`): every other format, and any JPEG the native path
refuses, so Pillow's messages and rules decide what a bad record is; its pixels are then resized by
the same native code (or by Pillow where the module is not built). Both use libjpeg's 1/2, 1/4,
1/8 reduced-scale decode.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from fastload.config import MAX_PIXELS, region_decode_wanted
from fastload.decode.images import _load, _open, _record_errors, _subject, _to_rgb
from fastload.decode.transforms import CropPlan
from fastload.errors import CorruptRecordError

_JPEG_SCALES = (8, 4, 2, 1)
_JPEG_MAGIC = b"\xff\xd8\xff"
_TAIL = 64  # bytes searched for the end-of-image marker; padding after it is allowed

try:
    from fastload.decode._jpeg_region import RegionDecodeError, decode_crop_into, resize_into
except ImportError:  # built without a compiler or libjpeg's headers (see setup.py), or libjpeg is gone
    decode_crop_into = resize_into = None  # type: ignore[assignment]

REGION_DECODE = decode_crop_into is not None and region_decode_wanted()
"""Whether crops go through the native code: JPEGs decode only their box, and every crop is
resized natively (the module was built and ``FASTLOAD_JPEG_DECODER`` is not ``pillow``)."""


def jpeg_decoder() -> str:
    """Which decoder JPEG crops go through, in words, for reports."""
    if decode_crop_into is not None and not REGION_DECODE:
        return "Pillow, whole images (FASTLOAD_JPEG_DECODER=pillow)"
    if not REGION_DECODE:
        return ("Pillow, whole images: slower (fastload.decode._jpeg_region did not build or cannot load "
                "libjpeg: install gcc and libjpeg-dev, then reinstall fastload-torch from its source)")
    from fastload.decode._jpeg_region import LIBJPEG_TURBO_VERSION as v

    library = f"libjpeg-turbo {v // 1000000}.{v // 1000 % 1000}.{v % 1000}" if v else "libjpeg"
    return f"region decode ({library})"


def draft_scale(box: tuple[float, float, float, float], out_size: tuple[int, int]) -> int:
    """The largest JPEG reduction (8, 4, 2 or 1) that leaves the box at least ``out_size``.

    Args:
        box: ``(left, top, width, height)`` in original pixels.
        out_size: ``(height, width)`` wanted after the resize.
    """
    _, _, box_w, box_h = box
    out_h, out_w = out_size
    return next(s for s in _JPEG_SCALES if box_w / s >= out_w and box_h / s >= out_h or s == 1)


def _reduced(img: Image.Image, scale: int) -> int:
    """Ask libjpeg for a 1/``scale`` decode; returns the reduction it will actually apply."""
    width, height = img.size
    # MPO is what Pillow calls camera JPEGs with an embedded preview; it drafts the same.
    if scale == 1 or img.format not in ("JPEG", "MPO"):
        return 1
    # draft picks the largest s with W // request_w >= s (and same for H); W // s gives
    # exactly ``scale`` (never 2 * scale, since W // (W // s) < 2 * s).
    img.draft("RGB", (width // scale, height // scale))
    return next((s for s in _JPEG_SCALES if img.size == (-(-width // s), -(-height // s))), 1)


def decode_crop(
    data: bytes,
    plan: CropPlan,
    *,
    out: np.ndarray | None = None,
    where: str = "",
    max_pixels: int = MAX_PIXELS,
    draft: bool = True,
    region: bool = True,
    cut: bool = True,
    reducing_gap: float | None = None,
) -> np.ndarray:
    """Decode the plan's box straight to its output size: ``uint8`` ``H × W × 3`` (HWC).

    JPEGs are decoded at 1/2, 1/4 or 1/8 scale when the box still has at least the output
    resolution there (:func:`draft_scale`), and only the rows and columns the resize reads when
    the native decoder is built; then one bilinear (antialiased) resize, Pillow's, maps the box
    to ``plan.out_size``, then the optional flip. A train plan whose box has whole-pixel corners
    is cut out first (its edge pixels see only the box, as torchvision's ``resized_crop``);
    other boxes are resized in place (``Image.resize(box=)``).

    For collation, the cheapest target is one preallocated ``N × H × W × 3`` uint8 tensor:
    pass ``out=batch[i].numpy()`` (contiguous, one copy) and hand the loop
    ``batch.permute(0, 3, 1, 2)``, an ``N × 3 × H × W`` view in channels-last memory. A
    permuted ``3 × H × W`` slice (``chw.permute(1, 2, 0).numpy()``) also works, with a
    strided copy.

    Args:
        data: Encoded image bytes.
        plan: Box, output size and flip, from :class:`fastload.decode.transforms.TrainCrop` or
            :class:`~fastload.decode.transforms.EvalCrop`.
        out: Optional writable uint8 array of shape ``(H, W, 3)`` to fill and return.
        where: Prefix for error messages; the caller names shard, record and source path.
        max_pixels: Refuse larger images before decoding them.
        draft: Allow JPEG reduced-scale decode (False decodes full size; for comparisons).
        region: Decode only the box of a JPEG when the native decoder is built (False: Pillow
            decodes the whole image; the same pixels, for comparisons).
        cut: With ``region``, decode a JPEG whose restart markers tile its rows (``fastload
            pack --restart-markers``) from the restart intervals under the box alone (False:
            entropy-decode every row above the box too; the same pixels, for comparisons).
        reducing_gap: Resize with Pillow and this ``reducing_gap``; None (exact, and native
            when built) is the default because after a JPEG draft the remaining reduction is
            under 2× and a gap has no effect.

    Raises:
        CorruptRecordError: Unreadable, truncated or over-limit image, or any other failure to
            decode it (the record is at fault, never the caller).
    """
    out_h, out_w = plan.out_size
    if out is not None and (out.shape != (out_h, out_w, 3) or out.dtype != np.uint8):
        raise ValueError(
            f"out must be a uint8 array of shape {(out_h, out_w, 3)}, "
            f"got {out.dtype} {tuple(out.shape)}"
        )
    with _record_errors(data, where):
        return _decode_crop(data, plan, out, where, max_pixels, draft, region, cut, reducing_gap)


def _decode_crop(data: bytes, plan: CropPlan, out: np.ndarray | None, where: str, max_pixels: int,
                 draft: bool, region: bool, cut: bool, reducing_gap: float | None) -> np.ndarray:
    """:func:`decode_crop` once ``out`` is checked: every failure from here is the record's."""
    if (region and REGION_DECODE and reducing_gap is None and data[:3] == _JPEG_MAGIC
            and _ends_whole(data)):
        pixels = _decode_jpeg_box(data, plan, draft, cut, max_pixels, out)
        if pixels is not None:
            return pixels
    # Pillow: every other format, and JPEGs the native decoder refused (Pillow decides why).
    img = _open(data, where, max_pixels)
    left, top, box_w, box_h = plan.box
    if (left < 0 or top < 0 or left >= img.width or top >= img.height
            or left + box_w > img.width + 1 or top + box_h > img.height + 1):
        # The plan came from the index's width and height: they do not describe these bytes.
        raise CorruptRecordError(
            f"{_subject(where, data)}: the {img.format or 'image'} is {img.width}x{img.height}, too "
            f"small for the crop box {tuple(round(v, 1) for v in plan.box)} planned from the size in "
            "the index; the index does not match the record, re-pack the dataset"
        )
    scale = _reduced(img, draft_scale(plan.box, plan.out_size)) if draft else 1
    _load(img, data, where)
    # Now decoded at 1/scale: original pixel x lies at x / scale.
    if img.mode not in ("RGB", "L"):
        img = _to_rgb(img, data, where)
    # Clamp for float round-off at the right and bottom edges.
    box = _scaled_box(plan, scale, float(img.width), float(img.height))
    return _resize(img, box, plan, reducing_gap, out)


def _ends_whole(data: bytes) -> bool:
    """Whether an end-of-image marker is near the end: a JPEG cut short has none there.

    Entropy-coded data cannot hold ``FF D9``, so a file cut inside its scan fails this. Such a
    file goes to Pillow, which refuses it whatever the crop: without this check, a crop
    entirely above the cut would decode and the record would fail only in some epochs.
    """
    return data.find(b"\xff\xd9", max(0, len(data) - _TAIL)) >= 0


def _scaled_box(plan: CropPlan, scale: int, width: float, height: float) -> tuple[float, ...]:
    """The plan's box at 1/``scale``, as ``(x0, y0, x1, y1)``, clamped to ``width × height``."""
    left, top, box_w, box_h = plan.box
    return (max(0.0, left / scale), max(0.0, top / scale),
            min(width, (left + box_w) / scale), min(height, (top + box_h) / scale))


def _resize(img: Image.Image, box: tuple[float, ...], plan: CropPlan, reducing_gap: float | None,
            out: np.ndarray | None) -> np.ndarray:
    """``box`` of ``img`` (an RGB or L image) resized to the plan's output and flipped: HWC RGB,
    in ``out`` when given."""
    out_h, out_w = plan.out_size
    if REGION_DECODE and reducing_gap is None:
        target = np.empty((out_h, out_w, 3), np.uint8) if out is None else out
        resize_into(np.asarray(img), *box, plan.crop_first, plan.flip, target)
        return target
    if plan.crop_first and all(float(v).is_integer() for v in box):
        img = img.crop(tuple(int(v) for v in box)).resize((out_w, out_h), Image.BILINEAR,
                                                           reducing_gap=reducing_gap)
    else:
        img = img.resize((out_w, out_h), Image.BILINEAR, box=box, reducing_gap=reducing_gap)
    if plan.flip:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    pixels = np.asarray(img.convert("RGB") if img.mode == "L" else img)
    if out is None:
        return pixels
    np.copyto(out, pixels)
    return out


def _decode_jpeg_box(data: bytes, plan: CropPlan, draft: bool, cut: bool, max_pixels: int,
                     out: np.ndarray | None) -> np.ndarray | None:
    """The plan's crop of a JPEG through the native decoder; None: let Pillow's path do it.

    The native code decodes the rows and columns the resize reads (no more) and resizes with
    Pillow's weights, so the pixels are those of Pillow's path. It refuses anything libjpeg
    warns about and a box past the image's edge: Pillow's path then clamps round-off or says
    what is wrong.
    """
    left, top = plan.box[:2]
    if left < 0 or top < 0:
        return None
    scale = draft_scale(plan.box, plan.out_size) if draft else 1
    target = np.empty((*plan.out_size, 3), np.uint8) if out is None else out
    try:
        box = _scaled_box(plan, scale, math.inf, math.inf)  # clamped in C, once the size is known
        decode_crop_into(data, scale, *box, plan.crop_first, plan.flip, target, max_pixels, cut)
    except (RegionDecodeError, OverflowError):  # OverflowError: a box from a damaged index
        return None
    return target
