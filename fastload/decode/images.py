"""Decode stage: record bytes to RGB pixels; JPEG crops decode only their box, at reduced scale.

Two paths give the same pixels, to the bit. The native one (``fastload.decode._jpeg_region``, built
against the system's libjpeg-turbo) decodes only the rows and iMCU columns of a JPEG that the
crop's resize reads (and when the file's restart markers tile its rows, ``fastload pack
--restart-markers``, only the restart intervals under them), then resizes with Pillow's own
bilinear arithmetic straight into the batch tensor, the GIL released throughout. Pillow decodes
the whole image: every other format, and any JPEG the native path refuses, so Pillow's messages
and rules decide what a bad record is; its pixels are then resized by the same native code (or by
Pillow where the module is not built). Both use libjpeg's 1/2, 1/4, 1/8 reduced-scale decode.
"""

from __future__ import annotations

import io
import math
import operator
import struct
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from PIL import Image

from fastload.config import MAX_PIXELS, region_decode_wanted
from fastload.errors import CorruptRecordError
from fastload.decode.transforms import CropPlan


# What Pillow raises for bytes it cannot read, each given a message saying at which step;
# anything else raised while decoding a record becomes its error too (_record_errors).
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error,
                  Image.DecompressionBombError)
_JPEG_SCALES = (8, 4, 2, 1)
_SIXTEEN_BIT = {"I;16", "I;16L", "I;16B", "I;16N"}
_JPEG_MAGIC = b"\xff\xd8\xff"
_TAIL = 64  # bytes searched for the end-of-image marker; padding after it is allowed

try:
    from fastload.decode._jpeg_region import RegionDecodeError, decode_crop_into, resize_into
except ImportError:  # built without a compiler or libjpeg's headers: see setup.py
    decode_crop_into = resize_into = None  # type: ignore[assignment]

REGION_DECODE = decode_crop_into is not None and region_decode_wanted()
"""Whether crops go through the native code: JPEGs decode only their box, and every crop is
resized natively (the module was built and ``FASTLOAD_JPEG_DECODER`` is not ``pillow``)."""


def jpeg_decoder() -> str:
    """Which decoder JPEG crops go through, in words, for reports."""
    if decode_crop_into is not None and not REGION_DECODE:
        return "Pillow, whole images (FASTLOAD_JPEG_DECODER=pillow)"
    if not REGION_DECODE:
        return ("Pillow, whole images (fastload.decode._jpeg_region is not built: install libjpeg-dev "
                "and a C compiler, then reinstall fastload)")
    from fastload.decode._jpeg_region import LIBJPEG_TURBO_VERSION as v

    library = f"libjpeg-turbo {v // 1000000}.{v // 1000 % 1000}.{v % 1000}" if v else "libjpeg"
    return f"region decode ({library})"


def _subject(where: str, data: bytes) -> str:
    return where or f"{len(data)}-byte record"


def pixel_limit(value: object, name: str = "max_pixels") -> int:
    """``value`` as a pixel count: a positive whole number (an integral float, ``5e8``, too)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    try:
        count = -1 if isinstance(value, bool) else operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        count = -1
    if count < 1:
        raise ValueError(f"{name}={value!r}: must be a positive integer (a whole number of pixels, "
                         "such as 500_000_000 or 5e8)")
    return count


_pillow_limit = threading.Lock()


def allow_in_pillow(max_pixels: int) -> None:
    """Raise Pillow's process-wide bomb limit so that it never refuses what ``max_pixels`` allows
    (``fastload pack --max-pixels`` calls this too).

    Pillow has no per-call limit, only ``Image.MAX_IMAGE_PIXELS`` (an error above twice it, a
    warning above it). It is only ever raised here, under a lock, to half the largest
    ``max_pixels`` asked for (Pillow's own warn-at-half relation), never lowered: a thread
    decoding for another dataset always finds it at least as high as it needs. Each caller's own
    limit is then applied by :func:`check_pixels` right after the header is read, before any pixel
    is decoded, so the dataset's ``max_pixels`` is the one limit that decides.
    """
    limit = Image.MAX_IMAGE_PIXELS
    if limit is None or 2 * limit >= max_pixels:
        return
    with _pillow_limit:
        limit = Image.MAX_IMAGE_PIXELS
        if limit is not None and 2 * limit < max_pixels:
            # An int, as Pillow's own: max_pixels may come as 5e8; infinity turns the check off.
            Image.MAX_IMAGE_PIXELS = -(-int(max_pixels) // 2) if math.isfinite(max_pixels) else None


@contextmanager
def _record_errors(data: bytes, where: str) -> Iterator[None]:
    """Every failure to decode one record is that record's error (``on_error="skip"`` counts it).

    Pillow's usual errors get their own messages below; anything else it (or the native code)
    raises on bytes it cannot handle is named here, its type kept in the message and the chain.
    MemoryError is not: running out of memory says nothing about the record.
    """
    try:
        yield
    except (CorruptRecordError, MemoryError):
        raise
    except Exception as exc:
        raise CorruptRecordError(
            f"{_subject(where, data)}: cannot be decoded ({type(exc).__name__}: {exc})"
        ) from exc


def _open(data: bytes, where: str, max_pixels: int) -> Image.Image:
    """Header-only open; the pixel limit is checked before any pixel data is decoded."""
    allow_in_pillow(max_pixels)
    try:
        img = Image.open(io.BytesIO(data))
    except Image.UnidentifiedImageError:
        raise CorruptRecordError(
            f"{_subject(where, data)}: not a readable image (cannot identify image file)"
        ) from None
    except Image.DecompressionBombError as exc:
        # Pillow refuses over twice its limit, kept >= max_pixels by allow_in_pillow: over ours too.
        raise CorruptRecordError(
            f"{_subject(where, data)}: over the limit of {max_pixels} pixels, refused by Pillow as "
            f"a possible decompression bomb ({exc}); raise max_pixels if you trust this data"
        ) from exc
    except _DECODE_ERRORS as exc:
        raise CorruptRecordError(
            f"{_subject(where, data)}: unreadable image header ({exc})"
        ) from exc
    check_pixels(*img.size, where=_subject(where, data), max_pixels=max_pixels)
    return img


MIN_ROW_PIXELS = 4
"""A decoded row counts as at least this many pixels: Pillow keeps an 8-byte pointer per row beside
4 bytes per pixel, so a thin image's rows are what cost. Measured: a 1 x 10,000,000 px PNG takes
203 MB to decode to RGB, a 3,163 x 3,162 one 50 MB (4 x). A 1 x 170,000,000 px image counts as 680
million pixels; one at least 4 pixels wide counts as its pixels."""


def decode_cost(width: int, height: int) -> int:
    """The pixels an image of this size costs to decode, for the ``max_pixels`` bound."""
    return max(width, MIN_ROW_PIXELS) * height


def over_limit(width: int, height: int, max_pixels: int) -> str | None:
    """The size of an image over ``max_pixels`` in words (``WxH = N pixels``, with what its rows
    cost when they are what puts it over), or None when it is within."""
    if decode_cost(width, height) <= max_pixels:
        return None
    rows = ("" if width * height > max_pixels else f", which cost as much to decode as "
            f"{decode_cost(width, height)} (a row counts as at least {MIN_ROW_PIXELS} pixels),")
    return f"{width}x{height} = {width * height} pixels{rows}"


def check_pixels(width: int, height: int, *, where: str, max_pixels: int) -> None:
    """Refuse an image over ``max_pixels`` (a possible decompression bomb; a very thin image's rows
    count, see decode_cost), or under 1x1, from its size alone."""
    if width < 1 or height < 1:
        raise CorruptRecordError(
            f"{where}: the image is {width}x{height} pixels; an image is at least 1x1, "
            "re-pack the dataset"
        )
    if (why := over_limit(width, height, max_pixels)) is not None:
        raise CorruptRecordError(
            f"{where}: {why} is over the limit of {max_pixels} (possible decompression bomb); "
            "raise max_pixels if you trust this data"
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
    with _record_errors(data, where):
        return _open(data, where, max_pixels).size


def decode_as_stored(data: bytes, *, where: str = "", max_pixels: int = MAX_PIXELS) -> Image.Image:
    """The whole image decoded in its own mode (a mask's class ids stay as stored); errors as
    :func:`decode_rgb`'s."""
    with _record_errors(data, where):
        img = _open(data, where, max_pixels)
        _load(img, data, where)
        return img


def decode_rgb(data: bytes, *, where: str = "", max_pixels: int = MAX_PIXELS) -> Image.Image:
    """The whole image decoded to an RGB Pillow image (the torchvision-style path).

    Args:
        data: Encoded image bytes (any format Pillow reads).
        where: Prefix for error messages, e.g. ``"shard-00003 record 17 (cat/003.jpg)"``.
        max_pixels: Refuse larger images before decoding them.

    Raises:
        CorruptRecordError: Unreadable, truncated or over-limit image.
    """
    with _record_errors(data, where):
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
