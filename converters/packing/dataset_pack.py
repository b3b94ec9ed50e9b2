"""Pack of a map-style dataset: plan (or the interrupted pack's, checked) → items read in worker
processes → records in index order to the shard writers, each shard journaled → index + manifest.

The records are written as the Python writer writes samples (converters.sources.writer); the
shards and their journal entries as a pack writes them (converters.packing.packer), so that a pack
killed mid-way resumes from its finished shards and ends with the index an uninterrupted one has.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
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
from fastload.converters.packing.interrupt import interrupt_between_files
from fastload.converters.packing.plan import Journal, JournalWriteError, ShardPlan
from fastload.converters.packing.report import PackReport, write_error
from fastload.converters.sources.items import SourceItem, SourceListing
from fastload.converters.sources.samples import KEY, Schema
from fastload.converters.sources.torch_dataset import Read, ReadSettings, json_values, stored_types
from fastload.converters.writers import WRITERS
from fastload.converters.writers.behind import WriteBehind, WriteFailed
from fastload.converters.writers.records import add_record, end_shard_record, new_shard_record

from fastload.errors import PackError, SourceError
from fastload.format import FORMAT_VERSION, PACK_STATE_DIR, Manifest, shard_name
from fastload.format.files import create_new, ensure_dir, remove_entry
from fastload.format.layout import SHARD_NAME


class DatasetPackJob:
    """``pack_into(folder)`` packs ``dataset`` there, resuming an interrupted pack of it (the pack
    job of converters.packing.loop's ``_pack_local``); used as a context manager, which starts and
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
                        **{k: options[k] for k in ("shard_size", "check", "max_pixels", "on_error")}}
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
        todo = [shard for shard, done in zip(plan.shards(), records) if done is None]
        keys = {key for r in records if r is not None for key in r["keys"]}
        writer = _ShardWriter(out, self.options, stored_types(plan.schema(), self.settings), keys)
        bar = _bar(sum(s.end - s.start for s in todo), self.progress)
        with interrupt_between_files() as check_interrupt:
            behind = WriteBehind()
            got = self.reads.read(plan.schema(), [i for shard in todo for i in range(shard.start, shard.end)])
            try:
                for shard in todo:
                    records[shard.number] = writer.write(shard, got, behind, check_interrupt, bar)
                behind.close(while_waiting=check_interrupt)
            except WriteFailed as failed:
                what = (f"the resume journal entry for {failed.shard} in {PACK_STATE_DIR}/"
                        if isinstance(failed.cause, JournalWriteError) else failed.shard)
                raise PackError(write_error(out, what, failed.cause)) from None
            except KeyboardInterrupt:
                behind.cancel(finish_queued=False)
                raise
            finally:
                behind.cancel()  # after a failure: ended shards are finished, the open one removed
                got.close()
                if bar is not None:
                    bar.close()
        report = self._finish(out, [r for r in records if r is not None], plan.schema())
        report.resumed_shards = len(plan.shards()) - len(todo)
        return report

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


class _ShardWriter:
    """One shard's records handed to the writer thread in index order, its journal entry once done."""

    def __init__(self, out: Path, options: dict[str, Any], file_types: dict[str, str], keys: set[str]) -> None:
        self.out, self.options, self.file_types, self.keys = out, options, file_types, keys
        self.journal = Journal(out)

    def write(self, shard: ShardPlan, got: Iterator[Read], behind: WriteBehind,
              check_interrupt: Callable[[], None], bar: Any) -> dict[str, Any]:
        storage = self.options["storage"]
        name = shard_name(storage, shard.number)
        final, tmp = self.out / name, self.out / PACK_STATE_DIR / (name + ".tmp")
        record = new_shard_record(name, self.file_types, digest=shard.digest, stamps="", encoded=0, keys=[], labels=[],
                                  values={})

        def done(file_bytes: int, data_offset: int) -> None:
            record["bytes"], record["data_offset"] = file_bytes, data_offset
            os.replace(tmp, final)
            self.journal.save(shard.number, record)  # after the rename: a journal entry means done

        def make() -> Any:
            os.close(create_new(tmp))
            return WRITERS[storage](tmp, self.options["shard_size"])

        behind.start_shard(name, make, done, lambda: tmp.unlink(missing_ok=True))
        for _ in range(shard.start, shard.end):
            check_interrupt()
            read = next(got)
            if bar is not None:
                bar.update(1)
            if read.payloads is not None and read.key in self.keys:
                read = Read(read.index, reason=f"{KEY} {read.key!r} was given to an earlier item; keys name one "
                                               "item each")
            if read.payloads is None or read.values is None:
                if self.options["on_error"] == "fail":
                    raise item_error(read)
                record["skips"].append([read.key or f"{read.index:08d}", f"item {read.index}: {read.reason}"])
                continue
            self.keys.add(read.key)
            payloads = read.payloads
            add_record(record, behind, read.index, payloads.data, payloads.checksum, payloads.width, payloads.height,
                       payloads.files, self.file_types)
            record["keys"].append(read.key)
            record["labels"].append(read.label)
            for field, value in json_values(read.values).items():
                record["values"].setdefault(field, []).append(value)
            record["encoded"] += payloads.encoded
        end_shard_record(record, behind)
        return record


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
