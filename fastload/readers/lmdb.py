"""LMDB shard reader: read-only environments, no locks, one read transaction per batch and shard."""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lmdb

from fastload.errors import ManifestError
from fastload.format import lmdb_key
from fastload.readers import lmdb_mapping
from fastload.readers.base import ShardReader
from fastload.readers.lmdb_pages import DamagedShard, check_tree


class LMDBReader(ShardReader):
    """Reads payloads from ``shard-NNNNN.lmdb`` files by (shard, position)."""

    def open_shard(self, shard: int) -> Any:
        info = self.manifest.shards[shard]
        path = self.root / info.file
        # Again at open, not only the dataset's: LMDB maps the file, and reading past the end of
        # one truncated since is a SIGBUS, not an error.
        st = self.stat_shard(shard)
        # Records of tens of KB span many pages: let the kernel read a record's pages in one go
        # (measured cold, ~105 KB photos: 68 MB/s with readahead off, 300 MB/s on). Tiny
        # records keep it off, so a random read does not drag in its neighbours.
        readahead = info.data_bytes >= _READAHEAD_MIN_RECORD * max(info.num_records, 1)
        return _open_env(path, (st.st_dev, st.st_ino), readahead)

    def close_handle(self, handle: Any) -> None:
        pass  # shared with other readers: it closes when the last one drops it

    def read_raw(self, indices: Sequence[int]) -> list[bytes]:
        out: list[bytes | None] = [None] * len(indices)
        by_shard: dict[int, list[int]] = {}
        for k, i in enumerate(indices):
            by_shard.setdefault(int(self.index.shard[i]), []).append(k)
        for shard, ks in by_shard.items():
            env = self.handle(shard)
            i = indices[ks[0]]
            try:
                # buffers=True: liblmdb points into its map and touches none of the record's
                # pages; copy_out reads them with pread (see there why).
                with env.begin(buffers=True) as txn:
                    for k in ks:
                        i = indices[k]
                        value = txn.get(lmdb_key(int(self.index.position[i])))
                        if value is None:
                            raise self.corrupt(i, "record missing from its shard")
                        if len(value) != self.index.size[i]:
                            raise self.corrupt(i, f"{len(value)} bytes stored, index says {int(self.index.size[i])}")
                        out[k] = lmdb_mapping.copy_out(env, value)
            except (lmdb.Error, OSError) as exc:
                raise self.corrupt(i, f"LMDB read failed ({exc})") from None
        # The records are copies: now and then, unmap the shard pages the B-tree walks mapped.
        lmdb_mapping.note_read(sum(map(len, out)))  # type: ignore[arg-type]
        return out  # type: ignore[return-value]


# py-lmdb refuses to open a file that is already open in the process, so every reader of a shard
# file (two datasets over one directory, a dataset and ``verify``) shares one environment; it
# closes when the last reader drops it.
#
# A forked child (a DataLoader worker) keeps using the environments it inherited. They are
# read-only and opened with lock=False: no lock file and no reader table, whose per-process slots
# are what breaks LMDB handles across fork (MDB_BAD_RSLOT); what is left is a file mapping and a
# descriptor read with pread, both valid in the child. Closing them in the child instead can hang
# it for good inside py-lmdb's close (seen after the parent's decode threads had read the shard),
# and a child cannot open a second environment on the same file.
_open_envs: weakref.WeakValueDictionary[tuple[int, int], lmdb.Environment] = weakref.WeakValueDictionary()
_open_lock = threading.Lock()


_READAHEAD_MIN_RECORD = 16 * 1024


def _open_env(path: Path, key: tuple[int, int], readahead: bool) -> lmdb.Environment:
    if _open_envs.get(key) is None:
        _check_pages(path)  # outside the lock: other shards open meanwhile
    with _open_lock:
        env = _open_envs.get(key)
        if env is None:
            env = _open_retrying(path, readahead)
            lmdb_mapping.track(env, path, readahead)
            _open_envs[key] = env
        return env


def _check_pages(path: Path) -> None:
    """Refuse a shard whose B-tree points outside the file: liblmdb would crash reading it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        check_tree(fd, os.fstat(fd).st_size)
    except DamagedShard as exc:
        raise ManifestError(f"{path}: damaged LMDB shard ({exc}); run `fastload verify` on the "
                            "dataset and re-pack it") from None
    finally:
        os.close(fd)


def _open_retrying(path: Path, readahead: bool, wait_s: float = 2.0) -> lmdb.Environment:
    """``lmdb.open``, waiting out an environment on the same file that is still closing.

    The last reader dropping an environment takes it out of ``_open_envs`` before py-lmdb has
    finished closing it (the close runs without the GIL), so another thread may briefly be told
    the file "is already open in this process".
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            # lock=False: read-only data never changes, so no lock file and no reader table.
            return lmdb.open(str(path), subdir=False, readonly=True, lock=False, readahead=readahead,
                             max_readers=1024, max_dbs=0)
        except lmdb.Error as exc:
            if "already open" not in str(exc) or time.monotonic() > deadline:
                raise ManifestError(f"{path}: cannot open LMDB shard ({exc}); re-pack the dataset") from None
        time.sleep(0.005)


def _new_lock_after_fork() -> None:
    """A parent thread may have held the lock at the fork; the child's copy would stay locked."""
    global _open_lock
    _open_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_after_fork)
