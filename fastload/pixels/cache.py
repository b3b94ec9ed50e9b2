"""Pixel cache: what a PackedDataset holds of it (where, how large, at which side, its key's store),
and the counts of what it served."""

from __future__ import annotations

import errno
import os
import threading
import warnings
from typing import Any

import numpy as np

from fastload.config import format_size, parse_size, pixel_cache_dir
from fastload.errors import CacheWarning
from fastload.format import Manifest
from fastload.pixels.batch import BatchPixels
from fastload.pixels.key import folder_name, pixel_key
from fastload.pixels.layout import default_side
from fastload.pixels.store import PixelStore


class PixelCache:
    """The decoded pixels of one dataset version, stored once on this node's disk and cropped from
    in every later epoch (``PackedDataset(pixel_cache=...)``; see docs/loader.md).

    Args:
        directory: the folder shared by every dataset's pixels on this node.
        limit: bytes all of them may take together; what does not fit decodes as without a cache.
        side: the shorter side images are stored at (never enlarged).
        manifest: the dataset's; its version is part of the key, so new records never meet old pixels.
        max_pixels: the dataset's pixel limit (part of the key too).
        dataset: the dataset's path or URL, for people reading the folder's meta.json.
    """

    def __init__(self, directory: str, limit: int, side: int, manifest: Manifest, max_pixels: int,
                 dataset: str) -> None:
        self.directory, self.limit, self.side = directory, limit, side
        key = pixel_key(manifest, side, max_pixels)
        self.name = folder_name(key)
        meta = {"key": key, "records": manifest.num_records, "dataset": dataset}
        self.store = PixelStore(directory, self.name, meta, manifest.num_records, limit, self)
        self.hits = self.misses = self.stored = 0  # in this process
        self._warned: set[tuple[str, int | None]] = set()
        self._count_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_count_lock"] = None
        state["hits"] = state["misses"] = state["stored"] = 0
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._count_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"PixelCache({self.directory!r}, limit={self.limit}, side={self.side})"

    def batch(self, records: list[int], widths: np.ndarray, heights: np.ndarray) -> BatchPixels:
        """The cache's side of one batch of ``records`` (see :class:`BatchPixels`)."""
        return BatchPixels(self.store, self.side, records, widths, heights)

    def count(self, batch: BatchPixels) -> tuple[int, int, int]:
        """Add a decoded batch's ``(hits, misses, stored)`` to this process's, and return them."""
        counts = batch.counts()
        with self._count_lock:
            self.hits += counts[0]
            self.misses += counts[1]
            self.stored += counts[2]
        return counts

    def bytes(self) -> int:
        """Bytes this dataset version's pixels take on disk (reserved for them)."""
        return self.store.usage()

    def bypass(self, what: str, exc: OSError) -> None:
        """Warn, once per process for each kind of trouble, that the cache could not ``what``
        (the records it would have served decode from their bytes, as without it)."""
        if (what, exc.errno) in self._warned:
            return
        self._warned.add((what, exc.errno))
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            advice = (f"its disk is full or nearly: free space there, set a smaller pixel_cache_limit "
                      f"(now {format_size(self.limit)}) or another folder (FASTLOAD_PIXEL_CACHE_DIR)")
        elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            advice = ("it is read-only here: the pixels already there are still read; give a writable folder "
                      "(pixel_cache=DIR, FASTLOAD_PIXEL_CACHE_DIR) to store the others")
        else:
            advice = "check the files there and their permissions, or give another folder (FASTLOAD_PIXEL_CACHE_DIR)"
        reason = f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else exc.strerror or exc
        warnings.warn(f"{self.directory}: the pixel cache could not {what} ({reason}); {advice}. Records it "
                      "does not hold decode from their bytes, as without it", CacheWarning, stacklevel=3)


def pixel_cache_for(given: str | os.PathLike[str] | bool | None, limit: int | str, side: int | None, *,
                    manifest: Manifest, out_size: tuple[int, int] | None, resize_ratio: float,
                    max_pixels: int, dataset: str) -> PixelCache | None:
    """PackedDataset's ``pixel_cache=``, ``pixel_cache_limit=`` and ``pixel_side=`` judged and
    resolved: the dataset's PixelCache, or None when it has none (not asked, a limit of 0, or
    fastload's native module is not built here: a warning)."""
    if given is None or given is False:
        if side is not None:
            raise ValueError(f"pixel_side={side!r} sets the size the pixel cache stores: pass pixel_cache= too")
        return None
    if out_size is None:
        raise ValueError("pixel_cache= stores what the built-in image pipeline decodes: pass image_size= too")
    if side is not None and (isinstance(side, bool) or not isinstance(side, int) or side < 1):
        raise ValueError(f"pixel_side={side!r}: must be a positive number of pixels (the stored shorter side)")
    if limit in (0, "0"):
        return None
    limit = parse_size(limit, name="pixel_cache_limit")
    try:
        from fastload.decode import _jpeg_region  # noqa: F401
    except ImportError:
        warnings.warn("pixel_cache= needs fastload's native module (fastload.decode._jpeg_region), which is not "
                      "built here (install libjpeg-dev and a C compiler, then reinstall fastload); decoding "
                      "every epoch instead", CacheWarning, stacklevel=3)
        return None
    return PixelCache(pixel_cache_dir(given), limit, side or default_side(out_size, resize_ratio), manifest,
                      max_pixels, dataset)
