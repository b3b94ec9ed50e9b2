"""Write side: pack a folder or file list of small files into fastload shards plus a manifest."""

from fastload.converters.packing.loop import default_out, pack
from fastload.converters.packing.report import PackReport

__all__ = ["PackReport", "default_out", "pack"]
