"""The on-disk contract of a mask stored as rows (file fields of type "mask-rows"): a crop reads its rows alone.

A one-channel mask (class ids, a palette's indices, 16-bit depth) is stored as its values, not as
the PNG it came in, so that a crop decodes only the rows it shows, with no inflate of the rest.
All numbers little-endian::

    header   "FLMR", version (u8), element (u8), layout (u8), length bytes (u8),
             width (u32), height (u32), runs (u32)                                  20 bytes
    raw      values[height * width]                                  (layout 0: rows as they are)
    runs     row_starts u32[height + 1], lengths[runs], values[runs]  (layout 1: each row's runs)

Runs: row ``r`` is the runs ``row_starts[r]:row_starts[r + 1]``, each ``lengths[k]`` pixels of
``values[k]``; a row's lengths add up to ``width``, so rows ``a..b`` are the runs
``row_starts[a]:row_starts[b + 1]`` repeated out. The packer keeps whichever layout is smaller.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MAGIC = b"FLMR"
VERSION = 1
HEADER = struct.Struct("<4sBBBBIII")
# the element code's stored dtype: 8-bit class ids, 16-bit, 32-bit integers, floats
ELEMENTS = tuple(np.dtype(e) for e in ("<u1", "<u2", "<i4", "<f4"))
LAYOUT_RAW, LAYOUT_RUNS = 0, 1
MAX_SIDE = 2**31 - 1


@dataclass(frozen=True)
class MaskRows:
    """A stored mask's header and its arrays, as read-only views of the stored bytes."""

    width: int
    height: int
    element: np.dtype
    values: np.ndarray  # raw: every pixel, row after row; runs: each run's value
    lengths: np.ndarray | None = None  # runs: each run's pixels
    row_starts: np.ndarray | None = None  # runs: where each row's runs begin (height + 1)


def is_mask_rows(data: bytes | memoryview) -> bool:
    """Whether ``data`` is a mask stored as rows (not an image file)."""
    return bytes(data[:4]) == MAGIC


def parse_mask_rows(data: bytes | memoryview) -> MaskRows:
    """The header and array views of a stored mask; ValueError saying what is wrong when its bytes
    do not hold one (sizes are checked against the bytes present before any view is made)."""
    if len(data) < HEADER.size:
        raise ValueError(f"{len(data)} bytes, shorter than a stored mask's {HEADER.size}-byte header")
    magic, version, element, layout, length_bytes, width, height, runs = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise ValueError(f"not a stored mask of version {VERSION} (starts {bytes(data[:5])!r})")
    if element >= len(ELEMENTS) or layout not in (LAYOUT_RAW, LAYOUT_RUNS) or not 1 <= width <= MAX_SIDE \
            or not 1 <= height <= MAX_SIDE:
        raise ValueError(f"a header of element {element}, layout {layout}, {width}x{height} is not one fastload writes")
    dtype = ELEMENTS[element]
    at = HEADER.size
    if layout == LAYOUT_RAW:
        _expect(len(data), at + width * height * dtype.itemsize, f"{width}x{height} raw {dtype} values")
        return MaskRows(width, height, dtype, np.frombuffer(data, dtype, width * height, at))
    if length_bytes not in (2, 4) or runs > width * height:
        raise ValueError(f"{runs} runs of {length_bytes}-byte lengths for {width}x{height} pixels")
    lengths_type = np.dtype(f"<u{length_bytes}")
    _expect(len(data), at + 4 * (height + 1) + runs * (length_bytes + dtype.itemsize), f"{runs} runs of {height} rows")
    row_starts = np.frombuffer(data, "<u4", height + 1, at)
    at += 4 * (height + 1)
    lengths = np.frombuffer(data, lengths_type, runs, at)
    values = np.frombuffer(data, dtype, runs, at + runs * length_bytes)
    return MaskRows(width, height, dtype, values, lengths, row_starts)


def _expect(found: int, size: int, what: str) -> None:
    if found != size:
        raise ValueError(f"{found} bytes, {what} take {size}")
