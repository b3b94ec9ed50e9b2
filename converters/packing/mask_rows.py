"""Pack stage: a one-channel mask re-stored as rows (fastload.format.mask_rows), its values kept exactly."""

from __future__ import annotations

import numpy as np
from fastload.converters.packing.checks import InvalidFile

from fastload.decode.images import decode_as_stored
from fastload.errors import CorruptRecordError
from fastload.format.mask_rows import (
    ELEMENTS,
    HEADER,
    LAYOUT_RAW,
    LAYOUT_RUNS,
    MAGIC,
    MAX_SIDE,
    VERSION,
)


def image_values(img: object) -> np.ndarray:
    """A one-channel PIL image's values as the loader gives them for a mask, in the smallest stored
    element of their mode: 1-bit, 8-bit and palette images as uint8 (a palette's indices), 16-bit
    as uint16, 32-bit integers as int32, floats as float32."""
    mode = img.mode  # type: ignore[attr-defined]
    if mode in ("1", "L", "P"):
        return np.asarray(img, dtype=np.uint8)
    if mode.startswith("I;16"):
        return np.asarray(img).astype("<u2")
    if mode == "I":  # int32 even when 16 bits would hold them: Pillow cuts "I" as it cuts 8-bit, not 16-bit
        return np.asarray(img, dtype="<i4")
    if mode == "F":
        return np.asarray(img, dtype="<f4")
    raise InvalidFile(f"is a {mode} image, not a one-channel mask")


def rows_from_file(data: bytes, max_pixels: int) -> bytes:
    """A mask file's bytes (a PNG, TIFF, ...: checked already) re-stored as rows."""
    try:
        img = decode_as_stored(data, max_pixels=max_pixels)
    except CorruptRecordError as exc:
        raise InvalidFile(str(exc).lstrip(": ")) from None
    return mask_rows(image_values(img))


def mask_rows(values: np.ndarray) -> bytes:
    """A 2-D array of uint8, uint16, int32 or float32 values as a stored mask: each row's runs of
    equal values, or the rows as they are when that is smaller (noise, depth)."""
    values = values.astype(values.dtype.newbyteorder("<"), copy=False)
    if values.ndim != 2 or values.dtype not in ELEMENTS or 0 in values.shape or max(values.shape) > MAX_SIDE:
        raise InvalidFile(f"a {values.dtype} array of shape {values.shape} is not a mask's rows "
                          f"(2-D, at most {MAX_SIDE} a side, uint8, uint16, int32 or float32)")
    height, width = values.shape
    element, itemsize = ELEMENTS.index(values.dtype), values.dtype.itemsize
    flat = np.ascontiguousarray(values).reshape(-1)
    bits = flat.view(f"<u{itemsize}")  # compared as bits: -0.0 and 0.0, and NaNs, stay as they were
    change = np.empty(flat.size, dtype=bool)
    change[0] = True
    np.not_equal(bits[1:], bits[:-1], out=change[1:])
    change[::width] = True  # every row starts a run of its own
    starts = np.flatnonzero(change)
    length_bytes = 2 if width < 2**16 else 4
    runs_size = 4 * (height + 1) + starts.size * (length_bytes + itemsize)
    if runs_size >= flat.size * itemsize:
        return HEADER.pack(MAGIC, VERSION, element, LAYOUT_RAW, 0, width, height, 0) + flat.tobytes()
    lengths = np.diff(starts, append=flat.size).astype(f"<u{length_bytes}")
    row_starts = np.searchsorted(starts, np.arange(height + 1, dtype=np.int64) * width).astype("<u4")
    return b"".join((HEADER.pack(MAGIC, VERSION, element, LAYOUT_RUNS, length_bytes, width, height, starts.size),
                     row_starts.tobytes(), lengths.tobytes(), flat[starts].tobytes()))
