"""Pixel cache: its root folder, shared by every process of a node (the lock, the dataset folders
listed with what they take, room made, new folders published whole).

The root holds ``.lock`` (flock'd while folders are made, evicted or measured, and while a
process reserves a chunk of a data file: never while pixels are read or written) and one folder
per key (:mod:`fastload.pixels.layout`). A folder is made as ``.tmp-<name>-<pid>`` and renamed
into place whole, so a folder under its name always has its meta.json and a whole index.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import NamedTuple

import numpy as np

from fastload.format.files import create_new, write_all
from fastload.pixels.layout import (
    H_BOOT, H_FORMAT, H_GENERATION, H_MAGIC, H_RECORDS, H_RESERVED, HEADER_BYTES, MAGIC, PIXEL_FORMAT,
    index_bytes,
)
from fastload.storage.cache_entry_files import _reserve
from fastload.storage.cache_folder import _remove, locked

__all__ = ["Found", "create_folder", "locked", "make_room", "read_header", "scan_folders"]

IDLE_S = 120.0
"""A folder whose meta.json was touched this recently is in use (its users touch it every
TOUCH_EVERY seconds) and is never evicted to make room for another."""

TOUCH_EVERY = 60.0

_NAME = re.compile(r"[0-9a-f]{32}")


class Found(NamedTuple):
    used_ns: int
    name: str
    bytes: int  # the index and the reserved data


def read_header(path: str) -> np.ndarray:
    """The header words of the folder ``path``'s index (a copy); OSError or ValueError when it
    is not a whole index of this layout."""
    fd = os.open(os.path.join(path, "index"), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        raw = os.pread(fd, HEADER_BYTES, 0)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if len(raw) != HEADER_BYTES:
        raise ValueError(f"{path}/index: shorter than its header")
    words = np.frombuffer(raw, dtype=np.uint64)
    if int(words[H_MAGIC]) != MAGIC or int(words[H_FORMAT]) != PIXEL_FORMAT or \
            size != index_bytes(int(words[H_RECORDS])):
        raise ValueError(f"{path}/index: not a pixel cache index of format {PIXEL_FORMAT}")
    return words


def scan_folders(root: str) -> list[Found]:
    """Every dataset folder, least recently used first. Under the lock: a ``.tmp-`` folder seen
    now was left by a process that died while making it; a damaged folder is dropped."""
    found = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith(".tmp-"):
            _remove(path)
        elif _NAME.fullmatch(name):
            try:
                header = read_header(path)
                used_ns = os.stat(os.path.join(path, "meta.json"), follow_symlinks=False).st_mtime_ns
            except (OSError, ValueError):
                _remove(path)
                continue
            found.append(Found(used_ns, name, index_bytes(int(header[H_RECORDS])) + int(header[H_RESERVED])))
    return sorted(found)


def make_room(root: str, limit: int, need: int, keep: str) -> bool:
    """Whether ``need`` more bytes fit under ``limit``, after evicting the least recently used
    folders other than ``keep`` that no one uses now; none is evicted when that would not be enough."""
    found = scan_folders(root)
    used = sum(f.bytes for f in found)
    if used + need <= limit:
        return True
    idle_before = time.time_ns() - int(IDLE_S * 1e9)
    victims = [f for f in found if f.name != keep and f.used_ns < idle_before]
    if used - sum(f.bytes for f in victims) + need > limit:
        return False
    for victim in victims:
        if used + need <= limit:
            break
        _remove(os.path.join(root, victim.name))  # a process still mapping it keeps its pages
        used -= victim.bytes
    return True


def create_folder(root: str, name: str, meta: dict, records: int, boot: int) -> None:
    """Make the folder ``name`` (its meta.json and an index of ``records`` absent entries, all
    of it reserved on the disk: its pages are stored into through a mapping, where a hole on a
    full disk would be SIGBUS) and publish it whole. Under the lock."""
    tmp = os.path.join(root, f".tmp-{name}-{os.getpid()}")
    _remove(tmp)
    os.mkdir(tmp)
    try:
        fd = create_new(os.path.join(tmp, "meta.json"))
        try:
            write_all(fd, json.dumps(meta).encode())
        finally:
            os.close(fd)
        header = np.zeros(HEADER_BYTES // 8, dtype=np.uint64)
        header[[H_MAGIC, H_FORMAT, H_RECORDS, H_RESERVED, H_GENERATION, H_BOOT]] = [
            MAGIC, PIXEL_FORMAT, records, 0, 1, boot]
        fd = create_new(os.path.join(tmp, "index"))
        try:
            _reserve(fd, index_bytes(records))  # zeros: every entry absent
            os.pwrite(fd, header.tobytes(), 0)
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(root, name))
    except BaseException:
        _remove(tmp)
        raise


def touch(path: str) -> None:
    """Mark the folder ``path`` used now (its meta.json's mtime)."""
    now = time.time_ns()
    try:
        os.utime(os.path.join(path, "meta.json"), ns=(now, now), follow_symlinks=False)
    except OSError:
        pass  # a read-only folder: its use is not recorded, and nothing evicts it from here
