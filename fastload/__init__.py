"""fastload: pack small files into LMDB/HDF5 shards and feed them to PyTorch fast.

Heavy modules (torch, h5py, lmdb) load on first use, so ``import fastload`` and the pack CLI stay light.
"""

from __future__ import annotations

import importlib
from typing import Any

from fastload.errors import (
    BucketNotFound, CacheWarning, ClusterLostError, ClusterUnreachableError, CorruptRecordError, DatasetNotFoundError, FastloadError, ManifestError, MissingDependencyError,
    PackError, RemoteAccessDenied, RemoteNotFound, RemoteReadError, SharedMemoryError, SkippedRecordWarning, SourceError,
    SourceNotFoundError,
)

__version__ = "0.1.0"

_LAZY = {
    "pack": "fastload.converters.packing.loop",  # the write side, from the repository's converters/ folder
    "PackReport": "fastload.converters.packing.report",
    "Writer": "fastload.converters.sources.writer",
    "PackedDataset": "fastload.dataset",
    "MixedDataset": "fastload.samples.mixed",
    "DataLoader": "fastload.loading.loader",
    "LoaderSettings": "fastload.loading.settings",
    "tune": "fastload.loading.tuner",
    "verify": "fastload.verifier",
    "VerifyReport": "fastload.verifier",
    "describe": "fastload.summary",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fastload' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    """The public API, for ``dir(fastload)`` and tab completion: not this module's own imports."""
    return sorted(__all__)


__all__ = [
    "BucketNotFound", "CacheWarning", "ClusterLostError", "ClusterUnreachableError", "CorruptRecordError", "DataLoader", "DatasetNotFoundError", "FastloadError", "LoaderSettings",
    "ManifestError", "MissingDependencyError", "MixedDataset", "PackError", "PackedDataset", "RemoteAccessDenied", "RemoteNotFound",
    "RemoteReadError", "SharedMemoryError", "SkippedRecordWarning", "SourceError", "SourceNotFoundError", "VerifyReport", "__version__",
    "PackReport", "Writer", "describe", "pack", "tune", "verify",
]
