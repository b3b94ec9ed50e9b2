"""LMDB shard reader: read-only environments, no locks, one read transaction per batch and shard."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lmdb

from fastload.errors import ManifestError
from fastload.format import lmdb_key
from fastload.readers.base import ShardReader


class LMDBReader(ShardReader):
    """Reads payloads from ``shard-NNNNN.lmdb`` files by (shard, position)."""

    def open_shard(self, shard: int) -> Any:
        info = self.manifest.shards[shard]
        path = self.root / info.file
        try:
            st = os.stat(path)
        except OSError as exc:
            raise ManifestError(f"{path}: cannot open LMDB shard ({exc.strerror}); "
                                "re-pack the dataset") from None
        if st.st_size != info.bytes:
            # LMDB maps the file: reading past the end of a truncated one is a SIGBUS, not an error.
            raise ManifestError(f"{path}: {st.st_size} bytes on disk, the manifest says {info.bytes} "
                                "(truncated or replaced); re-pack the dataset")
        return _open_env(path, (st.st_dev, st.st_ino))

    def close_handle(self, handle: Any) -> None:
        pass  # shared with other readers: it closes when the last one drops it

    def read_raw(self, indices: Sequence[int]) -> list[bytes]:
        out: list[bytes | None] = [None] * len(indices)
        by_shard: dict[int, list[int]] = {}
        for k, i in enumerate(indices):
            by_shard.setdefault(int(self.index.shard[i]), []).append(k)
        for shard, ks in by_shard.items():
            env = self.handle(shard)
            try:
                with env.begin(buffers=False) as txn:
                    for k in ks:
                        i = indices[k]
                        value = txn.get(lmdb_key(int(self.index.position[i])))
                        if value is None:
                            raise self.corrupt(i, "record missing from its shard")
                        if len(value) != self.index.size[i]:
                            raise self.corrupt(i, f"{len(value)} bytes stored, index says {int(self.index.size[i])}")
                        out[k] = value
            except lmdb.Error as exc:
                raise self.corrupt(indices[ks[0]], f"LMDB read failed ({exc})") from None
        return out  # type: ignore[return-value]


# py-lmdb refuses to open a file that is already open in the process, so every reader of a shard
# file (two datasets over one directory, a dataset and ``verify``) shares one environment; it
# closes when the last reader drops it.
_open_envs: weakref.WeakValueDictionary[tuple[int, int], lmdb.Environment] = weakref.WeakValueDictionary()
_open_lock = threading.Lock()


def _open_env(path: Path, key: tuple[int, int]) -> lmdb.Environment:
    with _open_lock:
        env = _open_envs.get(key)
        if env is None:
            try:
                # lock=False: read-only data never changes; readahead=False: random access on big sets.
                env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=False,
                                max_readers=1024, max_dbs=0)
            except lmdb.Error as exc:
                raise ManifestError(f"{path}: cannot open LMDB shard ({exc}); re-pack the dataset") from None
            _open_envs[key] = env
        return env


def _close_inherited() -> None:
    """In a forked child: close this process's copies of the parent's environments, so that the
    child's readers (which drop inherited handles) can open their own."""
    global _open_lock
    for env in list(_open_envs.values()):
        env.close()
    _open_envs.clear()
    _open_lock = threading.Lock()


os.register_at_fork(after_in_child=_close_inherited)
