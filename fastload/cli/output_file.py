"""A file the ``fastload`` command writes for its user (``show``'s record): a new file, or with
``--overwrite`` a regular file replaced whole; never written through a link, never inside a dataset.

The rules hold whatever the path: ``record-3.jpg`` in the current folder, a link planted under
that name (refused, its target never opened), ``DS/manifest.json`` or ``DS/../DS/index/x`` (inside
a dataset once resolved: refused, the dataset left as it was). A new file is created with
``O_EXCL | O_NOFOLLOW``; a replaced one is written beside it under a fresh name and renamed over
it, so a link put there meanwhile is replaced, never followed.
"""

from __future__ import annotations

import os
import re
import secrets
import stat
from pathlib import Path

from fastload.cli.terminal import shown
from fastload.format.files import kind_of, write_all
from fastload.format.layout import FORMAT_NAME, MANIFEST_NAME

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_FASTLOAD_MANIFEST = re.compile(rb'\s*\{\s*"format"\s*:\s*"' + FORMAT_NAME.encode() + rb'"')


def write_output(path: Path, data: bytes, *, overwrite: bool, dataset: Path | None = None) -> None:
    """Write ``data`` to ``path`` by the rules above; ``dataset``: the local dataset being read (a
    folder holding a fastload manifest is refused too). Errors name the path and the way out."""
    inside = _dataset_around(Path(os.path.realpath(path.parent)), dataset)
    if inside is not None:
        raise PermissionError(f"{shown(path)}: is inside the dataset {shown(inside)}; fastload never writes "
                              "into a dataset: pass -o a path outside it")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        _refuse(path, st, overwrite)
    if st is None:
        _write_new(path, data)
    else:
        _replace(path, data)


def _refuse(path: Path, st: os.stat_result, overwrite: bool) -> None:
    """Whatever is at ``path`` already, refused unless it is a regular file and ``overwrite``."""
    if stat.S_ISLNK(st.st_mode):
        raise FileExistsError(f"{shown(path)}: is a symbolic link (to {shown(os.readlink(path))}); fastload "
                              "never writes through a link nor replaces one: remove it, or pass -o another path")
    if not stat.S_ISREG(st.st_mode):
        raise FileExistsError(f"{shown(path)}: is {kind_of(st.st_mode)}, not a file; pass -o a file's path")
    if not overwrite:
        raise FileExistsError(f"{shown(path)}: exists; pass --overwrite to replace it, or -o another path")


def _write_new(path: Path, data: bytes) -> None:
    try:
        fd = os.open(path, _NEW, 0o666)
    except FileExistsError:  # made since we looked: judged as any file found there
        _refuse(path, os.lstat(path), overwrite=False)
        raise
    try:
        write_all(fd, data)
    except BaseException:
        os.unlink(path)  # ours, half written
        raise
    finally:
        os.close(fd)


def _replace(path: Path, data: bytes) -> None:
    temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    _write_new(temp, data)
    try:
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise


def _dataset_around(folder: Path, dataset: Path | None) -> Path | None:
    """The dataset folder that ``folder`` (resolved) is or lies in: ``dataset``, or any folder up
    the tree holding a fastload manifest; None when there is none."""
    root = Path(os.path.realpath(dataset)) if dataset is not None else None
    for candidate in (folder, *folder.parents):
        if candidate == root or _holds_manifest(candidate):
            return candidate
    return None


def _holds_manifest(folder: Path) -> bool:
    """Whether ``folder`` holds a fastload manifest (not another program's manifest.json)."""
    try:
        fd = os.open(folder / MANIFEST_NAME, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and _FASTLOAD_MANIFEST.match(os.pread(fd, 256, 0)) is not None
    except OSError:
        return False
    finally:
        os.close(fd)
