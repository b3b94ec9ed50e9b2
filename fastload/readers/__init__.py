"""Read side: random access to record payloads, one reader class per storage kind."""

from fastload.readers.base import ShardReader
from fastload.readers.hdf5 import HDF5Reader
from fastload.readers.lmdb import LMDBReader

READERS: dict[str, type[ShardReader]] = {"lmdb": LMDBReader, "hdf5": HDF5Reader}

__all__ = ["READERS", "HDF5Reader", "LMDBReader", "ShardReader"]
