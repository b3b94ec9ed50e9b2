"""Cluster packing, write-task side (``PackSink``'s; the CLI's tasks pack listed parts: ray_parts): one
task's rows, sorted by key, written by a ``fastload.Writer`` as a small complete dataset in a work
folder named by their content; the driver adopts its shards.

A task's folder is named by a digest of what it writes (the settings, then every row's key, image,
label and fields, in key order), never by a task id: a task Ray re-runs (a node lost) writes the
same folder again, and a pack re-run after its driver was killed finds the folders already
finished (their manifest written, last, by the Writer) and reuses them without encoding anything.
What goes back to the driver is small (``TaskPart``: a folder name, a key range, the skips), never
image bytes; the index columns stay on disk in the task's folder (or, when OUT is a store URL, in
the task's part in the store: converters.cluster.store_parts).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from fastload.converters.packing.options import digest_on_error
from fastload.converters.sources.samples import KEY
from fastload.converters.sources.writer import Writer

from fastload.errors import DatasetNotFoundError, ManifestError, PackError, SourceError
from fastload.format import MANIFEST_NAME, SKIPPED_REPORT_NAME, read_manifest
from fastload.storage.location import is_remote


@dataclass(frozen=True)
class SinkSettings:
    """What every write task of one sink needs: where to write, which columns are what, the Writer's options."""

    work: str  # the work folder every task writes its dataset in (OUT's pack state, shared by the nodes)
    image: str
    label: str | None
    key: str
    fields: tuple[str, ...]
    types: dict[str, str] | None  # each field's type when the user named them; else typed from the rows
    classes: tuple[str, ...] | None
    writer: dict[str, Any] = field(default_factory=dict)  # format, shard_size, quality, on_error, check, ...
    order: str | None = None  # the column rows are sorted by (None: the key)
    storage_options: dict[str, Any] | None = None  # when ``work`` is a store URL: its client's options
    origin: dict[str, Any] | None = None  # the manifest's "source" and "layout" (``pack --ray``'s SRC), else None

    @property
    def in_store(self) -> bool:
        """Whether the tasks write to an object store (``work`` a URL) rather than a shared folder."""
        return is_remote(self.work)

    def facts(self) -> str:
        """The settings that change what a task writes (not where): part of every task's digest."""
        # on_error as plan digests spell it, so Ray packs made before the rename to "raise" reuse their parts
        writer = dict(self.writer)
        if "on_error" in writer:
            writer["on_error"] = digest_on_error(writer["on_error"])
        return json.dumps([self.image, self.label, self.key, self.fields, self.types, self.classes,
                           sorted(writer.items()), *([self.order] if self.order else [])], default=str)


@dataclass(frozen=True)
class TaskPart:
    """One write task's result: its dataset's folder (``None``: every row skipped) and range of sort
    values (its keys', or its ``order`` column's)."""

    folder: str | None
    first_key: str | int
    last_key: str | int
    records: int
    skipped: list[tuple[str, str]]  # (key, reason) of each row left out (on_error="skip")
    reused_shards: int = 0  # shards of a dataset found finished (by a run before), not written again


def write_rows(rows: Iterable[Mapping[str, Any]], settings: SinkSettings) -> TaskPart | None:
    """Write one task's rows (any order) as a dataset under ``settings.work``; ``None`` for no rows."""
    keyed = sorted(((_order(row, settings), _key(row, settings.key), row) for row in rows), key=lambda okr: okr[0])
    if not keyed:
        return None
    samples = [_sample(key, row, settings) for _, key, row in keyed]
    classes = settings.classes
    if classes is None and settings.label is not None:
        names = [s["label"] for s in samples if isinstance(s["label"], str)]
        if names and len(names) < len(samples):
            odd = next(s for s in samples if not isinstance(s["label"], str))
            raise SourceError(f"row {odd[KEY]!r}: label {odd['label']!r} is not a class name, while other rows' "
                              f"labels in column {settings.label!r} are; give every row a name or every row a number")
        classes = tuple(sorted(set(names))) if names else None  # this task's; the driver maps them to the pack's
    digest = _digest(samples, settings, classes)
    first, last = keyed[0][0], keyed[-1][0]  # sort values: the driver orders the tasks by them
    if settings.in_store:
        from fastload.converters.cluster.store_parts import write_part_to_store

        records, skipped, reused = write_part_to_store(f"{settings.work}/{digest}", settings.storage_options,
                                                       lambda local: write_part(local, samples, settings, classes))
    else:
        records, skipped, reused = write_part(Path(settings.work) / digest, samples, settings, classes)
    return TaskPart(digest if records else None, first, last, records, skipped, reused)


def write_part(folder: Path, samples: list[dict[str, Any]], settings: SinkSettings,
               classes: tuple[str, ...] | None) -> tuple[int, list[tuple[str, str]], int]:
    """Write ``samples`` as a dataset at ``folder`` (or find it finished there by a run before):
    its record count (0: every sample skipped, no dataset), its skips and its shards found finished."""
    done = finished_dataset(folder)
    if done is not None:
        return done.num_records, dataset_skips(folder), len(done.shards)
    writer = Writer(folder, overwrite=True, fields=settings.types, classes=list(classes) if classes else None,
                    workers=1, **settings.writer)
    try:
        for sample in samples:
            writer.write(sample)
        report = writer.close()
    except PackError:
        if writer.items:
            raise
        # every row skipped (on_error="skip"): no dataset from this task, its skips still told
        return 0, [(s.rel, s.reason) for s in writer.skipped], 0
    except BaseException:
        if writer.open:
            writer.abort()
        raise
    return report.num_records, [(s.rel, s.reason) for s in report.skipped_files], 0


def _key(row: Mapping[str, Any], column: str) -> str:
    if column not in row:
        raise SourceError(f"key column {column!r} is not in the rows (columns: {', '.join(row)}); pass key= naming "
                          "a column of unique record names (read_binary_files(include_paths=True) gives 'path')")
    value = row[column]
    if not isinstance(value, str) or not value:
        raise SourceError(f"key column {column!r} holds {type(value).__name__} {value!r}: a record's key is "
                          "non-empty text; make one with map_batches (zero-pad numbers so they sort in order)")
    return value


def _order(row: Mapping[str, Any], settings: SinkSettings) -> str | int:
    """The value a row is sorted by: its key, or its ``order`` column's whole number or text."""
    if settings.order is None:
        return _key(row, settings.key)
    if settings.order not in row:
        raise SourceError(f"order column {settings.order!r} is not in the rows (columns: {', '.join(row)}); "
                          "pass order= naming a column of whole numbers or text, or leave it out to sort by key")
    value = _plain(row[settings.order])
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise SourceError(f"order column {settings.order!r} holds {type(value).__name__} {value!r}; "
                          "rows are sorted by whole numbers or text")
    return value


def _sample(key: str, row: Mapping[str, Any], settings: SinkSettings) -> dict[str, Any]:
    """The Writer's sample for one row: its key, image, label and the named fields."""
    missing = [c for c in (settings.image, *([settings.label] if settings.label else []), *settings.fields)
               if c not in row]
    if missing:
        raise SourceError(f"row {key!r}: column {missing[0]!r} is missing (columns: {', '.join(row)}); "
                          "name the columns with image=, label= and fields=")
    sample = {KEY: key, "image": _plain(row[settings.image])}
    if settings.label is not None:
        sample["label"] = _plain(row[settings.label])
    for name in settings.fields:
        sample[name] = _plain(row[name])
    return sample


def _plain(value: Any) -> Any:
    """A cell as the Writer takes it: NumPy scalars as Python's, a 1-D object array (Arrow list) as a list."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) and value.dtype == object:
        return [_plain(v) for v in value]
    return value


def _digest(samples: list[dict[str, Any]], settings: SinkSettings, classes: tuple[str, ...] | None) -> str:
    """A digest of everything the task writes: equal rows and settings, equal folder name."""
    h = xxhash.xxh3_128(settings.facts().encode())
    h.update(json.dumps(classes).encode())
    for sample in samples:
        for name, value in sample.items():
            h.update(name.encode() + b"\x00")
            if isinstance(value, (bytes, bytearray, memoryview)):
                h.update(len(value).to_bytes(8, "little"))
                h.update(value)
            elif isinstance(value, np.ndarray):
                h.update(f"{value.dtype}{value.shape}".encode())
                h.update(np.ascontiguousarray(value).tobytes())
            else:
                h.update(repr(value).encode())
            h.update(b"\x00")
    return h.hexdigest()


def finished_dataset(folder: Path) -> Any:
    """The manifest of a dataset a task finished at ``folder`` before, with all its shards; else None."""
    if not (folder / MANIFEST_NAME).is_file():
        return None
    try:
        manifest = read_manifest(folder)
    except (ManifestError, DatasetNotFoundError):
        return None
    return manifest if all(os.path.isfile(folder / s.file) for s in manifest.shards) else None


def dataset_skips(folder: Path) -> list[tuple[str, str]]:
    """The (key, reason) of each record the finished dataset at ``folder`` left out (its skipped report)."""
    path = folder / SKIPPED_REPORT_NAME
    if not path.is_file():
        return []
    return [(line["path"], line["reason"]) for line in map(json.loads, path.read_text().splitlines()) if line]
