"""Pixel cache: its on-disk layout written down once (folder, index header, entries, stored
sizes, planes).

One folder per dataset version and decode settings (``<root>/<name>/``, ``name`` the xxh3-128 of
the key, :mod:`fastload.pixels.key`)::

    meta.json       {"format", "key", "records", "dataset"}; its mtime is the folder's last use
    index           HEADER_BYTES of header words, then ENTRY_WORDS uint64 words per record
    data-00000 ...  each record's planes (below), SEGMENT_BYTES a file (sparse past what is
                    reserved), records packed in turn, none across two files

A record's pixels are planes, what a JPEG holds (JFIF's YCbCr: full range, BT.601 weights), each
plane's rows packed one after the other: Y at the stored ``width`` x ``height``, then Cb, then Cr,
each ``ceil(width / 2)`` x ``ceil(height / 2)`` (chroma sample ``(i, j)`` centred on the 2 x 2
luma pixels from ``(2i, 2j)``, as in a 4:2:0 JPEG; an odd side's last chroma sample covers its
last luma row or column alone). Every image is stored so, whatever it was: a 4:2:0 JPEG's planes
shrunk as decoded, another subsampling's chroma resized to this one, a grey image's chroma 128,
anything else (CMYK, PNG, ...) decoded to RGB and converted (fastload/decode/stored.py).

Words are the machine's own 64-bit integers (MAGIC reads as another number on a machine of the
other byte order, and such a folder is made anew). An entry's word 0 is its commit: 0 until the
pixels are written, then ``PRESENT | generation << GEN_SHIFT | offset // ALIGN`` (``offset`` in
the data files end to end), stored last with release order (pixel_native.c).
"""

from __future__ import annotations

from typing import Any

import numpy as np

PIXEL_FORMAT = 2
"""The layout's version: a folder of another one is never read (its key names another folder, and
its index header says its version). 1: packed RGB rows (3 bytes a pixel); 2: the planes above."""

MAGIC = int.from_bytes(b"FLPIXEL1", "little")
HEADER_BYTES = 4096
"""The index's header: one page, so that the entries' words never share it."""

ENTRY_WORDS = 4
ENTRY_BYTES = 8 * ENTRY_WORDS

# Header words, under the cache folder's lock once the folder is published.
H_MAGIC, H_FORMAT, H_RECORDS, H_RESERVED, H_GENERATION, H_BOOT = range(6)
"""H_RESERVED: bytes of the data files handed out (reserved on the disk); H_GENERATION: bumped
when the machine has booted since the last open, so that entries of an earlier boot are checked
against their checksum once before they are trusted (pages written before a power cut may not have
reached the disk); H_BOOT: which boot H_GENERATION belongs to."""

SEGMENT_BYTES = 1 << 30
"""One data file's size (sparse: only reserved chunks take disk)."""

CHUNK_BYTES = 16 << 20
"""Bytes a process reserves at a time for its fills, under the folder lock (one record's may be more)."""

ALIGN = 64
"""Every record's pixels start on a multiple of this (a cache line)."""

PRESENT = 1 << 63
GEN_SHIFT = 44
GEN_MASK = (1 << 19) - 1
OFFSET_MASK = (1 << GEN_SHIFT) - 1
MAX_SIDE = 0xFFFF
"""A stored side is 16 bits; an image whose stored size would be larger is not cached."""


def index_bytes(records: int) -> int:
    return HEADER_BYTES + ENTRY_BYTES * records


def default_side(out_size: tuple[int, int], resize_ratio: float) -> int:
    """The shorter side pixels are stored at by default: ``round(max(image_size) / resize_ratio)``
    (256 for 224), the eval pipeline's resize, so a validation crop reads them unresized."""
    return round(max(out_size) / resize_ratio)


def stored_size(width: int, height: int, side: int) -> tuple[int, int]:
    """``(width, height)`` an image is stored at: its shorter side scaled to ``side``, the longer
    one as torchvision's ``Resize(side)`` makes it (``int(side * long / short)``); never larger
    than the image."""
    if min(width, height) <= side:
        return width, height
    if width <= height:
        return side, int(side * height / width)
    return int(side * width / height), side


def chroma_size(width: int, height: int) -> tuple[int, int]:
    """``(width, height)`` of each chroma plane of pixels stored at ``width`` x ``height``."""
    return (width + 1) // 2, (height + 1) // 2


def stored_bytes(width: int, height: int) -> int:
    """Bytes of the planes of pixels stored at ``width`` x ``height`` (about 1.5 a pixel)."""
    chroma_w, chroma_h = chroma_size(width, height)
    return width * height + 2 * chroma_w * chroma_h


def entry_words(offset: int, generation: int, width: int, height: int, checksum: int,
                image_width: int, image_height: int) -> tuple[int, int, int, int]:
    """One record's entry: ``offset`` of its planes (stored ``width`` x ``height``), the low 32
    bits of their xxh3-64, and the size of the image they were made from."""
    return (PRESENT | (generation & GEN_MASK) << GEN_SHIFT | offset // ALIGN,
            (checksum & 0xFFFFFFFF) << 32 | width << 16 | height,
            image_height << 32 | image_width, 0)


def with_generation(word0: int, generation: int) -> int:
    """Word 0 of an entry checked again in a later generation."""
    return (word0 & ~(GEN_MASK << GEN_SHIFT)) | (generation & GEN_MASK) << GEN_SHIFT


class Entries:
    """A batch's entries (``ENTRY_WORDS`` uint64 columns, one row for each of ``records``) as
    named columns; ``handles``: the process's handles on the folder they were read from."""

    def __init__(self, words: np.ndarray, records: np.ndarray, handles: Any = None) -> None:
        first, second, third = words[:, 0], words[:, 1], words[:, 2]
        self.words, self.records, self.handles = words, records, handles
        self.present = (first & np.uint64(PRESENT)) != 0
        self.offset = (first & np.uint64(OFFSET_MASK)).astype(np.int64) * ALIGN
        self.generation = ((first >> np.uint64(GEN_SHIFT)) & np.uint64(GEN_MASK)).astype(np.int64)
        self.checksum = (second >> np.uint64(32)).astype(np.int64)
        self.width = ((second >> np.uint64(16)) & np.uint64(0xFFFF)).astype(np.int64)
        self.height = (second & np.uint64(0xFFFF)).astype(np.int64)
        self.image_width = (third & np.uint64(0xFFFFFFFF)).astype(np.int64)
        self.image_height = (third >> np.uint64(32)).astype(np.int64)


def folder_bytes(widths: np.ndarray, heights: np.ndarray, side: int) -> int:
    """Bytes a folder takes once every image of these sizes is stored at ``side`` (its index and
    planes; an image of unknown size, -1, counted as the mean of the others)."""
    widths, heights = np.asarray(widths, dtype=np.int64), np.asarray(heights, dtype=np.int64)
    known = (widths > 0) & (heights > 0)
    short, long = np.minimum(widths, heights)[known], np.maximum(widths, heights)[known]
    scaled = short > side
    long = np.where(scaled, (side * long / np.maximum(short, 1)).astype(np.int64), long)
    short = np.where(scaled, side, short)
    each = -(-stored_bytes(short, long) // ALIGN) * ALIGN  # symmetric in the two sides
    data = int(each.sum()) + (int(each.mean()) * int((~known).sum()) if known.any() else 0)
    return index_bytes(len(widths)) + data
