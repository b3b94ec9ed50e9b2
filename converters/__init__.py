"""Write side: pack a folder or file list of small files, or write samples from Python, into
fastload shards plus a manifest."""

from fastload.converters.packing.loop import pack
from fastload.converters.packing.options import default_out
from fastload.converters.packing.report import PackReport
from fastload.converters.sources.writer import Writer

__all__ = ["PackReport", "Writer", "default_out", "pack"]
