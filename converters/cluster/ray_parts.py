"""Cluster packing from SRC, one part in a task: the part's rows (converters.cluster.ray_plan) made
a listing again, its items' bytes read where they lie, and packed into the part's folder by the
local pack's own loop (``packing.job.pack_listing``: read-ahead threads, header check,
write-behind, the same finalize), so a record costs a task what it costs a local pack.

The folder is named by a digest of the part's listing (each item's key, file, offset, size, mtime
and stamp, label and field values), the listing's facts and the pack's settings, never by a task
id: what the local pack's resume journal trusts (converters.packing.plan). A task Ray re-runs, or a
pack re-run after its driver was killed, finds a finished part under that name and reuses it
without reading a byte of SRC.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import xxhash
from fastload.converters.cluster.ray_plan import (
    CTIME,
    FILE,
    INODE,
    KEY,
    LABEL,
    MTIME,
    OFFSET,
    ORDER,
    SIZE,
    PartSource,
)
from fastload.converters.cluster.task_shards import (
    SinkSettings,
    TaskPart,
    dataset_skips,
    finished_dataset,
)
from fastload.converters.packing.job import pack_listing
from fastload.converters.packing.options import check_options
from fastload.converters.sources.items import MemberReader, SourceItem, SourceListing

from fastload.errors import SourceError

_LISTED = (KEY, FILE, OFFSET, SIZE, MTIME, CTIME, INODE, LABEL)  # a row's place and stamps, in its name


def write_listed_part(part: Any, source: PartSource, settings: SinkSettings) -> TaskPart | None:
    """Pack one part (a table of listed rows) into its folder under ``settings.work`` (or find it
    finished there); ``None`` for a part of no rows."""
    if part.num_rows == 0:
        return None
    columns = part.to_pydict()
    name = part_name(columns, source, settings)
    options = pack_options(settings)

    def write(folder: Path) -> tuple[int, list[tuple[str, str]], int]:
        done = finished_dataset(folder)
        if done is not None:
            return done.num_records, dataset_skips(folder), len(done.shards)
        os.makedirs(folder, exist_ok=True)  # a killed task's folder: the loop keeps its finished shards
        report = pack_listing(part_listing(columns, source), options, source.extensions, folder)
        return report.num_records, [(s.rel, s.reason) for s in report.skipped_files], report.resumed_shards

    if settings.in_store:
        from fastload.converters.cluster.store_parts import write_part_to_store

        records, skipped, reused = write_part_to_store(f"{settings.work}/{name}", settings.storage_options, write)
    else:
        records, skipped, reused = write(Path(settings.work) / name)
    order = columns[ORDER]
    return TaskPart(name if records else None, order[0], order[-1], records, skipped, reused)


def part_name(columns: dict[str, list[Any]], source: PartSource, settings: SinkSettings) -> str:
    """The part's folder name: a digest of its listed rows (not their place in the pack: a part
    keeps its name when rows are added before it), the listing's facts and the settings."""
    h = xxhash.xxh3_128(settings.facts().encode())
    h.update(source.facts().encode())
    names = [*_LISTED, *source.fields]
    for row in zip(*(columns[n] for n in names)):
        h.update(repr(row).encode())
        h.update(b"\n")
    return h.hexdigest()


def part_listing(columns: dict[str, list[Any]], source: PartSource) -> SourceListing:
    """The part's rows as the local pack lists them: its items in order, the listing's classes and
    fields, the reader of its bytes rebuilt in this task."""
    if not os.path.exists(source.root):
        raise SourceError(f"{source.root}: not found from this node; the cluster's nodes must see SRC at the path "
                          "the driver listed it (a shared file system)")
    items = [SourceItem(Path(file), rel, label, size, mtime, stamp=(ctime, inode), offset=offset)
             for rel, file, offset, size, mtime, ctime, inode, label in zip(*(columns[n] for n in _LISTED))]
    return SourceListing(Path(source.root), source.layout, items,
                         list(source.classes) if source.classes is not None else None,
                         fields=dict(source.fields), field_values={n: columns[n] for n in source.fields},
                         images=source.images, reader=reader_of(source.reader, {os.fspath(i.path) for i in items}))


def reader_of(spec: tuple[Any, ...], files: set[str]) -> MemberReader | None:
    """The listing's reader from ``ray_plan.reader_spec``: none for whole files, tar members read in
    place, or a table's image column (only the tables of ``files`` opened)."""
    kind = spec[0]
    if kind == "files":
        return None
    if kind == "tars":
        from fastload.converters.sources.tars import TarMembers

        return TarMembers()
    from fastload.converters.sources.table_files import open_table
    from fastload.converters.sources.tables import TableRows

    _, column, limit, names = spec
    return TableRows({Path(p): open_table(Path(p), name) for p, name in names.items() if p in files}, column, limit)


def pack_options(settings: SinkSettings) -> dict[str, Any]:
    """The local pack's checked options from the pack's settings (read threads: this node's default)."""
    w = settings.writer
    return check_options(w["format"], w["shard_size"], None, w["on_error"], None, w.get("quality"), w["check"],
                         w["max_pixels"], False, w["max_file_size"], w.get("mask_storage", "rows"))
