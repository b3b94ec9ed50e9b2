"""Cluster packing, driver side: the write tasks' datasets adopted as one, in key order: their shards
linked into OUT under the pack's numbers, their index columns joined column by column (NumPy, no
per-record Python objects), the skipped report, then the manifest, last; the work folder goes.

Record order is a function of the rows, never of scheduling: each task sorted its rows by key, and
the tasks' datasets are put in order of their first key (their digest breaks a tie). When two
tasks' key ranges overlap (the source was not in key order), a warning says so: each task's
records stay in key order, and ``ds.sort(key)`` before the sink gives one global key order.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shutil
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from fastload.converters.cluster.task_shards import SinkSettings, TaskPart
from fastload.converters.packing.report import PackReport, write_skipped_report
from fastload.converters.sources.items import Skip

from fastload.errors import PackError
from fastload.format import (
    NO_LABEL,
    PACK_STATE_DIR,
    SKIPPED_REPORT_NAME,
    IndexFile,
    Manifest,
    ShardInfo,
    fsync_dir,
    read_manifest,
    shard_name,
    write_column_pieces,
    write_manifest,
)


def adopt(folder: Path, work: Path, parts: list[TaskPart | None], settings: SinkSettings) -> PackReport:
    """Make the dataset at ``folder`` from the tasks' datasets in ``work`` (see the module docstring)."""
    written, skipped = ordered_parts(str(folder), parts)
    manifests = [read_manifest(work / p.folder) for p in written]  # type: ignore[operator]
    shards = []
    for source, shard in placed_shards(written, manifests):
        _link(work / source, folder / shard.file)
        shards.append(shard)
    classes, index = join_index(folder, work, written, manifests, settings)
    report_path = write_skipped_report(folder, skipped)
    manifest = pack_manifest(manifests, shards, index, classes, skipped, report_path is not None,
                             plan_of(written, settings), settings.origin)
    fsync_dir(folder)  # the shards' names are durable before the manifest names them
    write_manifest(folder, manifest)
    shutil.rmtree(folder / PACK_STATE_DIR, ignore_errors=True)  # every task's datasets, retried ones' too: no orphan
    return finished_report(folder, manifest, written, skipped, report_path)


def ordered_parts(where: str, parts: list[TaskPart | None]) -> tuple[list[TaskPart], list[Skip]]:
    """The tasks that wrote a dataset, in order of their sort values (a digest breaks a tie), and
    every task's skips; PackError when no record was written."""
    written = sorted((p for p in parts if p is not None and p.folder is not None),
                     key=lambda p: (p.first_key, p.last_key, p.folder or ""))
    skipped = [Skip(key, reason) for p in parts if p is not None for key, reason in p.skipped]
    if not written:
        first = f" (first: {skipped[0].rel}: {skipped[0].reason})" if skipped else ""
        raise PackError(f"{where}: no record was written, {len(skipped)} skipped{first}; a dataset needs at least one")
    for before, after in itertools.pairwise(written):
        if after.first_key <= before.last_key:
            warnings.warn(f"{where}: write tasks' key ranges overlap ({before.first_key!r}..{before.last_key!r} and "
                          f"{after.first_key!r}..{after.last_key!r}): records are in key order within each task only; "
                          "sort the dataset by its key (ds.sort(key)) before the sink for one global order",
                          stacklevel=4)
            break
    return written, skipped


def plan_of(written: list[TaskPart], settings: SinkSettings) -> str:
    """The pack's plan digest: its settings and its tasks' datasets (named by content), in order."""
    return xxhash.xxh3_128(settings.facts().encode() + "".join(p.folder for p in written).encode()).hexdigest()  # type: ignore[misc]


def placed_shards(written: list[TaskPart], manifests: list[Manifest]) -> Iterator[tuple[str, ShardInfo]]:
    """Each task's shard (``<task folder>/<its file>``) with its entry in the pack, renamed to its number there."""
    _same_fields(written, manifests)
    number = 0
    for part, manifest in zip(written, manifests):
        for shard in manifest.shards:
            yield f"{part.folder}/{shard.file}", dataclasses.replace(shard, file=shard_name(manifest.storage, number))
            number += 1


def join_index(folder: Path, work: Path, written: list[TaskPart], manifests: list[Manifest],
               settings: SinkSettings) -> tuple[list[str] | None, dict[str, IndexFile]]:
    """The pack's class names, and its index columns written to ``folder/index/`` from the tasks'
    (in ``work``), column by column, task by task: memory holds one task's piece."""
    _same_fields(written, manifests)
    classes, label_maps = _classes(manifests, settings.classes)
    index = {}
    for name in manifests[0].index:
        dtype, length = _joined_shape(name, written, manifests, work)
        index[name] = write_column_pieces(folder, name, dtype, length,
                                          _joined(name, written, manifests, work, label_maps))
    return classes, index


def pack_manifest(manifests: list[Manifest], shards: list[ShardInfo], index: dict[str, IndexFile],
                  classes: list[str] | None, skipped: list[Skip], with_report: bool, plan: str,
                  origin: dict[str, Any] | None = None) -> Manifest:
    """The pack's manifest: the first task's, with the pack's shards, index, classes and facts;
    ``origin``: what it was packed from (``source``, ``layout``; default: a Ray Data pipeline's rows)."""
    from fastload import __version__

    first = manifests[0]
    return dataclasses.replace(
        first, num_records=sum(m.num_records for m in manifests), total_bytes=sum(s.data_bytes for s in shards),
        kind="images" if all(m.kind == "images" for m in manifests) else "files", classes=classes,
        shards=shards, index=index,
        packed={**first.packed, "source": "a Ray Data pipeline (fastload.ray.PackSink)", "layout": "rows",
                **(origin or {}), "cluster": "ray", "fastload_version": __version__,
                "created": datetime.now(UTC).isoformat(timespec="seconds"), "plan": plan,
                "skipped": len(skipped), "skipped_report": SKIPPED_REPORT_NAME if with_report else None,
                "tasks": len(manifests),
                "encoded": {**first.packed.get("encoded", {}),
                            "images": sum(m.packed.get("encoded", {}).get("images", 0) for m in manifests)}})


def finished_report(out: Path, manifest: Manifest, written: list[TaskPart], skipped: list[Skip],
                    report_path: Path | None) -> PackReport:
    """The pack's report; ``resumed_shards``: the shards of tasks' datasets a run before had finished."""
    return PackReport(out=out, storage=manifest.storage, num_records=manifest.num_records,
                      total_bytes=manifest.total_bytes, num_shards=len(manifest.shards), skipped=len(skipped),
                      skipped_files=skipped, skipped_report=report_path,
                      resumed_shards=sum(p.reused_shards for p in written))


def _link(source: Path, target: Path) -> None:
    """``target`` becomes the shard at ``source``: a hard link (the task's copy stays until the manifest
    is written, so a driver killed meanwhile loses nothing), or a rename where links are refused."""
    tmp = target.with_name(target.name + ".tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:  # no hard links here: moved (a re-run then writes that task's rows again)
        os.rename(source, tmp)
    os.replace(tmp, target)


def _same_fields(parts: list[TaskPart], manifests: list[Manifest]) -> None:
    first = manifests[0]
    for part, manifest in zip(parts[1:], manifests[1:]):
        if manifest.fields != first.fields or manifest.storage != first.storage:
            differ = next((n for n in {**first.fields, **manifest.fields}
                           if first.fields.get(n) != manifest.fields.get(n)), "storage")
            raise PackError(f"rows from {part.first_key!r} on: field {differ!r} is {manifest.fields.get(differ)!r}, "
                            f"rows from {parts[0].first_key!r} on made it {first.fields.get(differ)!r} (typed by each "
                            "task's first row); name every field's type with fields={...}")


def _classes(manifests: list[Manifest], given: tuple[str, ...] | None) -> tuple[list[str] | None, list[np.ndarray | None]]:
    """The pack's class names and, per task, its label ids → the pack's (None: kept as they are)."""
    if given is not None:
        return list(given), [None] * len(manifests)
    named = [bool(m.classes) for m in manifests]
    if not any(named):
        return None, [None] * len(manifests)
    if not all(named):
        raise PackError("some rows' labels are class names and others' are numbers; give every row a name, "
                        "or every row a number, or pass classes=[...]")
    classes = sorted({c for m in manifests for c in m.classes or []})  # as a folder's: names in sorted order
    table = np.array(classes, dtype=object)
    return classes, [np.searchsorted(table, np.array(m.classes, dtype=object)).astype(np.int64) for m in manifests]


def _joined(name: str, parts: list[TaskPart], manifests: list[Manifest], work: Path,
            label_maps: list[np.ndarray | None]) -> Iterator[np.ndarray]:
    """Column ``name`` of every task's index, piece by piece in order: shard numbers moved after the
    tasks' before, labels mapped to the pack's classes, offsets into a joined blob shifted by its length."""
    shard_base, shift = 0, 0
    flat = _offsets_of(name, manifests[0])
    for k, (part, manifest) in enumerate(zip(parts, manifests)):
        column = _load(work / part.folder, manifest.index[name])  # type: ignore[operator]
        if name == "shard":
            column = column + np.asarray(shard_base, dtype=column.dtype)
        elif name == "label" and label_maps[k] is not None:
            labels = np.asarray(column)
            column = np.where(labels >= 0, label_maps[k][np.clip(labels, 0, None)], NO_LABEL).astype(labels.dtype)  # type: ignore[index]
        elif flat:
            ends = np.asarray(column, dtype=np.int64)
            column = (ends if k == 0 else ends[1:]) + shift
            shift += int(ends[-1])
        yield column
        shard_base += len(manifest.shards)


def _joined_shape(name: str, parts: list[TaskPart], manifests: list[Manifest], work: Path) -> tuple[np.dtype, int]:
    """The joined column's dtype and length, from the pieces' headers (no value read)."""
    flat = _offsets_of(name, manifests[0])
    lengths, dtype = 0, None
    for k, (part, manifest) in enumerate(zip(parts, manifests)):
        column = _load(work / part.folder, manifest.index[name])  # type: ignore[operator]
        dtype = np.dtype(np.int64) if flat else np.result_type(*(d for d in (dtype, column.dtype) if d is not None))
        lengths += len(column) - (1 if flat and k > 0 else 0)
    return dtype, lengths  # type: ignore[return-value]


def _offsets_of(name: str, manifest: Manifest) -> bool:
    """Whether column ``name`` holds the offsets into a blob (or values) column: joined by shifting."""
    base = name.removesuffix(".offsets")
    return name.endswith(".offsets") and any(f"{base}.{s}" in manifest.index for s in ("blob", "values"))


def _load(folder: Path, entry: IndexFile) -> np.ndarray:
    return np.lib.format.open_memmap(folder / entry.file, mode="r")  # refuses object dtypes: no pickle
