"""Pack of a map-style dataset: plan (or the interrupted pack's, checked) → shards written from the
items in worker processes (converters.packing.dataset_reads) → each renamed into place and
journaled here, in shard order → index + manifest.

The records are written as the Python writer writes samples (converters.sources.writer); the
shards and their journal entries as a pack writes them (converters.packing.packer), so that a pack
killed mid-way resumes from its finished shards and ends with the index an uninterrupted one has.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Self

import xxhash
from fastload.converters.finalize import finalize
from fastload.converters.packing.dataset_plan import (
    DatasetPlan,
    check_resumed,
    first_plan,
    item_error,
)
from fastload.converters.packing.dataset_reads import ItemReads
from fastload.converters.packing.dataset_shards import ShardOutcome, ShardTask, repeated_key
from fastload.converters.packing.interrupt import interrupt_between_files
from fastload.converters.packing.options import digest_on_error
from fastload.converters.packing.plan import Journal, JournalWriteError
from fastload.converters.packing.report import PackReport, write_error
from fastload.converters.sources.items import SourceItem, SourceListing
from fastload.converters.sources.samples import Schema
from fastload.converters.sources.torch_dataset import ReadSettings, stored_types

from fastload.errors import PackError, SourceError
from fastload.format import FORMAT_VERSION, PACK_STATE_DIR, Manifest, shard_name
from fastload.format.files import ensure_dir, remove_entry
from fastload.format.layout import SHARD_NAME


class DatasetPackJob:
    """``pack_into(folder)`` packs ``dataset`` there, resuming an interrupted pack of it (the pack
    job of converters.packing.local's ``pack_local``); used as a context manager, which starts and
    stops the worker processes."""

    def __init__(self, dataset: Any, options: dict[str, Any], progress: bool | None, overwrite: bool) -> None:
        if options["reencode"] and options["reencode"]["max_side"] or options["restart_markers"]:
            raise ValueError("max_side= and restart_markers= are for packs of image files; a dataset's "
                             "images are stored as given, or encoded (quality=)")
        self.dataset, self.options, self.overwrite = dataset, options, overwrite
        self.progress = sys.stderr.isatty() if progress is None else progress
        quality = options["reencode"]["quality"] if options["reencode"] else None
        self.settings = ReadSettings(quality, options["check"] == "decode", options["max_pixels"],
                                     options["max_file_size"], options.get("mask_storage", "rows"))
        # what a resume must find unchanged (the worker count changes nothing written)
        self.content = {"format_version": FORMAT_VERSION, "storage": options["storage"], "quality": quality,
                        "mask_storage": self.settings.mask_storage,
                        "on_error": digest_on_error(options["on_error"]),
                        **{k: options[k] for k in ("shard_size", "check", "max_pixels")}}
        classes = getattr(dataset, "classes", None)  # torchvision's datasets name their classes so
        self.classes = list(classes) if isinstance(classes, (list, tuple)) and classes and all(
            isinstance(c, str) for c in classes) else None
        self.name = f"{type(dataset).__module__}.{type(dataset).__qualname__}"

    def __enter__(self) -> Self:
        self.reads = ItemReads(self.dataset, self.settings, self.options["workers"])
        return self

    def __exit__(self, *exc: object) -> None:
        self.reads.close()

    def same_pack(self, manifest: Manifest) -> bool:
        return False  # a dataset cannot be told unchanged without reading it all: OUT is replaced

    def pack_into(self, out: Path, on_shard: Callable[[Path], None] | None = None) -> PackReport:
        plan = DatasetPlan.load(out)
        if plan is not None and (plan.options != self.content or plan.classes != self.classes):
            plan = None  # other options: another pack, started afresh
        if plan is not None and plan.count != len(self.dataset):
            if not self.overwrite:
                raise SourceError(f"{out}: the dataset has {len(self.dataset)} items, the interrupted pack "
                                  f"{plan.count}: it changed; pass overwrite=True to start over")
            plan = None
        while True:
            if plan is None:
                plan = self._new_plan(out)
            records = self._resume(out, plan)
            if records is not None:
                return self._pack(out, plan, records)
            plan = None  # changed, and overwrite: start afresh

    def _new_plan(self, out: Path) -> DatasetPlan:
        schema = Schema(None, self.classes)
        plan = first_plan(self.dataset, schema, self.settings, self.options["shard_size"],
                          self.options["on_error"], self.content)
        _clear(out)
        plan.save(out)
        return plan

    def _resume(self, out: Path, plan: DatasetPlan) -> list[dict[str, Any] | None] | None:
        """The finished shards' records (None for those to write), once a few of their items read back
        the same; None when they differ and ``overwrite`` allows a fresh start."""
        journal = Journal(out)
        records: list[dict[str, Any] | None] = []
        for shard in plan.shards():
            final = out / shard_name(self.options["storage"], shard.number)
            done = journal.load(shard, final, "")
            if done is None:
                journal.forget(shard.number)
                remove_entry(final)
            records.append(done)
        names = {shard_name(self.options["storage"], s.number) for s in plan.shards()}
        for extra in out.iterdir():  # shards of another plan or storage kind
            if SHARD_NAME.match(extra.name) and extra.name not in names:
                remove_entry(extra)
        try:
            check_resumed(self.reads, plan.schema(), [r for r in records if r is not None], out)
        except SourceError:
            if not self.overwrite:
                raise
            return None
        return records

    def _pack(self, out: Path, plan: DatasetPlan, records: list[dict[str, Any] | None]) -> PackReport:
        try:
            ensure_dir(out / PACK_STATE_DIR, 0o700)
        except OSError as exc:
            raise PackError(f"{out / PACK_STATE_DIR}: cannot hold the pack's working files ({exc.strerror})") from None
        for stale in (out / PACK_STATE_DIR).glob("*.tmp"):  # an interrupted pack's unfinished shards
            remove_entry(stale)
        todo = [shard for shard, done in zip(plan.shards(), records) if done is None]
        keys = {key for r in records if r is not None for key in r["keys"]}
        file_types = stored_types(plan.schema(), self.settings)
        tasks = [ShardTask(shard, str(out), self.options["storage"], self.options["shard_size"], file_types,
                           self.options["on_error"]) for shard in todo]
        bar = _bar(sum(s.end - s.start for s in todo), self.progress)
        with interrupt_between_files() as check_interrupt:
            outcomes = self.reads.write_shards(plan.schema(), tasks, check_interrupt)
            by_number = {task.shard.number: task for task in tasks}
            try:
                for outcome in outcomes:
                    if outcome.error is not None:  # a shard that could not be written: the first to say so
                        task = by_number.get(outcome.number)
                        raise PackError(write_error(out, task.name if task else "a shard", outcome.error))
                    task = by_number[outcome.number]
                    records[task.shard.number] = self._adopt(out, plan.schema(), task, outcome, keys)
                    if bar is not None:
                        bar.update(task.shard.end - task.shard.start)
            finally:
                outcomes.close()  # type: ignore[attr-defined]
                if bar is not None:
                    bar.close()
        report = self._finish(out, [r for r in records if r is not None], plan.schema())
        report.resumed_shards = len(plan.shards()) - len(todo)
        return report

    def _adopt(self, out: Path, schema: Schema, task: ShardTask, outcome: ShardOutcome,
               keys: set[str]) -> dict[str, Any]:
        """A written shard renamed into place and journaled, its keys added to ``keys``; an item that
        cannot be packed raised as the pack's error (under on_error="raise"), or its shard rewritten
        here without the items whose keys earlier shards have (under "skip")."""
        record = outcome.record
        repeated = keys.intersection(record["keys"])
        if repeated:  # written in a worker, which knew only its own shard's keys
            Path(outcome.tmp).unlink(missing_ok=True)
            if self.options["on_error"] != "skip":
                index, key = next((i, k) for i, k in zip(record["items"], record["keys"]) if k in repeated)
                raise item_error(repeated_key(index, key))
            outcome = self.reads.write_here(schema, replace(task, taken=repeated))
            record = outcome.record
        if outcome.error is not None:
            raise PackError(write_error(out, task.name, outcome.error))
        if outcome.failed is not None:
            raise item_error(outcome.failed)
        final = out / task.name
        try:
            os.replace(outcome.tmp, final)
            Journal(out).save(task.shard.number, record)  # after the rename: a journal entry means done
        except JournalWriteError as exc:
            raise PackError(write_error(out, f"the resume journal entry for {task.name} in {PACK_STATE_DIR}/",
                                        exc)) from None
        except OSError as exc:
            raise PackError(write_error(out, task.name, exc)) from None
        keys.update(record["keys"])
        return record

    def _finish(self, out: Path, records: list[dict[str, Any]], schema: Schema) -> PackReport:
        """The listing finalize writes the index from: the written items, numbered in order."""
        items: list[SourceItem] = []
        values: dict[str, list[Any]] = {}
        numbered = []
        for record in records:
            first = len(items)
            for k, key in enumerate(record["keys"]):
                items.append(SourceItem(Path(key), key, record["labels"][k], record["sizes"][k], 0))
            for name, column in record["values"].items():
                values.setdefault(name, []).extend(column)
            numbered.append({**record, "items": list(range(first, len(items)))})
        listing = SourceListing(root=Path(self.name), layout="dataset", items=items, classes=self.classes,
                                fields=schema.index_types, field_values=values,
                                file_fields=stored_types(schema, self.settings),
                                images=True)
        digest = xxhash.xxh3_128(json.dumps([FORMAT_VERSION, self.content, schema.types]).encode())
        for record in records:
            digest.update(b"".join(c.to_bytes(8, "little") for c in record["checksums"]))
        quality = self.settings.quality
        encoder = {"format": "JPEG", "quality": quality} if quality else {"format": "PNG", "lossless": True}
        options = {"reencode": None, "check": self.options["check"], "shard_size": self.options["shard_size"],
                   "restart_markers": False}
        try:
            return finalize(out, self.options["storage"], listing, numbered, options, (), digest.hexdigest(),
                            extra={"encoded": {**encoder, "images": sum(r["encoded"] for r in records)}})
        except OSError as exc:  # the finished shards stay: the same call resumes from them
            raise PackError(write_error(out, "the index and manifest", exc)) from None


def _clear(out: Path) -> None:
    """An earlier pack's shards and journal, before a new plan is written."""
    for entry in out.iterdir():
        if SHARD_NAME.match(entry.name):
            remove_entry(entry)
    state = out / PACK_STATE_DIR
    if state.is_dir():
        for entry in state.iterdir():
            if entry.name.startswith("shard-") or entry.name.endswith(".tmp"):
                remove_entry(entry)


def _bar(total: int, show: bool) -> Any:
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="item", desc="packing", file=sys.stderr, dynamic_ncols=True, smoothing=0.1)
