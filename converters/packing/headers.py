"""Image headers without decoding: walk JPEG markers and PNG chunks for size and completeness.

A pack checks every file, so this runs once per file on the packing path: it must cost a few
microseconds, not the ~35 µs of ``PIL.Image.open``. Completeness is judged by structure: the
segments up to the first scan are walked by their lengths (so an EXIF thumbnail's own markers are
skipped), and an end-of-image marker must follow that scan's data. Entropy-coded data never holds
the bytes FF D9 (0xFF in it is always followed by 00 or a restart marker), so finding them after
the first scan header means the image data was not cut; bytes after EOI are allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

JPEG_SOI = b"\xff\xd8"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Start-of-frame markers carry the size: C0–CF minus DHT (C4), JPG (C8) and DAC (CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_EOI, _SOS = 0xD9, 0xDA
_STANDALONE = frozenset(range(0xD0, 0xD8)) | {0x01}  # RSTn and TEM have no length field


class BadHeader(Exception):
    """The file's structure is broken; the message says where, in words a user can act on."""


@dataclass(frozen=True)
class Header:
    """Pixel size from the header."""

    width: int
    height: int


def jpeg_header(data: bytes) -> Header:
    """Size of a baseline or progressive JPEG; BadHeader unless EOI follows the first scan."""
    size: Header | None = None
    pos, end = 2, len(data)
    while True:
        if pos + 2 > end:
            raise BadHeader(f"truncated JPEG (ends at byte {end}, before the end-of-image marker)")
        if data[pos] != 0xFF:  # stray bytes between segments: libjpeg and Pillow skip them too
            pos = data.find(b"\xff", pos)
            if pos < 0:
                raise BadHeader(f"truncated JPEG (ends at byte {end}, before the end-of-image marker)")
        while pos + 1 < end and data[pos + 1] == 0xFF:  # fill bytes before a marker
            pos += 1
        if pos + 2 > end:
            raise BadHeader(f"truncated JPEG (ends at byte {end}, inside a marker)")
        marker = data[pos + 1]
        if marker == _EOI:
            raise BadHeader(f"corrupt JPEG (end-of-image marker at byte {pos}, before any image data)")
        if marker in _STANDALONE:
            pos += 2
            continue
        if pos + 4 > end:
            raise BadHeader(f"truncated JPEG (ends inside the segment at byte {pos})")
        length = int.from_bytes(data[pos + 2:pos + 4], "big")
        segment_end = pos + 2 + length
        if length < 2 or segment_end > end:
            raise BadHeader(f"truncated JPEG (the segment at byte {pos} runs past the end of the file)")
        if marker in _SOF and size is None:
            if length < 8:
                raise BadHeader(f"corrupt JPEG (frame header at byte {pos} is too short)")
            size = Header(width=int.from_bytes(data[pos + 7:pos + 9], "big"),
                          height=int.from_bytes(data[pos + 5:pos + 7], "big"))
        if marker != _SOS:
            pos = segment_end
            continue
        if data.rfind(b"\xff\xd9") < segment_end:  # rfind: find() is ~100x slower on scan data
            raise BadHeader("truncated JPEG (ends inside the image data, no end-of-image marker)")
        break
    if size is None:
        raise BadHeader("corrupt JPEG (image data before any frame header)")
    if size.width == 0 or size.height == 0:
        raise BadHeader(f"unsupported JPEG (frame size {size.width}x{size.height}; "
                        "a height set later by a DNL marker is not supported)")
    return size


def png_header(data: bytes) -> Header:
    """Size of a PNG; BadHeader unless the chunk walk ends with IEND."""
    if len(data) < 33 or data[12:16] != b"IHDR":
        raise BadHeader("corrupt PNG (no IHDR chunk after the signature)")
    size = Header(width=int.from_bytes(data[16:20], "big"), height=int.from_bytes(data[20:24], "big"))
    pos, end = 8, len(data)
    while True:
        if pos + 8 > end:
            raise BadHeader(f"truncated PNG (ends at byte {end}, before the IEND chunk)")
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind = data[pos + 4:pos + 8]
        pos += 12 + length  # length, type, data, CRC
        if pos > end:
            raise BadHeader(f"truncated PNG (the {kind.decode('latin-1')!r} chunk runs past the end "
                            "of the file, no IEND chunk)")
        if kind == b"IEND":
            return size
