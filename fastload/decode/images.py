"""Decode stage: record bytes to whole images with Pillow, once the pixel limits are checked.

Pillow's messages and rules decide what a bad record is; every failure to decode one is that
record's :class:`~fastload.errors.CorruptRecordError`. ``max_pixels`` is checked from the header,
before any pixel is decoded. Crops of a record: :mod:`fastload.decode.crops`.
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

from fastload.config import MAX_PIXELS
from fastload.errors import CorruptRecordError

# What Pillow raises for bytes it cannot read, each given a message saying at which step;
# anything else raised while decoding a record becomes its error too (_record_errors).
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, struct.error, zlib.error,
                  Image.DecompressionBombError)
_SIXTEEN_BIT = {"I;16", "I;16L", "I;16B", "I;16N"}


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
