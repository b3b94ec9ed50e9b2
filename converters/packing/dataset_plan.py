"""Shard plan and resume check of a map-style dataset pack: records per shard from the first items,
kept in the journal; a resumed shard trusted only when the items it holds read back the same.

A dataset has no file sizes or mtimes to plan from or to tell a change by. So the plan (item count,
records per shard, the fields typed from the first item) is written to ``OUT/.pack/`` before any
shard, and a resume reads it back rather than planning again; each finished shard's journal entry
keeps its records' checksums and index values, and a resume re-reads a few items of every finished
shard (its first, its last and one at random) and refuses to go on when one differs: a source that
changed, or that is not deterministic, is never mixed into one dataset.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import xxhash
from fastload.converters.packing.dataset_reads import ItemReads
from fastload.converters.packing.plan import ShardPlan
from fastload.converters.sources.samples import Schema
from fastload.converters.sources.torch_dataset import Read, ReadSettings, read_item

from fastload.errors import PackError, SourceError
from fastload.format import PACK_STATE_DIR, write_atomically
from fastload.format.files import read_regular
from fastload.format.folder import DATASET_PLAN_NAME as PLAN_NAME

_FIRST = 8  # good items whose sizes set the records per shard


@dataclass(frozen=True)
class DatasetPlan:
    """What a resume must find again: the items, their cut into shards, the fields, the options."""

    count: int
    per_shard: int
    types: dict[str, str]
    has_label: bool
    classes: list[str] | None
    options: dict[str, Any]

    def shards(self) -> list[ShardPlan]:
        base = json.dumps(asdict(self), sort_keys=True)
        starts = range(0, self.count, self.per_shard)
        return [ShardPlan(k, start, min(start + self.per_shard, self.count),
                          xxhash.xxh3_128_hexdigest(f"{base}\n{k},{start}".encode()))
                for k, start in enumerate(starts)]

    def schema(self) -> Schema:
        schema = Schema(self.types, self.classes)
        schema.has_label = self.has_label
        return schema

    def save(self, folder: Path) -> None:
        write_atomically(folder / PACK_STATE_DIR / PLAN_NAME, json.dumps(asdict(self)).encode())

    @staticmethod
    def load(folder: Path) -> DatasetPlan | None:
        try:
            return DatasetPlan(**json.loads(read_regular(folder / PACK_STATE_DIR / PLAN_NAME, 2**24)))
        except (OSError, ValueError, TypeError):
            return None


def first_plan(dataset: Any, schema: Schema, settings: ReadSettings, shard_size: int, on_error: str,
               options: dict[str, Any]) -> DatasetPlan:
    """The plan of a new pack: fields typed by the first good item, records per shard from the sizes
    of the first few (read here, in the packing process; the workers read them again)."""
    sizes: list[int] = []
    for index in range(len(dataset)):
        got = read_item(dataset, schema, settings, index)
        if got.payloads is None:
            if on_error != "skip":
                raise item_error(got)
            continue
        sizes.append(len(got.payloads.data) + sum(len(data) for data, _, _ in got.payloads.files))
        if len(sizes) == _FIRST:
            break
    if not sizes:
        raise PackError(f"none of the dataset's {len(dataset)} items could be packed; a dataset needs at least one")
    per_shard = max(1, shard_size * len(sizes) // max(1, sum(sizes)))
    return DatasetPlan(len(dataset), per_shard, dict(schema.types or {}), schema.has_label, schema.classes, options)


def item_error(got: Read) -> SourceError:
    """The error of an item that cannot be packed, chained to the dataset's own exception."""
    error = SourceError(f"dataset item {got.index}: {got.reason}; fix the dataset, or pass on_error='skip'")
    if got.error is not None:  # read in this process: the dataset's own exception
        error.__cause__ = got.error
    elif got.trace:  # from a worker process: its traceback, as text
        error.add_note(f"in the worker process that read item {got.index}:\n{got.trace.rstrip()}")
    return error


def check_resumed(reads: ItemReads, schema: Schema, records: list[dict[str, Any]], where: Path) -> None:
    """Re-read the first, the last and one random item of each finished shard; SourceError for the
    first that differs from what the interrupted pack wrote."""
    picks: dict[int, dict[str, Any]] = {}
    for record in records:
        written = range(len(record["items"]))
        for k in {0, len(written) - 1, random.choice(written)} if len(written) else ():
            picks[record["items"][k]] = {
                "key": record["keys"][k], "label": record["labels"][k], "checksum": record["checksums"][k],
                "files": [record["files"][name]["checksums"][k] for name in schema.file_types],
                "values": {name: values[k] for name, values in record["values"].items()}}
    for got in reads.read(schema, sorted(picks)):
        what = _difference(picks[got.index], got)
        if what is not None:
            raise SourceError(f"{where}: item {got.index} differs from what the interrupted pack wrote ({what}); "
                              "the dataset is not deterministic, or changed: pass overwrite=True to start over")


def _difference(stored: dict[str, Any], got: Read) -> str | None:
    if got.payloads is None:
        return f"it now cannot be packed: {got.reason}"
    now = got.summary()
    for part, name in (("checksum", "its image"), ("files", "its file fields"), ("key", "its key"),
                       ("label", "its label")):
        if now[part] != stored[part]:
            return f"{name}: {stored[part]!r} then, {now[part]!r} now" if part in ("key", "label") else name
    for name, value in stored["values"].items():
        if json.dumps(now["values"].get(name)) != json.dumps(value):  # NaN equals NaN here
            return f"field {name!r}"
    return None
