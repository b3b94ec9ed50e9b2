"""Shard writers by storage kind (a plain registry)."""

from converters.writers.hdf5 import HDF5ShardWriter
from converters.writers.lmdb import LMDBShardWriter

WRITERS = {"lmdb": LMDBShardWriter, "hdf5": HDF5ShardWriter}

__all__ = ["WRITERS", "HDF5ShardWriter", "LMDBShardWriter"]
