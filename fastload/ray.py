"""Packing on a Ray cluster (``pip install 'fastload-torch[ray]'``): ``fastload.ray.PackSink``, a Ray
Data sink whose write tasks write whole shards and whose driver writes the index, then the
manifest, last (docs/ray.md). Importing this module imports Ray; ``import fastload`` does not."""

from __future__ import annotations

from fastload.optional import require

require("ray.data", "fastload.ray (packing on a Ray cluster)")

from fastload.converters.cluster.ray_sink import PackSink

__all__ = ["PackSink"]
