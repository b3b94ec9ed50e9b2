"""Pack stage, shard side of a map-style dataset: shards written whole, one after another, from
their items, by the process that reads them (a worker process, or a thread of the packing process),
one write-behind thread per writer: a shard's commit and fsync overlap the next one's reads.

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
    cannot be packed under on_error="raise" (``failed``, with the records written before it), or
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


def write_shards(next_task: Callable[[], ShardTask | None], reads: Callable[[ShardTask], Iterator[Read]],
                 stopping: Callable[[], bool], report: Callable[[ShardOutcome], None]) -> int:
    """Write shard after shard (``next_task()`` until None; each from ``reads(task)``, its items in
    order) to their temporary files, each one's outcome to ``report`` once its file is synced (from
    the writer thread: the next shard's items are read meanwhile) or at once when it cannot be
    written; stop at the first shard that fails, or when ``stopping()`` (asked before each item).
    Returns the number of outcomes reported."""
    behind = WriteBehind()
    reported: list[ShardOutcome] = []
    names: dict[str, int] = {}
    keys: set[str] = set()  # of every item written here: a repeat within these shards is found here

    def send(outcome: ShardOutcome) -> None:
        reported.append(outcome)
        report(outcome)

    try:
        while (task := next_task()) is not None:
            names[task.name] = task.shard.number
            outcome = _write_one(reads(task), task, stopping, behind, keys, send)
            if outcome is not None:  # failed or stopped: the shards ended before it are finished first
                behind.cancel(finish_queued=not outcome.stopped)
                if not outcome.stopped:
                    send(outcome)
                break
        else:
            behind.close()
    except WriteFailed as failed:
        send(ShardOutcome(names.get(failed.shard, -1), error=failed.cause))
    finally:
        behind.cancel(finish_queued=False)  # after an error: the open shard is aborted and its file removed
    return len(reported)


def _write_one(reads: Iterator[Read], task: ShardTask, stopping: Callable[[], bool], behind: WriteBehind,
               keys: set[str], send: Callable[[ShardOutcome], None]) -> ShardOutcome | None:
    """Hand one shard's records to ``behind``; its outcome is sent once its file is synced. Returns
    the outcome of a shard that failed or was stopped (its file is removed), else None."""
    tmp = Path(task.out) / PACK_STATE_DIR / f"{task.name}.tmp"
    record = new_shard_record(task.name, task.file_types, digest=task.shard.digest, stamps="", encoded=0, keys=[],
                              labels=[], values={})
    outcome = ShardOutcome(task.shard.number, str(tmp), record)

    def done(file_bytes: int, data_offset: int) -> None:
        record["bytes"], record["data_offset"] = file_bytes, data_offset
        send(outcome)

    def make() -> Any:
        os.close(create_new(tmp))
        return WRITERS[task.storage](tmp, task.shard_size)

    behind.start_shard(task.name, make, done, lambda: tmp.unlink(missing_ok=True))
    for _ in range(task.shard.start, task.shard.end):
        if stopping():
            outcome.stopped = True
            return outcome
        read = _unique(next(reads), keys, task.taken)
        if read.payloads is None or read.values is None:
            if task.on_error != "skip":
                outcome.failed = read
                return outcome
            record["skips"].append([read.key or f"{read.index:08d}", f"item {read.index}: {read.reason}"])
            continue
        keys.add(read.key)
        _add(record, behind, read, task.file_types)
    end_shard_record(record, behind)
    return None


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
