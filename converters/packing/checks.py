"""Per-file validation before packing: every rejected file gets a reason string."""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image

from fastload.converters.packing.headers import JPEG_SOI, PNG_SIGNATURE, BadHeader, jpeg_header, png_header
from fastload.config import MAX_PIXELS
from fastload.decode.images import allow_in_pillow, over_limit

MAX_SIDE = 2**31 - 1
"""Largest width or height packed: the index stores them as int32 (PNG's own limit, too)."""


class InvalidFile(Exception):
    """A file that cannot be packed; ``reason`` says why in words a user can act on."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ImageHeader:
    """What the header says: format and pixel size (-1 for non-images)."""

    format: str
    width: int
    height: int


# Formats whose structure we walk ourselves: size and completeness in microseconds, no Pillow.
_WALKERS = ((JPEG_SOI, "JPEG", jpeg_header), (PNG_SIGNATURE, "PNG", png_header))


def check_image(data: bytes, *, decode: bool = False, max_pixels: int = MAX_PIXELS) -> ImageHeader:
    """Check that ``data`` is a whole image; raise InvalidFile naming what is wrong.

    JPEG and PNG: the header and the file's structure up to its end marker are walked without
    decoding pixels; other formats: Pillow reads the header. ``decode=True`` also decodes every pixel.
    """
    if not data:
        raise InvalidFile("empty file (0 bytes)")
    allow_in_pillow(max_pixels)  # max_pixels, not Pillow's process-wide default, is the limit
    img = None
    for magic, fmt, walk in _WALKERS:
        if data.startswith(magic):
            try:
                size = walk(data)
            except BadHeader as exc:
                raise InvalidFile(str(exc)) from None
            width, height = size.width, size.height
            break
    else:
        img, fmt, width, height = _open(data)
    _check_side(fmt, "width", width)
    _check_side(fmt, "height", height)
    _check_pixels(width, height, max_pixels)
    if decode:
        img = img or _open(data)[0]
        _check_pixels(*img.size, max_pixels)  # what Pillow will decode, if its reading differs
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                img.load()
        except Exception as exc:
            raise InvalidFile(f"image does not decode ({_short(exc)})") from None
    return ImageHeader(fmt, width, height)


def _check_pixels(width: int, height: int, max_pixels: int) -> None:
    if (why := over_limit(width, height, max_pixels)) is not None:
        raise InvalidFile(f"image too large: {why} exceeds the limit of {max_pixels} (decompression bomb "
                          "guard); pass --max-pixels to allow it")


def _check_side(fmt: str, name: str, value: int) -> None:
    """Every size enters here, whichever reader found it: an image is 1..MAX_SIDE pixels each way."""
    if not 1 <= value <= MAX_SIDE:
        raise InvalidFile(f"{fmt} header says {name} {value}, outside 1..{MAX_SIDE}")


def _open(data: bytes) -> tuple[Image.Image, str, int, int]:
    """Pillow's reading of the header, with its errors turned into InvalidFile reasons."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            width, height = img.size
            return img, img.format or "unknown", width, height
    except Image.DecompressionBombError as exc:
        raise InvalidFile(f"image too large, refused as a decompression bomb ({exc})") from None
    except Exception as exc:  # Pillow raises many types for garbage input
        raise InvalidFile(f"not a readable image ({_short(exc)})") from None


def _short(exc: Exception) -> str:
    text = str(exc).split(" <_io.BytesIO")[0].strip()
    return text or type(exc).__name__
