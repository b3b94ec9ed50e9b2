"""Cluster packing from SRC, the driver's plan: the local listing cut into parts of about one shard
(each part a table of rows: where each item's bytes are, its mtime and stamp, its label and fields;
no image read), and the parts dealt out, consecutive, to a few tasks per CPU of the cluster.

A part's boundaries depend on the listing and ``shard_size`` only, never on the cluster: the part is
what a task writes as one small dataset named by its listed rows (converters.cluster.ray_parts), so
a re-run on another cluster (more nodes, fewer) finds the same parts' datasets and reuses them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastload.converters.sources.items import SourceItem, SourceListing

from fastload.errors import PackError
from fastload.optional import require

# The rows' own columns; a source's fields keep their names beside them (a field name never starts with "__")
ORDER, KEY, IMAGE, LABEL, FILE, OFFSET, SIZE = "__order", "__path", "__image", "__label", "__file", "__offset", "__size"
MTIME, CTIME, INODE = "__mtime_ns", "__ctime_ns", "__inode"  # what the local pack's resume trusts (packing.plan)

TASKS_PER_CPU = 2  # a few tasks per CPU: a slow node's last task is short, and a node lost redoes little


@dataclass(frozen=True)
class PartSource:
    """What every task needs to rebuild its parts' listings, as plain data it can be sent: the
    listing's own facts and how its bytes are read (``reader_spec``)."""

    root: str
    layout: str
    classes: tuple[str, ...] | None
    fields: dict[str, str]  # field → dtype, as the listing's
    images: bool | None
    extensions: tuple[str, ...]
    reader: tuple[Any, ...]  # reader_spec(listing)

    def facts(self) -> str:
        """What changes a part's dataset besides its rows: part of its folder's name."""
        return json.dumps([self.root, self.layout, self.classes, self.fields, self.images, self.extensions,
                           self.reader], default=str)


def part_source(listing: SourceListing, extensions: tuple[str, ...]) -> PartSource:
    """``listing``'s facts a task rebuilds its parts' listings from."""
    return PartSource(os.fspath(listing.root), listing.layout,
                      tuple(listing.classes) if listing.classes is not None else None, dict(listing.fields),
                      listing.images, extensions, reader_spec(listing))


@dataclass(frozen=True)
class TaskSlice:
    """One task's work: consecutive parts of the listing (one table of rows each) and their listed bytes."""

    parts: list[Any]  # pyarrow Tables, in listing order
    listed_bytes: int


def plan_tasks(listing: SourceListing, shard_bytes: int, cpus: int) -> list[TaskSlice]:
    """The listing as parts of at most ``shard_bytes`` listed bytes, dealt to about
    ``TASKS_PER_CPU * cpus`` tasks of consecutive parts with about equal bytes each."""
    parts = list(_parts(listing.items, shard_bytes))
    sizes = [sum(max(item.size, 0) for item in listing.items[p.start:p.stop]) for p in parts]
    tasks = max(1, min(len(parts), TASKS_PER_CPU * max(cpus, 1)))
    # part k goes to the task whose share of the bytes its first byte falls in
    starts = np.cumsum([0, *sizes[:-1]], dtype=np.int64)
    total = max(int(sum(sizes)), 1)
    owner = np.minimum(starts * tasks // total, tasks - 1) if parts else np.zeros(0, np.int64)
    dealt: dict[int, list[int]] = {}
    for k, task in enumerate(owner.tolist()):
        dealt.setdefault(task, []).append(k)
    return [TaskSlice([_block(listing, parts[k]) for k in mine], sum(sizes[k] for k in mine))
            for _, mine in sorted(dealt.items())]


def _parts(items: list[SourceItem], shard_bytes: int) -> Iterator[range]:
    """Consecutive runs of items of at most ``shard_bytes`` listed bytes (or one item), cut as the
    Writer cuts a shard (before the item that would pass it): one shard each."""
    start, total = 0, 0
    for i, item in enumerate(items):
        size = max(item.size, 0)
        if i > start and total + size > shard_bytes:
            yield range(start, i)
            start, total = i, 0
        total += size
    if start < len(items):
        yield range(start, len(items))


def _block(listing: SourceListing, part: range) -> Any:
    """One part's rows: each item's place, key (its path as a local pack stores it), where its bytes
    are, its mtime and stamp, its label and its fields' values."""
    pa = require("pyarrow", "fastload pack --ray")
    items = listing.items[part.start:part.stop]
    columns: dict[str, Any] = {
        ORDER: pa.array(np.arange(part.start, part.stop, dtype=np.int64)),
        KEY: [item.rel for item in items], FILE: [os.fspath(item.path) for item in items],
        OFFSET: pa.array([item.offset for item in items], pa.int64()),
        SIZE: pa.array([item.size for item in items], pa.int64()),
        MTIME: pa.array([item.mtime_ns for item in items], pa.int64()),
        CTIME: pa.array([item.stamp[0] for item in items], pa.int64()),
        # an inode at or past 2**63 (an overlay's) kept as its int64 bits: only ever compared, never opened
        INODE: pa.array([_int64(item.stamp[1]) for item in items], pa.int64()),
        LABEL: pa.array([item.label for item in items], pa.int64()),
    }
    for name in listing.fields:
        values = listing.field_values[name][part.start:part.stop]
        columns[name] = [v.item() if isinstance(v, np.generic) else v for v in values]
    return pa.table(columns)


def _int64(value: int) -> int:
    return value - 2**64 if value >= 2**63 else value


def reader_spec(listing: SourceListing) -> tuple[Any, ...]:
    """How a task reads its rows' bytes, as plain data it can be sent: whole files, tar members, or
    a table's image column (its files reopened in the task)."""
    if listing.reader is None:
        return ("files",)
    if listing.layout in ("webdataset", "imagefolder"):  # an ImageFolder tree with a reader: one inside tars
        return ("tars",)
    if listing.layout == "table":
        tables = listing.reader.tables  # type: ignore[attr-defined]
        return ("table", listing.reader.column, listing.reader.limit,  # type: ignore[attr-defined]
                {os.fspath(path): t.name for path, t in tables.items()})
    raise PackError(f"{listing.root}: a {listing.layout} source cannot be read by Ray tasks yet; pack without --ray")
