"""Cluster packing from SRC, the tasks: plain Ray tasks (``ray.remote``, no Ray Data pipeline), one
per slice of the plan (converters.cluster.ray_plan); each reads its parts' bytes where they lie
and writes each part as one small dataset (task_shards.write_rows), part after part.

A task returns its parts' ``TaskPart``s (folder names, order ranges, skips), never image bytes. Ray
re-runs a task whose node was lost (``max_retries``); the parts it had finished are found by their
content names and reused, the others written again, so every record is adopted exactly once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastload.converters.cluster.ray_plan import FILE, IMAGE, KEY, OFFSET, SIZE, TaskSlice
from fastload.converters.cluster.task_shards import SinkSettings, TaskPart, write_rows
from fastload.converters.packing.report import progress_bar
from fastload.converters.sources.items import SourceItem

from fastload.errors import PackError, SourceError

RETRIES = 3  # Ray's re-runs of a task whose worker or node died (a task's own error is not retried)


def write_parts(spec: tuple[Any, ...], parts: list[Any], settings: SinkSettings) -> list[TaskPart | None]:
    """One task: each part's rows read (``spec``: ray_plan.reader_spec) and written as one dataset."""
    if not settings.in_store and not os.path.isdir(settings.work):
        raise PackError(f"{settings.work}: not found from this node; OUT must be on a file system every node "
                        "of the cluster sees, at the path the driver sees it")
    read = ReadPayloads(spec)
    written = []
    for part in parts:  # one part's bytes in memory at a time
        payloads = read(part)
        rows = part.drop_columns([FILE, OFFSET, SIZE]).to_pylist()  # order, key, label, fields
        for row, payload in zip(rows, payloads):
            row[IMAGE] = payload
        written.append(write_rows(rows, settings))
    return written


def run_tasks(slices: list[TaskSlice], spec: tuple[Any, ...], settings: SinkSettings,
              progress: bool) -> list[TaskPart | None]:
    """Every slice's task run on the connected Ray cluster; their parts, in slice order. On an error
    (or an interrupt) the tasks still running are cancelled and the error raised."""
    import ray

    task = ray.remote(num_cpus=1, max_retries=RETRIES)(write_parts)
    pending = {task.remote(spec, s.parts, settings): (k, s.listed_bytes) for k, s in enumerate(slices)}
    results: dict[int, list[TaskPart | None]] = {}
    try:
        with progress_bar(sum(s.listed_bytes for s in slices), progress) as bar:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    k, listed = pending.pop(ref)
                    results[k] = ray.get(ref)
                    bar.update(listed)
    finally:
        for ref in pending:
            ray.cancel(ref)
    return [part for k in range(len(slices)) for part in results[k]]


class ReadPayloads:
    """A part's rows' bytes, read with the listing's reader rebuilt in the task."""

    def __init__(self, spec: tuple[Any, ...]) -> None:
        self.spec = spec

    def __call__(self, part: Any) -> list[bytes]:
        columns = part.select([FILE, KEY, SIZE, OFFSET]).to_pydict()
        items = [SourceItem(Path(f), rel, 0, size, 0, offset=offset)
                 for f, rel, size, offset in zip(columns[FILE], columns[KEY], columns[SIZE], columns[OFFSET])]
        payloads = []
        for item, data in zip(items, self._contents(items)):
            if isinstance(data, OSError):
                raise SourceError(f"{item.rel}: cannot be read on this node ({data}); the cluster's nodes must "
                                  "see SRC at the path the driver listed it (a shared file system)")
            payloads.append(data)
        return payloads

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
