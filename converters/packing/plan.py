"""Shard planning and the resume journal: which records go in which shard, and which are done."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from fastload.converters.sources.items import SourceItem
from fastload.format import PACK_STATE_DIR, write_atomically
from fastload.format.files import ensure_dir, read_regular

# A journal entry lists a shard's records; millions of tiny records stay far below this.
_MAX_ENTRY_BYTES = 2**30


@dataclass(frozen=True)
class ShardPlan:
    """Shard ``number`` takes source items ``start:end``; ``digest`` names exactly that content."""

    number: int
    start: int
    end: int
    digest: str


def plan_shards(items: list[SourceItem], shard_size: int, options: dict[str, Any],
                values: list[bytes] | None = None) -> list[ShardPlan]:
    """Cut the item list into consecutive shards of about ``shard_size`` source bytes.

    The cut depends only on the listing and options, so a re-run finds the same shards and can keep
    the finished ones: a shard is kept only when its digest (options + its items' path, size,
    mtime and label, and ``values``: each item's field values, from ``stored_values``) is unchanged.
    """
    base = json.dumps(options, sort_keys=True)
    ranges: list[tuple[int, int]] = []
    start, filled = 0, 0
    for i, item in enumerate(items):
        size = item.total_size
        if i > start and filled + size > shard_size:
            ranges.append((start, i))
            start, filled = i, 0
        filled += size
    if start < len(items) or not ranges:
        ranges.append((start, len(items)))
    plans = []
    for number, (lo, hi) in enumerate(ranges):
        h = xxhash.xxh3_128(base.encode())
        for item in items[lo:hi]:
            h.update(f"\n{item.rel}\0{item.size}\0{item.mtime_ns}\0{item.label}".encode())
            for file in item.files:  # a record's other files: a changed mask redoes its shard
                h.update(f"\0{file.rel}\0{file.size}\0{file.mtime_ns}".encode())
        for value in values[lo:hi] if values is not None else ():  # a changed caption is another pack
            h.update(value)
        plans.append(ShardPlan(number, lo, hi, h.hexdigest()))
    return plans


def stored_values(fields: dict[str, str], values: dict[str, list[Any]], count: int) -> list[bytes] | None:
    """Each of ``count`` records' field values (``fields``: name → type, ``values``: name → one value
    per record) as bytes that differ when any value, or its type, does: what a plan digest adds so
    that "already packed" means every value the dataset stores. None without fields."""
    if not fields:
        return None
    out = [bytearray() for _ in range(count)]
    for name in sorted(fields):
        head = f"\0{name}:{fields[name]}=".encode()
        for record, value in zip(out, values[name]):
            record += head + _value_bytes(value)
    return [bytes(record) for record in out]


def _value_bytes(value: Any) -> bytes:
    """One field value as bytes: its Python or NumPy type, then its exact content."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype.str}{value.shape}".encode() + value.tobytes()
    if isinstance(value, float):
        return b"f" + value.hex().encode()  # every bit: 0.1 and 0.1000000000000001 differ
    return f"{type(value).__name__}{len(str(value))}:".encode() + str(value).encode("utf-8", "surrogatepass")


def stamps_digest(items: list[SourceItem]) -> str:
    """One digest of the ``(ctime, inode)`` of ``items``' files, kept in a finished shard's journal entry.

    Not in the shard's plan digest (a copy or a ``chmod`` of the source keeps a finished dataset
    "already packed"), but a resume redoes a shard whose files changed since it was written, even
    when a rewrite kept their size and mtime: the ctime cannot be set back, nor the inode kept by a
    replacement.
    """
    h = xxhash.xxh3_128()
    for item in items:
        for stamp in (item.stamp, *(file.stamp for file in item.files)):
            h.update(b"%d,%d;" % stamp)
    return h.hexdigest()


def plan_digest(plans: list[ShardPlan]) -> str:
    """One digest of a whole plan: equal for a re-run over the same files with the same options."""
    return xxhash.xxh3_128_hexdigest("\n".join(p.digest for p in plans).encode())


class JournalWriteError(OSError):
    """A shard was written but its journal entry was not (the disk filled, say)."""


class Journal:
    """``OUT/.pack/``: one JSON file per finished shard, written after the shard is durable."""

    def __init__(self, out: Path) -> None:
        self.dir = out / PACK_STATE_DIR

    def path(self, number: int) -> Path:
        return self.dir / f"shard-{number:05d}.json"

    def load(self, plan: ShardPlan, shard_file: Path, stamps: str) -> dict[str, Any] | None:
        """The finished record of ``plan`` if it is still valid (the same plan, the shard file of the
        size written, its source files unchanged: ``stamps``), else None (the shard is redone)."""
        try:
            done = json.loads(read_regular(self.path(plan.number), _MAX_ENTRY_BYTES, follow_links=False))
            if (done["digest"] == plan.digest and done["stamps"] == stamps
                    and shard_file.stat().st_size == done["bytes"]):
                return done
        except (OSError, ValueError, KeyError, TypeError):
            pass
        return None

    def save(self, number: int, record: dict[str, Any]) -> None:
        try:
            ensure_dir(self.dir, 0o700)
            write_atomically(self.path(number), json.dumps(record).encode())
        except OSError as exc:
            raise JournalWriteError(exc.errno, exc.strerror or str(exc)) from None

    def forget(self, number: int) -> None:
        try:
            os.unlink(self.path(number))
        except FileNotFoundError:
            pass
