"""Pack stage, write side: the shards not finished yet, each written behind the reads and journaled
once renamed into place, so that a killed pack resumes from the shards it finished."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastload.converters.packing.examine import Examiner, Loaded
from fastload.converters.packing.interrupt import interrupt_between_files
from fastload.converters.packing.plan import Journal, JournalWriteError, ShardPlan, stamps_digest
from fastload.converters.packing.report import progress_bar, write_error
from fastload.converters.sources.items import MemberReader, SourceItem
from fastload.converters.writers import WRITERS
from fastload.converters.writers.behind import WriteBehind, WriteFailed
from fastload.converters.writers.records import add_record, end_shard_record, new_shard_record

from fastload.errors import PackError, SourceError
from fastload.format import PACK_STATE_DIR, StorageKind, shard_name
from fastload.format.files import create_new, ensure_dir, remove_entry
from fastload.format.layout import SHARD_NAME
from fastload.storage.remote import RemoteStore


class Packer:
    """Runs the read → check → write pipeline over the shards that are not finished yet."""

    def __init__(self, items: list[SourceItem], out: Path, storage: StorageKind,
                 options: dict[str, Any], progress: bool | None, src_store: RemoteStore | None = None,
                 on_shard: Callable[[Path], None] | None = None, file_types: dict[str, str] | None = None,
                 reader: MemberReader | None = None, images: bool | None = None) -> None:
        self.items, self.out, self.storage, self.options = items, out, storage, options
        self.file_types = file_types or {}  # file field → type, in the order of each item's ``files``
        self.on_shard = on_shard
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.journal = Journal(out)
        self.work = out / PACK_STATE_DIR  # private (0700): shards are written here, then renamed
        self.examiner = Examiner(items, options, self.file_types, src_store, reader, images)  # the read side
        self.resumed = 0

    def run(self, plans: list[ShardPlan]) -> list[dict[str, Any]]:
        try:
            ensure_dir(self.work, 0o700)
        except OSError as exc:
            raise PackError(f"{self.work}: cannot hold the pack's working files ({exc.strerror})") from None
        for stale in [*self.out.glob("*.tmp"), *self.work.glob("*.tmp"), *self.work.glob("*.exact")]:
            if not stale.is_dir():  # a folder at one of these names is not ours: writing there fails clearly
                stale.unlink()
        records: list[dict[str, Any] | None] = []
        todo = []
        for plan in plans:
            final = self.out / shard_name(self.storage, plan.number)
            done = self.journal.load(plan, final, self._stamps(plan))
            records.append(done)
            if done is None:
                self.journal.forget(plan.number)
                remove_entry(final)  # redone: its old file would need the disk space twice
                todo.append(plan)
        self.resumed = len(plans) - len(todo)
        if self.on_shard is not None:
            for plan, done in zip(plans, records):
                if done is not None:
                    self.on_shard(self.out / shard_name(self.storage, plan.number))
        names = {shard_name(self.storage, plan.number) for plan in plans}
        first = plans[0].number if plans else 0  # an append's: the shards below are the dataset's
        for extra in self.out.iterdir():  # shards of an older, longer plan or another storage kind
            found = SHARD_NAME.match(extra.name)
            if found and int(found.group(1)) >= first and extra.name not in names:
                remove_entry(extra)
        total = sum(self.items[i].total_size for p in todo for i in range(p.start, p.end))
        indices = [i for plan in todo for i in range(plan.start, plan.end)]
        with interrupt_between_files() as check_interrupt, \
                progress_bar(total, self.progress) as bar, \
                ThreadPoolExecutor(self.options["workers"], thread_name_prefix="fastload-pack") as pool:
            behind = WriteBehind()
            loaded = self.examiner.loaded(pool, indices)
            try:
                for plan in todo:
                    records[plan.number - first] = self._write_shard(plan, loaded, behind, bar,
                                                                     check_interrupt)
                behind.close(while_waiting=check_interrupt)  # up to 64 MB still to write
            except WriteFailed as failed:
                what = (f"the resume journal entry for {failed.shard} in {PACK_STATE_DIR}/"
                        if isinstance(failed.cause, JournalWriteError) else failed.shard)
                raise PackError(write_error(self.out, what, failed.cause)) from None
            except KeyboardInterrupt:
                behind.cancel(finish_queued=False)  # Ctrl-C: stop now, not after 64 MB of writes
                raise
            finally:
                behind.cancel()  # after a failure: ended shards are finished, the open one removed
                loaded.close()  # closes files read ahead and cancels queued work
        return [r for r in records if r is not None]

    def _stamps(self, plan: ShardPlan) -> str:
        return stamps_digest(self.items[plan.start:plan.end])

    def _write_shard(self, plan: ShardPlan, loaded: Iterator[Loaded], behind: WriteBehind,
                     bar: Any, check_interrupt: Callable[[], None]) -> dict[str, Any]:
        """Hand one shard's payloads to the writer thread; the record is complete once it is done."""
        name = shard_name(self.storage, plan.number)
        final, tmp = self.out / name, self.work / (name + ".tmp")
        planned = sum(self.items[i].total_size for i in range(plan.start, plan.end))
        record = new_shard_record(name, self.file_types, digest=plan.digest, kept_as_is=[], stamps=self._stamps(plan))

        def done(file_bytes: int, data_offset: int) -> None:
            record["bytes"], record["data_offset"] = file_bytes, data_offset
            os.replace(tmp, final)  # a link planted at the final name is replaced, not followed
            self.journal.save(plan.number, record)  # after the rename: a journal entry means done
            if self.on_shard is not None:
                self.on_shard(final)

        def make() -> Any:
            os.close(create_new(tmp))  # the writer's library opens it by name: a new regular file
            return WRITERS[self.storage](tmp, planned)

        behind.start_shard(name, make, done, lambda: tmp.unlink(missing_ok=True))
        for _ in range(plan.start, plan.end):
            check_interrupt()  # Ctrl-C lands here (or in close) while the threads run
            got = next(loaded)
            bar.update(self.items[got.index].total_size)
            if got.data is None:
                self._skip(got, record)
                continue
            add_record(record, behind, got.index, got.data, got.checksum, got.width, got.height, got.files or (),
                       self.file_types)
            if got.kept_as_is:
                record["kept_as_is"].append([self.items[got.index].rel, got.kept_as_is])
        end_shard_record(record, behind)
        return record

    def _skip(self, got: Loaded, record: dict[str, Any]) -> None:
        item = self.items[got.index]
        if self.options["on_error"] != "skip":  # a tar member, a table row: named inside its file
            where = item.path if item.offset < 0 else f"{str(item.path).rsplit('/', 1)[0]}/{item.rel}"
            raise SourceError(f"{where}: {got.reason}; fix or remove it, or pass --on-error skip")
        record["skips"].append([item.rel, got.reason])
