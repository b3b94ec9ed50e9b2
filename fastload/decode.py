"""Decode stage: record bytes to RGB pixels; JPEG crops decode only their box, at reduced scale.

Two decoders give the same pixels (for a box with fractional edges, within one level in under
1% of them: Pillow's filter weights round differently from a region's offset). The native one
(``fastload._jpeg_region``, built against the system's libjpeg-turbo) decodes a JPEG crop's rows
and iMCU columns only, and when the file's restart markers tile its rows (``fastload pack
--restart-markers``), only the restart intervals under the crop; Pillow decodes the whole image
(every other format, and any JPEG the native one refuses, so Pillow's messages and rules decide
what a bad record is). Both use libjpeg's 1/2, 1/4, 1/8 reduced-scale decode.
"""

from __future__ import annotations

import ctypes
import io
import math
import struct
import threading
import zlib
from typing import Any

import numpy as np
import torch
from PIL import Image

from fastload.config import MAX_PIXELS, region_decode_wanted
from fastload.errors import CorruptRecordError
from fastload.transforms import CropPlan


# What Pillow raises for bytes it cannot read; anything else is a bug and propagates.
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error,
                  Image.DecompressionBombError)
_JPEG_SCALES = (8, 4, 2, 1)
_SIXTEEN_BIT = {"I;16", "I;16L", "I;16B", "I;16N"}
_JPEG_MAGIC = b"\xff\xd8\xff"
_TAIL = 64  # bytes searched for the end-of-image marker; padding after it is allowed

try:
    from fastload._jpeg_region import RegionDecodeError, decode_region
except ImportError:  # built without a compiler or libjpeg's headers: see setup.py
    decode_region = None  # type: ignore[assignment]

REGION_DECODE = decode_region is not None and region_decode_wanted()
"""Whether JPEG crops decode only their box (the native decoder was built and
``FASTLOAD_JPEG_DECODER`` is not ``pillow``)."""


def jpeg_decoder() -> str:
    """Which decoder JPEG crops go through, in words, for reports."""
    if decode_region is not None and not REGION_DECODE:
        return "Pillow, whole images (FASTLOAD_JPEG_DECODER=pillow)"
    if not REGION_DECODE:
        return ("Pillow, whole images (fastload._jpeg_region is not built: install libjpeg-dev "
                "and a C compiler, then reinstall fastload)")
    from fastload._jpeg_region import LIBJPEG_TURBO_VERSION as v

    library = f"libjpeg-turbo {v // 1000000}.{v // 1000 % 1000}.{v % 1000}" if v else "libjpeg"
    return f"region decode ({library})"


def _subject(where: str, data: bytes) -> str:
    return where or f"{len(data)}-byte record"


def _open(data: bytes, where: str, max_pixels: int) -> Image.Image:
    """Header-only open; the pixel limit is checked before any pixel data is decoded."""
    try:
        img = Image.open(io.BytesIO(data))
    except Image.UnidentifiedImageError:
        raise CorruptRecordError(
            f"{_subject(where, data)}: not a readable image (cannot identify image file)"
        ) from None
    except Image.DecompressionBombError as exc:
        # Pillow's own limit (Image.MAX_IMAGE_PIXELS * 2) applies first, whatever max_pixels is.
        raise CorruptRecordError(f"{_subject(where, data)}: refused by Pillow ({exc})") from exc
    except _DECODE_ERRORS as exc:
        raise CorruptRecordError(
            f"{_subject(where, data)}: unreadable image header ({exc})"
        ) from exc
    check_pixels(*img.size, where=_subject(where, data), max_pixels=max_pixels)
    return img


def check_pixels(width: int, height: int, *, where: str, max_pixels: int) -> None:
    """Refuse an image over ``max_pixels`` (a possible decompression bomb) from its size alone."""
    if width * height > max_pixels:
        raise CorruptRecordError(
            f"{where}: {width}x{height} = {width * height} pixels is over the limit of "
            f"{max_pixels} (possible decompression bomb); raise max_pixels if you trust this data"
        )


def _load(img: Image.Image, data: bytes, where: str) -> None:
    try:
        img.load()
    except _DECODE_ERRORS as exc:
        raise CorruptRecordError(
            f"{_subject(where, data)}: {img.format or 'image'} data is corrupt or truncated ({exc})"
        ) from exc


def _to_rgb(img: Image.Image, data: bytes, where: str) -> Image.Image:
    """RGB with 8 bits per channel; alpha is dropped, as torchvision's loader does.

    16-bit grayscale keeps its top 8 bits. 32-bit ``I`` images follow Pillow (values clip
    at 255): their range is unknown, and scaling by content would vary per image.
    """
    if img.mode == "RGB":
        return img
    if img.mode in _SIXTEEN_BIT:
        # Pillow's convert clips 16-bit values at 255, which whitens the image; scale instead.
        wide = np.clip(np.asarray(img).astype(np.int64), 0, 65535) >> 8
        img = Image.fromarray(wide.astype(np.uint8), "L")
    try:
        return img.convert("RGB")
    except ValueError as exc:
        raise CorruptRecordError(
            f"{_subject(where, data)}: cannot convert {img.format or 'image'} mode "
            f"{img.mode!r} to RGB ({exc})"
        ) from exc


def image_size(data: bytes, *, where: str = "", max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """``(width, height)`` of an encoded image (Pillow order), read from its header only.

    Raises:
        CorruptRecordError: The bytes are not an image, or it is over ``max_pixels``.
    """
    return _open(data, where, max_pixels).size


def decode_rgb(data: bytes, *, where: str = "", max_pixels: int = MAX_PIXELS) -> Image.Image:
    """The whole image decoded to an RGB Pillow image (the torchvision-style path).

    Args:
        data: Encoded image bytes (any format Pillow reads).
        where: Prefix for error messages, e.g. ``"shard-00003 record 17 (cat/003.jpg)"``.
        max_pixels: Refuse larger images before decoding them.

    Raises:
        CorruptRecordError: Unreadable, truncated or over-limit image.
    """
    img = _open(data, where, max_pixels)
    _load(img, data, where)
    return _to_rgb(img, data, where)


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
    resolution there (:func:`draft_scale`), and only the box's rows and columns (plus the
    resize filter's reach) when the native decoder is built; then one bilinear (antialiased)
    resize maps the box to ``plan.out_size``, then the optional flip.

    For collation, the cheapest target is one preallocated ``N × H × W × 3`` uint8 tensor:
    pass ``out=batch[i].numpy()`` (contiguous, one copy) and hand the loop
    ``batch.permute(0, 3, 1, 2)``, an ``N × 3 × H × W`` view in channels-last memory. A
    permuted ``3 × H × W`` slice (``chw.permute(1, 2, 0).numpy()``) also works, with a
    strided copy.

    Args:
        data: Encoded image bytes.
        plan: Box, output size and flip, from :class:`fastload.transforms.TrainCrop` or
            :class:`~fastload.transforms.EvalCrop`.
        out: Optional writable uint8 array of shape ``(H, W, 3)`` to fill and return.
        where: Prefix for error messages; the caller names shard, record and source path.
        max_pixels: Refuse larger images before decoding them.
        draft: Allow JPEG reduced-scale decode (False decodes full size; for comparisons).
        region: Decode only the box of a JPEG when the native decoder is built (False: Pillow
            decodes the whole image; the same pixels, for comparisons).
        cut: With ``region``, decode a JPEG whose restart markers tile its rows (``fastload
            pack --restart-markers``) from the restart intervals under the box alone (False:
            entropy-decode every row above the box too; the same pixels, for comparisons).
        reducing_gap: Passed to ``Image.resize``; None (exact) is the default because after
            a JPEG draft the remaining reduction is under 2× and a gap has no effect.

    Raises:
        CorruptRecordError: Unreadable, truncated or over-limit image.
    """
    out_h, out_w = plan.out_size
    if out is not None and (out.shape != (out_h, out_w, 3) or out.dtype != np.uint8):
        raise ValueError(
            f"out must be a uint8 array of shape {(out_h, out_w, 3)}, "
            f"got {out.dtype} {tuple(out.shape)}"
        )
    if region and REGION_DECODE and data[:3] == _JPEG_MAGIC and _ends_whole(data):
        pixels = _decode_jpeg_box(data, plan, draft, cut, max_pixels, reducing_gap, out)
        if pixels is not None:
            return pixels
    # Pillow: every other format, and JPEGs the native decoder refused (Pillow decides why).
    img = _open(data, where, max_pixels)
    left, top, box_w, box_h = plan.box
    if left < 0 or top < 0 or left + box_w > img.width + 1 or top + box_h > img.height + 1:
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


def _whole(plan: CropPlan, box: tuple[float, ...]) -> bool:
    return plan.crop_first and all(float(v).is_integer() for v in box)


def _torch_resizes(plan: CropPlan, box: tuple[float, ...], reducing_gap: float | None) -> bool:
    """Whether ``box`` is cut out and resized with torch's kernel (:func:`_resize_whole_pixels`)."""
    return _whole(plan, box) and reducing_gap is None and _torch_on_one_core()


def _resize(img: Image.Image, box: tuple[float, ...], plan: CropPlan, reducing_gap: float | None,
            out: np.ndarray | None) -> np.ndarray:
    """``box`` of ``img`` (an RGB or L image) resized to the plan's output and flipped: HWC RGB,
    in ``out`` when given."""
    out_h, out_w = plan.out_size
    if _torch_resizes(plan, box, reducing_gap):
        return _resize_whole_pixels(np.array(img.crop(tuple(int(v) for v in box))), plan, out)
    if _whole(plan, box):  # cut out first here too: the torch kernel's edge rows, within rounding
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
                     reducing_gap: float | None, out: np.ndarray | None) -> np.ndarray | None:
    """The plan's crop of a JPEG through the native region decoder; None: let Pillow do it.

    A whole-pixel box cut out before resizing (train) decodes exactly its pixels, and gives
    the very pixels of the whole-image path. A fractional box, or one resized in place (eval),
    decodes a margin as wide as the resize filter reaches, so its edge rows are filtered with
    the same neighbours as from a whole image; Pillow's weights, computed from the box's
    offset in the region, differ in rounding: within one level, in under 1% of the pixels.
    """
    left, top = plan.box[:2]
    if left < 0 or top < 0:
        return None
    scale = draft_scale(plan.box, plan.out_size) if draft else 1
    x0, y0, x1, y1 = _scaled_box(plan, scale, math.inf, math.inf)  # clamped once the size is known
    out_h, out_w = plan.out_size
    # A bilinear filter shrinking by f reaches f source pixels beyond each output pixel's centre.
    reach = math.ceil(max((x1 - x0) / out_w, (y1 - y0) / out_h, 1.0)) + 1
    margin = 0 if _whole(plan, (x0, y0, x1, y1)) else reach
    try:
        buffer, rx, ry, rw, rh = decode_region(data, scale, max(0, math.floor(x0) - margin),
                                               max(0, math.floor(y0) - margin),
                                               math.ceil(x1) + margin, math.ceil(y1) + margin,
                                               max_pixels, cut)
    except (RegionDecodeError, OverflowError):  # OverflowError: a box from a damaged index
        return None
    if x1 > rx + rw + 1e-6 or y1 > ry + rh + 1e-6:
        return None  # the box reaches past the image: Pillow's path clamps round-off or says why
    region = np.frombuffer(buffer, dtype=np.uint8).reshape(rh, rw, 3)
    box = (x0 - rx, y0 - ry, min(x1 - rx, float(rw)), min(y1 - ry, float(rh)))
    if margin == 0 and _torch_resizes(plan, box, reducing_gap):
        return _resize_whole_pixels(region, plan, out)  # the region is the box: no crop copy
    return _resize(Image.fromarray(region, "RGB"), box, plan, reducing_gap, out)


_decode_thread = threading.local()


def _omp_setter() -> Any:
    """OpenMP's own ``omp_set_num_threads``, which changes the calling thread only (torch's
    ``set_num_threads`` also changes the default of every thread started later); None if absent."""
    try:
        return ctypes.CDLL(None).omp_set_num_threads
    except (OSError, AttributeError):
        return None


_set_omp_threads = _omp_setter()


def _torch_on_one_core() -> bool:
    """Whether torch kernels called from this thread run on one core.

    Decode threads run side by side, one image each; a torch kernel that fans out over every
    core from each of them burns twice the CPU for the same wall time (measured). So a decode
    thread of fastload's sets OpenMP to one thread for itself alone; no other thread's setting,
    nor torch's default for new threads, changes. The main thread is the user's and is left as
    it is: there the torch resize is used only when it is already single-threaded (as in a
    DataLoader worker process).
    """
    if threading.current_thread() is not threading.main_thread() and not getattr(_decode_thread, "single", False):
        _decode_thread.single = True
        torch.get_num_threads()  # torch's per-thread set-up first, so it cannot undo ours
        if _set_omp_threads is not None:
            _set_omp_threads(1)
    return torch.get_num_threads() == 1


def _resize_whole_pixels(region: np.ndarray, plan: CropPlan, out: np.ndarray | None) -> np.ndarray:
    """Resize a cut-out box (writable ``H × W`` or ``H × W × 3`` uint8) with torch's uint8
    antialiased bilinear kernel.

    Measured on ~450 px photos cropped to 224 (one core): 0.22 ms against 0.73 ms for Pillow's
    resize; inside the crop the pixels agree within 2 levels (mean difference 0.018), and the
    edge rows now see only the crop, as torchvision's ``resized_crop``. Train crops are whole
    pixels (as torchvision draws them) unless a reduced-scale decode divided them; fractional
    boxes, and eval plans, keep Pillow's ``resize(box=)``.
    """
    out_h, out_w = plan.out_size
    pixels = torch.from_numpy(region)
    chw = pixels.unsqueeze(0) if pixels.ndim == 2 else pixels.permute(2, 0, 1)
    if chw.shape[1:] != (out_h, out_w):
        chw = torch.nn.functional.interpolate(chw.unsqueeze(0), size=(out_h, out_w), mode="bilinear",
                                              antialias=True, align_corners=False)[0]
    if plan.flip:
        chw = chw.flip(-1)
    hwc = chw.permute(1, 2, 0).expand(out_h, out_w, 3)  # grey: one channel read three times
    if out is None:
        return hwc.contiguous().numpy()
    torch.from_numpy(out).copy_(hwc)
    return out
