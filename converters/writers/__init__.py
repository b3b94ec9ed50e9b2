"""Shard writers by storage kind (a plain registry)."""

from fastload.converters.writers.hdf5 import HDF5ShardWriter
from fastload.converters.writers.lmdb import LMDBShardWriter

WRITERS = {"lmdb": LMDBShardWriter, "hdf5": HDF5ShardWriter}

__all__ = ["WRITERS", "HDF5ShardWriter", "LMDBShardWriter"]
