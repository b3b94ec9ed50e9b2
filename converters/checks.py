"""Per-file validation before packing: every rejected file gets a reason string."""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

from PIL import Image

# Pillow's own bomb limit is ~89 Mpx (warning) / ~179 Mpx (error); we refuse above this many pixels.
DEFAULT_MAX_PIXELS = 178_956_970


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


def check_image(data: bytes, *, decode: bool = False, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageHeader:
    """Check that ``data`` is a whole image; raise InvalidFile naming what is wrong.

    By default only the header and the end-of-stream marker are checked (fast: no pixel decode);
    ``decode=True`` also decodes every pixel.
    """
    if not data:
        raise InvalidFile("empty file (0 bytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            width, height = img.size
            fmt = img.format or "unknown"
    except Image.DecompressionBombError as exc:
        raise InvalidFile(f"image too large, refused as a decompression bomb ({exc})") from None
    except Exception as exc:  # Pillow raises many types for garbage input
        raise InvalidFile(f"not a readable image ({_short(exc)})") from None
    if width * height > max_pixels:
        raise InvalidFile(f"image too large: {width}x{height} = {width * height} pixels exceeds the "
                          f"limit of {max_pixels} (decompression bomb guard); pass --max-pixels to allow it")
    if fmt == "JPEG" and b"\xff\xd9" not in data[-4096:]:
        raise InvalidFile("truncated JPEG (no end-of-image marker)")
    if fmt == "PNG" and b"IEND" not in data[-64:]:
        raise InvalidFile("truncated PNG (no IEND chunk)")
    if decode:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)
                img.load()
        except Exception as exc:
            raise InvalidFile(f"image does not decode ({_short(exc)})") from None
    return ImageHeader(fmt, width, height)


def _short(exc: Exception) -> str:
    text = str(exc).split(" <_io.BytesIO")[0].strip()
    return text or type(exc).__name__
