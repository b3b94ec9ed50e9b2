"""Decoded pixels as a storage of their own: a local, bounded cache that every process of a node
shares, so that every epoch after the first crops stored pixels instead of decoding JPEGs.

- :mod:`fastload.pixels.cache`: what a PackedDataset holds (``pixel_cache=``), and its counts.
- :mod:`fastload.pixels.batch`: a batch's records cropped from the cache, or decoded and stored.
- :mod:`fastload.pixels.store`: one key's folder in a process: entries, mapped pixels, room.
- :mod:`fastload.pixels.folder`: the folder of every key: its lock, its bound, new folders.
- :mod:`fastload.pixels.key`: what stored pixels are a function of.
- :mod:`fastload.pixels.layout`: the on-disk layout, written down once.
"""

from __future__ import annotations

from fastload.pixels.cache import PixelCache, pixel_cache_for

__all__ = ["PixelCache", "pixel_cache_for"]
