"""Pixel cache: one batch's records as the decode stage meets them, cropped from stored pixels
where the cache has them, decoded whole, stored and cropped where it has room for them.

Both ways give the same sample for the same crop plan: the plan is drawn from the image's own
size (as without a cache), its box is mapped onto the stored planes, and the crop is resized,
made RGB, flipped and written into the batch by the native code (fill_crop.c), which reads only
the box's rows and columns. A fill crops the planes it has just written while they are in cache.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from fastload.decode.stored import crop_stored, decode_stored
from fastload.decode.transforms import CropPlan
from fastload.pixels.layout import MAX_SIDE, stored_bytes, stored_size
from fastload.pixels.store import PixelStore

HIT, MISS, STORED = 1, 2, 3
"""What became of each record of a batch: cropped from the cache; decoded from its bytes and
not stored (no room, or too large to store); decoded, stored and cropped."""


class BatchPixels:
    """The cache's side of one batch: ``records`` (record numbers, in the batch's order) and
    their sizes from the index (-1 where the pack did not measure them)."""

    def __init__(self, store: PixelStore, side: int, records: list[int], widths: np.ndarray,
                 heights: np.ndarray) -> None:
        self.store, self.side = store, side
        self.widths, self.heights = widths, heights
        self.entries = store.entries(np.asarray(records, dtype=np.int64))
        self.outcome = np.zeros(len(records), dtype=np.int8)  # one slot per decode thread's record

    def cached(self) -> np.ndarray:
        """Which records have an entry (their bytes need not be read, unless it fails its checks)."""
        if self.entries is None:
            return np.zeros(len(self.outcome), dtype=bool)
        return self.entries.present

    def crop(self, k: int, plan_for: Callable[[int, int], CropPlan], out: np.ndarray) -> CropPlan | None:
        """The ``k``-th record's crop from its stored pixels into ``out`` (HWC uint8), with the plan
        ``plan_for(width, height)`` of the image it was stored from; None when the cache has no
        pixels for it that pass their checks (the caller decodes the record)."""
        entries = self.entries
        if entries is None or not entries.present[k]:
            return None
        width, height = int(entries.image_width[k]), int(entries.image_height[k])
        known, stored = (int(self.widths[k]), int(self.heights[k])), (int(entries.width[k]), int(entries.height[k]))
        if (known[0] >= 0 and known != (width, height)) or stored_size(width, height, self.side) != stored:
            return None  # not this record's image, or not stored at this side: a damaged index
        pixels = self.store.pixels(entries, k)
        if pixels is None:
            return None
        plan = plan_for(width, height)
        crop_stored(pixels, stored, plan, (width, height), out)
        self.outcome[k] = HIT
        return plan

    def fill(self, k: int, record: int, payload: bytes, plan: CropPlan, image_size: tuple[int, int],
             out: np.ndarray, *, where: str, max_pixels: int) -> bool:
        """Decode the ``k``-th record (``payload``) whole to its stored size, store it, and crop
        ``plan`` from it into ``out``. False, with nothing decoded, when the cache has no room for
        it (the caller decodes the crop as it would without a cache). CorruptRecordError as
        decode_stored raises it: a damaged record is never stored."""
        stored = stored_size(*image_size, self.side)
        size = stored_bytes(*stored)
        offset = None if max(stored) > MAX_SIDE else self.store.reserve(size)
        if offset is None:
            self.outcome[k] = MISS
            return False
        pixels = _scratch(size)
        try:
            decode_stored(payload, *image_size, pixels, stored, where=where, max_pixels=max_pixels)
        except BaseException:
            self.store.give_back(offset, size)
            raise
        written = self.store.write(offset, pixels, stored, record, image_size)
        crop_stored(pixels, stored, plan, image_size, out)
        self.outcome[k] = STORED if written else MISS
        return True

    def missed(self, k: int) -> None:
        """The ``k``-th record was decoded without the cache."""
        self.outcome[k] = MISS

    def counts(self) -> tuple[int, int, int]:
        """``(hits, misses, stored)`` of the batch (stored ones are misses too)."""
        hits = int((self.outcome == HIT).sum())
        stored = int((self.outcome == STORED).sum())
        return hits, int((self.outcome == MISS).sum()) + stored, stored


_local = threading.local()


def _scratch(size: int) -> np.ndarray:
    """``size`` bytes this thread reuses for each image it stores (a fresh 130 KB buffer an image
    would be mapped and faulted in anew each time)."""
    buffer = getattr(_local, "buffer", None)
    if buffer is None or len(buffer) < size:
        buffer = _local.buffer = np.empty(max(size, 1 << 20), dtype=np.uint8)
    return buffer[:size]

