"""Pack stage, shard side of a map-style dataset: one shard written whole, from its items, by the
process that reads them (a worker process, or the packing process itself).

A worker that writes the shard it reads sends back its index columns (the shard's record, small),
never its images: pickling every payload back through a pipe cost the packing process a copy
and an unpickle of each, and measured 0.55x the folder pack on 2 cores. The shard is written to its
temporary file in OUT's pack state; the packing process renames it into place and journals it, in
shard order, so only it ever makes a shard visible (a worker whose packing process was killed
exits at its next item, touching nothing: converters.packing.dataset_reads).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastload.converters.packing.plan import ShardPlan
from fastload.converters.sources.samples import KEY, Schema
from fastload.converters.sources.torch_dataset import Read, ReadSettings, json_values, read_item
from fastload.converters.writers import WRITERS
from fastload.converters.writers.behind import WriteBehind, WriteFailed
from fastload.converters.writers.records import add_record, end_shard_record, new_shard_record

from fastload.format import PACK_STATE_DIR, shard_name
from fastload.format.files import create_new


@dataclass(frozen=True)
class ShardTask:
    """What a shard's writer needs besides the dataset: where, how, and the keys already taken."""

    shard: ShardPlan
    out: str
    storage: str
    shard_size: int
    file_types: dict[str, str]
    on_error: str
    taken: Collection[str] = frozenset()  # keys of earlier shards' items (those this shard's may repeat)

    @property
    def name(self) -> str:
        return shard_name(self.storage, self.shard.number)


@dataclass
class ShardOutcome:
    """A shard's result: ``record`` (finalize's columns; its file at ``tmp``), or the first item that
    cannot be packed under on_error="fail" (``failed``, with the records written before it), or
    ``stopped`` (the pack stopped it), or ``error`` (the shard could not be written)."""

    number: int
    tmp: str = ""
    record: dict[str, Any] = field(default_factory=dict)
    failed: Read | None = None
    stopped: bool = False
    error: BaseException | None = None


def read_items(dataset: Any, settings: ReadSettings, schema: Schema, shard: ShardPlan) -> Iterator[Read]:
    """The shard's items read here, in order."""
    return (read_item(dataset, schema, settings, index) for index in range(shard.start, shard.end))


def write_shard(reads: Iterator[Read], task: ShardTask, stopping: Callable[[], bool]) -> ShardOutcome:
    """Write ``task.shard``'s items (``reads``, in order) as one shard to a temporary file;
    ``stopping()`` is asked before each item (the pack failed or was interrupted: stop now)."""
    shard, file_types = task.shard, task.file_types
    tmp = Path(task.out) / PACK_STATE_DIR / f"{task.name}.tmp"
    record = new_shard_record(task.name, file_types, digest=shard.digest, stamps="", encoded=0, keys=[], labels=[],
                              values={})
    outcome = ShardOutcome(shard.number, str(tmp), record)

    def done(file_bytes: int, data_offset: int) -> None:
        record["bytes"], record["data_offset"] = file_bytes, data_offset

    def make() -> Any:
        os.close(create_new(tmp))
        return WRITERS[task.storage](tmp, task.shard_size)

    behind = WriteBehind()
    behind.start_shard(task.name, make, done, lambda: tmp.unlink(missing_ok=True))
    keys: set[str] = set()
    try:
        for _ in range(shard.start, shard.end):
            if stopping():
                outcome.stopped = True
                break
            read = _unique(next(reads), keys, task.taken)
            if read.payloads is None or read.values is None:
                if task.on_error == "fail":
                    outcome.failed = read
                    break
                record["skips"].append([read.key or f"{read.index:08d}", f"item {read.index}: {read.reason}"])
                continue
            keys.add(read.key)
            _add(record, behind, read, file_types)
        if outcome.failed is None and not outcome.stopped:
            end_shard_record(record, behind)
            behind.close()
    except WriteFailed as failed:
        outcome.error = failed.cause
    finally:
        behind.cancel()  # stopped or failed: the open shard is aborted and its file removed
    if outcome.failed is not None or outcome.stopped or outcome.error is not None:
        tmp.unlink(missing_ok=True)
    return outcome


def _unique(read: Read, keys: set[str], taken: Collection[str]) -> Read:
    """``read``, or why it cannot be packed when an earlier item has its key."""
    if read.payloads is not None and (read.key in keys or read.key in taken):
        return repeated_key(read.index, read.key)
    return read


def repeated_key(index: int, key: str) -> Read:
    """Item ``index``, which cannot be packed: an earlier item has its key."""
    return Read(index, reason=f"{KEY} {key!r} was given to an earlier item; keys name one item each")


def _add(record: dict[str, Any], behind: WriteBehind, read: Read, file_types: dict[str, str]) -> None:
    assert read.payloads is not None and read.values is not None
    payloads = read.payloads
    add_record(record, behind, read.index, payloads.data, payloads.checksum, payloads.width, payloads.height,
               payloads.files, file_types)
    record["keys"].append(read.key)
    record["labels"].append(read.label)
    for name, value in json_values(read.values).items():
        record["values"].setdefault(name, []).append(value)
    record["encoded"] += payloads.encoded
