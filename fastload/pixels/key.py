"""Pixel cache: what its pixels are a function of, as a key that names their folder.

The pixels of record ``i`` depend on that record's bytes, the size they are stored at, the pixel
limit that lets the image be decoded at all, and the decoder that made them. The key holds each:
the dataset's version as its manifest describes it (record count, version, every shard's name,
counts, size and digest of its records' checksums: an ``--append`` or an ``--overwrite`` with other
files changes it, an identical re-pack does not, and its pixels are then the same), the stored
side, ``max_pixels``, the layout's version, how the pixels are made (the fill's arithmetic, or
Pillow's) and the JPEG library. Another key is another folder: old pixels are never read for new
records, nor pixels made another way.
"""

from __future__ import annotations

import json
from typing import Any

import xxhash

from fastload.decode.stored import fill_method
from fastload.format import Manifest
from fastload.pixels.layout import PIXEL_FORMAT


def dataset_version(manifest: Manifest) -> str:
    """A digest of what identifies the records of this version of a dataset."""
    shards = [[s.file, s.num_records, s.bytes, s.records_digest, s.etag] for s in manifest.shards]
    body = json.dumps([manifest.num_records, manifest.version, shards], separators=(",", ":"))
    return xxhash.xxh3_128_hexdigest(body.encode())


def decoder_version() -> int:
    """The JPEG library's version number (0 where the native module is not built)."""
    try:
        from fastload.decode._jpeg_region import LIBJPEG_TURBO_VERSION
    except ImportError:
        return 0
    return int(LIBJPEG_TURBO_VERSION)


def pixel_key(manifest: Manifest, side: int, max_pixels: int) -> dict[str, Any]:
    """The key of one dataset version's pixels stored at ``side`` (written into its meta.json)."""
    return {"format": PIXEL_FORMAT, "dataset": dataset_version(manifest), "side": side,
            "max_pixels": max_pixels, "fill": fill_method(), "libjpeg": decoder_version()}


def folder_name(key: dict[str, Any]) -> str:
    """The folder of ``key``'s pixels: 32 hex digits."""
    return xxhash.xxh3_128_hexdigest(json.dumps(key, sort_keys=True).encode())
