"""Cluster packing from SRC (``fastload pack SRC --ray``): the local pack's own listing, made on the
driver (paths, sizes, labels, fields: no image is read), as a Ray dataset of rows in listing order;
each task reads its rows' bytes (whole files, tar members, table cells) and ``PackSink`` writes
them sorted by their place in the listing, so records, order, labels and fields are a local pack's.

Blocks hold about ``shard_size`` of listed bytes each: one block is one write task, whose shards
are its own (boundaries may differ from a local pack's; records and index contents may not).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from fastload.converters.cluster.ray_sink import PackSink
from fastload.converters.cluster.task_shards import TaskPart
from fastload.converters.packing.options import check_options, check_out_location, default_out
from fastload.converters.packing.report import PackReport
from fastload.converters.sources.items import (
    Layout,
    SourceItem,
    SourceListing,
    normalize_extensions,
)
from fastload.converters.sources.listing import list_to_pack

from fastload.errors import PackError, SourceError
from fastload.format import NO_LABEL, StorageKind
from fastload.optional import require
from fastload.storage.location import is_remote

# The rows' own columns; a source's fields keep their names beside them (a field name never starts with "__")
ORDER, KEY, IMAGE, LABEL, FILE, OFFSET, SIZE = "__order", "__path", "__image", "__label", "__file", "__offset", "__size"


def pack_on_ray(src: str | os.PathLike[str], out: str | os.PathLike[str] | None, *, address: str | None,
                format: StorageKind = "lmdb", shard_size: str | int = "256MB", extensions: list[str] | None = None,
                on_error: str = "fail", overwrite: bool = False, layout: Layout = "auto", check: str = "header",
                max_pixels: int, max_file_size: str | int, mask_storage: str = "rows", progress: bool = True, **listing_options: Any,
                ) -> PackReport:
    """Pack ``src`` (a folder, CSV/JSONL list, tables or WebDataset tars) into ``out`` on Ray: at
    ``address`` (``"auto"``: the running cluster; ``None``: a local Ray started for this pack, or
    the one this process is connected to already). ``listing_options``: ``list_to_pack``'s
    (``root``, ``allow_outside_root``, ``table``); the listing's skips are the report's too."""
    started = time.perf_counter()
    if is_remote(src) or (out is not None and is_remote(out)):
        raise SourceError(f"{src if is_remote(src) else out}: --ray packs a local (or shared) folder into a folder "
                          "every node sees; copy a store prefix to a shared folder first, and upload OUT after")
    options = check_options(format, shard_size, None, on_error, None, None, check, max_pixels, False,
                            max_file_size, mask_storage)
    src_path = Path(src)
    out_path = Path(os.path.realpath(out if out is not None else default_out(src_path)))
    listing = list_to_pack(src, None, src_path, layout=layout, extensions=normalize_extensions(extensions),
                           on_error=on_error, options=options, sidecars=False, file_columns=(), **listing_options)
    check_out_location(src_path, listing.root, out_path)
    if listing.file_fields:
        raise SourceError(f"{src}: its records have file fields ({', '.join(listing.file_fields)}), which --ray "
                          "does not pack yet; pack without --ray")
    import ray
    labelled = listing.classes is not None or any(item.label != NO_LABEL for item in listing.items)
    sink = ListedSink(out_path, image=IMAGE, label=LABEL if labelled else None, key=KEY, order=ORDER,
                     fields=dict(listing.fields), classes=listing.classes, format=format, shard_size=shard_size,
                     overwrite=overwrite, on_error=on_error, check=check, max_pixels=max_pixels,  # type: ignore[arg-type]
                     max_file_size=max_file_size, mask_storage=mask_storage)  # type: ignore[arg-type]
    sink.listed_skips = tuple((s.rel, s.reason) for s in listing.skipped)
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address or "local", include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    before = context.execution_options.preserve_order, context.enable_progress_bars
    try:
        context.execution_options.preserve_order = True  # blocks reach the write tasks in listing order
        context.enable_progress_bars = progress
        reader = _reader_spec(listing)
        blocks = [_block(listing, part) for part in _parts(listing.items, sink.shard_bytes)]
        ds = ray.data.from_arrow(blocks).map_batches(_ReadPayloads(reader), batch_format="pyarrow",
                                                     batch_size=None, zero_copy_batch=True)
        ds.write_datasink(sink)
    finally:
        context.execution_options.preserve_order, context.enable_progress_bars = before
        if started_here:
            ray.shutdown()
    assert sink.report is not None
    sink.report.elapsed_s = time.perf_counter() - started
    return sink.report


class ListedSink(PackSink):
    """PackSink for listed rows: a block is one task's rows already (so Ray runs the read and the
    write in one task, the bytes never in its object store), and the listing's skips join the tasks'."""

    listed_skips: tuple[tuple[str, str], ...] = ()

    @property
    def min_bytes_per_write(self) -> None:  # type: ignore[override]
        return None

    def on_write_complete(self, write_result: Any) -> None:
        if self.listed_skips:  # a part with no dataset: the skips alone
            write_result.write_returns = [*write_result.write_returns, TaskPart(None, "", "", 0, [*self.listed_skips])]
        super().on_write_complete(write_result)


def _parts(items: list[SourceItem], shard_bytes: int) -> Iterator[range]:
    """Consecutive runs of items of at most ``shard_bytes`` listed bytes (or one item): a block, one
    write task, cut as the Writer cuts a shard (before the item that would pass it): one shard each."""
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
    """One block's rows: each item's place, key (its path as a local pack stores it), where its bytes
    are, its label and its fields' values; a block is written whole by one task."""
    pa = require("pyarrow", "fastload pack --ray")
    items = listing.items[part.start:part.stop]
    columns: dict[str, Any] = {
        ORDER: pa.array(np.arange(part.start, part.stop, dtype=np.int64)),
        KEY: [item.rel for item in items], FILE: [os.fspath(item.path) for item in items],
        OFFSET: pa.array([item.offset for item in items], pa.int64()),
        SIZE: pa.array([item.size for item in items], pa.int64()),
        LABEL: pa.array([item.label for item in items], pa.int64()),
    }
    for name in listing.fields:
        values = listing.field_values[name][part.start:part.stop]
        columns[name] = [v.item() if isinstance(v, np.generic) else v for v in values]
    return pa.table(columns)


def _reader_spec(listing: SourceListing) -> tuple[Any, ...]:
    """How a task reads its rows' bytes, as plain data it can be sent: whole files, tar members, or
    a table's image column (its files reopened in the task)."""
    if listing.reader is None:
        return ("files",)
    if listing.layout == "webdataset":
        return ("tars",)
    if listing.layout == "table":
        tables = listing.reader.tables  # type: ignore[attr-defined]
        return ("table", listing.reader.column, listing.reader.limit,  # type: ignore[attr-defined]
                {os.fspath(path): t.name for path, t in tables.items()})
    raise PackError(f"{listing.root}: a {listing.layout} source cannot be read by Ray tasks yet; pack without --ray")


class _ReadPayloads:
    """A task's step: each row's bytes read (the listing's reader, rebuilt in the task), as ``__image``."""

    def __init__(self, spec: tuple[Any, ...]) -> None:
        self.spec = spec

    def __call__(self, batch: Any) -> Any:
        pa = require("pyarrow", "fastload pack --ray")
        columns = batch.to_pydict()
        items = [SourceItem(Path(f), rel, 0, size, 0, offset=offset)
                 for f, rel, size, offset in zip(columns[FILE], columns[KEY], columns[SIZE], columns[OFFSET])]
        payloads = []
        for item, data in zip(items, self._contents(items)):
            if isinstance(data, OSError):
                raise SourceError(f"{item.rel}: cannot be read on this node ({data}); the cluster's nodes must "
                                  "see SRC at the path the driver listed it (a shared file system)")
            payloads.append(data)
        return batch.drop_columns([FILE, OFFSET, SIZE]).append_column(IMAGE, pa.array(payloads, pa.binary()))

    def _contents(self, items: list[SourceItem]) -> Iterator[bytes | OSError]:
        kind = self.spec[0]
        if kind == "files":
            for item in items:
                try:
                    yield Path(item.path).read_bytes()
                except OSError as exc:
                    yield exc
        elif kind == "tars":
            from fastload.converters.sources.tars import TarMembers

            yield from TarMembers().contents(items)
        else:
            from fastload.converters.sources.table_files import open_table
            from fastload.converters.sources.tables import TableRows

            _, column, limit, names = self.spec
            tables = {Path(p): open_table(Path(p), name) for p, name in names.items()
                      if any(os.fspath(item.path) == p for item in items)}
            yield from TableRows(tables, column, limit).contents(items)
