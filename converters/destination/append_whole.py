"""Append, the dataset added to is whole: every shard and index file its manifest lists is there,
a regular file, and each shard of the size the manifest records; else the append is refused,
naming the file, before a byte is written (version N+1 would list a file no reader can open)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from fastload.errors import PackError
from fastload.format import Manifest
from fastload.format.files import kind_of

_FIX = "restore it from a copy, or re-pack the dataset; then append"


def check_whole(out: Path, manifest: Manifest) -> None:
    """Refuse (PackError) a dataset at ``out`` that lacks a file ``manifest`` lists, or whose shard changed size."""
    shards = manifest.shards
    listed = [(f"shard {k + 1} of {len(shards)}", s.file, s.bytes) for k, s in enumerate(shards)]
    listed += [(f"index column {name!r}", entry.file, None) for name, entry in manifest.index.items()]
    for what, name, size in listed:
        path = out / name
        try:
            st = os.stat(path)
        except OSError as exc:
            raise PackError(f"{path}: the dataset's {what} cannot be opened ({exc.strerror}); an append would "
                            f"make a version no reader can open: {_FIX}") from None
        if not stat.S_ISREG(st.st_mode):
            raise PackError(f"{path}: the dataset's {what} is {kind_of(st.st_mode)}, not a regular file; {_FIX}")
        if size is not None and st.st_size != size:
            raise PackError(f"{path}: the dataset's {what} holds {st.st_size} bytes, its manifest says {size} "
                            f"(truncated or replaced); run `fastload verify {out}`, and {_FIX}")
