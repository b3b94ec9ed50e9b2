"""Pack orchestration: list SRC → parallel read + check → shard writers → index + manifest, resumable."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastload.converters.packing.checks import InvalidFile, check_image
from fastload.converters.sources.file_fields import FileFacts, check_record_files
from fastload.converters.finalize import finalize
from fastload.converters.packing.interrupt import interrupt_between_files
from fastload.converters.sources.listing import list_to_pack
from fastload.converters.destination.out_dir import (
    OutFolder, PackLock, inspect_out, prepare_out, remove_dataset, staging_path, swap_in,
)
from fastload.converters.packing.plan import Journal, JournalWriteError, ShardPlan, plan_digest, plan_shards, stamps_digest
from fastload.converters.packing.readahead import (
    PixelBudget, fetch_in_order, give_back_large_blocks, map_in_order, read_in_order,
)
from fastload.converters.packing.reencode import reencode_jpeg
from fastload.converters.packing.restarts import check_available, with_restart_markers
from fastload.converters.packing.report import PackReport, already_packed, progress_bar, write_error
from fastload.converters.sources.items import Layout, SourceItem, SourceListing, normalize_extensions
from fastload.converters.writers import WRITERS
from fastload.converters.writers.behind import WriteBehind, WriteFailed
from fastload.config import MAX_FILE_SIZE, MAX_PIXELS, available_cpus, parse_size
from fastload.decode.images import pixel_limit
from fastload.errors import PackError, SourceError
from fastload.format import FORMAT_VERSION, PACK_STATE_DIR, Manifest, StorageKind, record_checksum, shard_name
from fastload.format.files import create_new, ensure_dir, read_regular, remove_entry
from fastload.format.layout import FILE_COLUMNS, IMAGE_EXTENSIONS, SHARD_NAME
from fastload.storage.location import is_remote, local_path
from fastload.storage.remote import RemoteStore

OnError = Literal["fail", "skip"]
# Source bytes read ahead of the writer when files are decoded on a thread pool.
_READ_AHEAD_BYTES = 64 * 2**20
# Decoded pixels in flight on that pool (~400 MB as RGB); a larger image is decoded alone.
_PIXELS_IN_FLIGHT = 128 * 2**20


def default_out(src: Path) -> Path:
    """``./images`` → ``./images.fl``; ``./train.csv`` → ``./train.fl``."""
    src = Path(os.path.abspath(src))
    return src.with_suffix(".fl") if src.is_file() else src.with_name(src.name + ".fl")


def default_workers() -> int:
    """Reads are I/O: keep several in flight even on 2 cores (a cold disk serves many at once)."""
    return min(16, max(4, 4 * available_cpus()))


def pack(src: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
         format: StorageKind = "lmdb", shard_size: str | int = "256MB", workers: int | None = None,
         extensions: list[str] | None = None, on_error: OnError = "fail", max_side: int | None = None,
         quality: int | None = None, overwrite: bool = False, progress: bool | None = None,
         layout: Layout = "auto", check: Literal["header", "decode"] = "header",
         max_pixels: int = MAX_PIXELS, restart_markers: bool = False,
         max_file_size: str | int = MAX_FILE_SIZE, storage_options: dict[str, Any] | None = None,
         staging: str | os.PathLike[str] | None = None, sidecars: bool = False,
         file_columns: list[str] | tuple[str, ...] = (), root: str | os.PathLike[str] | None = None,
         allow_outside_root: bool = False, sidecar_names: dict[str, str] | None = None) -> PackReport:
    """Pack a folder or file list into a fastload dataset; see ``fastload pack --help``.

    Returns a PackReport (``already_packed`` when OUT holds this exact pack). Raises SourceError /
    SourceNotFoundError for a bad source or file (with ``on_error="fail"``) and PackError when
    the output cannot be written. With ``overwrite`` a finished dataset at OUT is replaced only
    once the new one is complete (see converters.destination.out_dir).

    SRC and OUT may be object-store URLs (``s3://bucket/images/``), reached with
    ``storage_options``; a pack to a store is written in the local ``staging`` folder and each
    shard uploaded as it finishes (see converters.destination.upload). ``sidecars``: a folder's ``.json`` and
    ``.txt`` files beside each image, of its basename, become its fields, and other images or
    ``.npy`` files of its basename its file fields (see converters.sources.sidecars), named by extension
    unless ``sidecar_names`` renames one (``{"png": "mask"}``). ``file_columns``: the
    columns of a file list that name more files of each record (a mask, a depth map), packed beside
    its file as file fields (see converters.sources.file_fields). A file list's paths (and file columns)
    must resolve inside ``root`` (default: the list's folder) unless ``allow_outside_root``; none
    is ever read from /proc, /sys or /dev (see converters.sources.confine).
    """
    started = time.perf_counter()
    src_store = RemoteStore(str(src), storage_options) if is_remote(src) else None
    out_remote = out is not None and is_remote(out)
    if src_store is None and not out_remote and storage_options:
        raise ValueError("storage_options are for object-store URLs (s3://...); SRC and OUT are local paths")
    src_path = Path(local_path(src)) if src_store is None else None
    if out is None and src_path is None:
        raise ValueError(f"{src}: a source in an object store needs -o/--out (a local folder or a URL)")
    out_path = (None if out_remote else
                Path(local_path(out)) if out is not None else default_out(src_path))
    if out_path is not None and out_path.is_symlink():  # the user named a link to their folder: pack where it points
        out_path = Path(os.path.realpath(out_path))
    options = _check_options(format, shard_size, workers, on_error, max_side, quality, check, max_pixels,
                             restart_markers, max_file_size)
    exts = normalize_extensions(extensions)
    listing = list_to_pack(src, src_store, src_path, layout=layout, extensions=exts, on_error=on_error,
                           options=options, sidecars=sidecars, file_columns=tuple(file_columns), root=root,
                           allow_outside_root=allow_outside_root, sidecar_names=sidecar_names)
    if src_path is not None and out_path is not None:
        _check_out_location(src_path, listing.root, out_path)
    # Read threads do not change what is written: a resume with other --workers keeps the shards.
    content = {k: v for k, v in options.items() if k not in ("workers", "max_file_size")}
    if listing.file_fields:  # names and types: a renamed column is another pack (absent: old digests hold)
        content["file_fields"] = dict(listing.file_fields)
    plans = plan_shards(listing.items, options["shard_size"], {**content, "extensions": exts})
    job = _PackJob(listing, plans, options, exts, progress, src_store)
    if out_path is None:
        from fastload.converters.destination.upload import pack_to_store

        report = pack_to_store(job, RemoteStore(str(out), storage_options), staging, overwrite)
    else:
        report = _pack_local(job, out_path, overwrite)
    report.elapsed_s = time.perf_counter() - started
    return report


@dataclass
class _PackJob:
    """What to pack and how: the listing, its shard plan and the checked options."""

    listing: SourceListing
    plans: list[ShardPlan]
    options: dict[str, Any]
    exts: tuple[str, ...]
    progress: bool | None
    src_store: RemoteStore | None = None

    def same_pack(self, manifest: Manifest) -> bool:
        return _same_pack(manifest, self.plans)

    def pack_into(self, out: Path, on_shard: Callable[[Path], None] | None = None) -> PackReport:
        """Write the shards that are not finished yet, then the index and the manifest, into ``out``;
        ``on_shard(path)`` is called with each finished shard file (kept ones first)."""
        writer = _Packer(self.listing.items, out, self.options["storage"], self.options, self.progress,
                         self.src_store, on_shard, file_types=dict(self.listing.file_fields))
        shard_records = writer.run(self.plans)
        try:
            report = finalize(out, self.options["storage"], self.listing, shard_records, self.options,
                              self.exts, plan_digest(self.plans))
        except OSError as exc:  # the finished shards stay: the same command resumes from them
            raise PackError(write_error(out, "the index and manifest", exc)) from None
        report.resumed_shards = writer.resumed
        return report


def _pack_local(job: _PackJob, out_path: Path, overwrite: bool) -> PackReport:
    plans = job.plans
    folder = _check_replaceable(inspect_out(out_path), plans, overwrite)
    if folder.state == "new":
        prepare_out(out_path)
    with PackLock(out_path) as out_lock:
        folder = _check_replaceable(inspect_out(out_path), plans, overwrite)  # again, under the lock
        if folder.state == "dataset" and folder.manifest is not None and _same_pack(folder.manifest, plans):
            return already_packed(out_path, folder.manifest)
        if folder.state != "dataset":
            report = job.pack_into(out_path)
        else:
            staging = staging_path(out_path)
            staged = inspect_out(staging)
            if staged.state == "dataset" and staged.manifest is not None:
                remove_dataset(staging, staged.manifest)  # a replacement killed before its swap
            prepare_out(staging)
            with PackLock(staging) as new_lock:
                report = job.pack_into(staging)
                swap_in(staging, out_path)
                new_lock.path, out_lock.path = out_lock.path, new_lock.path  # each went with its folder
            remove_dataset(staging, folder.manifest)  # the old dataset, now at the staging name
    report.out = out_path
    return report


def _check_replaceable(folder: OutFolder, plans: list[ShardPlan], overwrite: bool) -> OutFolder:
    """A finished dataset at OUT is replaced only with ``overwrite`` and when it holds nothing else."""
    if folder.state != "dataset" or folder.manifest is None or _same_pack(folder.manifest, plans):
        return folder
    if not overwrite:
        raise PackError(f"{folder.path}: already holds a finished dataset (packed from "
                        f"{folder.manifest.packed.get('source', '?')}); pass --overwrite to replace it")
    if folder.foreign:
        raise PackError(f"{folder.path}: holds files that are not part of its dataset "
                        f"({', '.join(folder.foreign[:3])}{', ...' if len(folder.foreign) > 3 else ''}); "
                        "--overwrite replaces only a folder that holds a fastload dataset alone: "
                        "move them out or choose another -o")
    return folder


def _same_pack(manifest: Manifest, plans: list[ShardPlan]) -> bool:
    return manifest.packed.get("plan") == plan_digest(plans)


def _check_options(format: str, shard_size: str | int, workers: int | None, on_error: str,
                   max_side: int | None, quality: int | None, check: str, max_pixels: int,
                   restart_markers: bool, max_file_size: str | int) -> dict[str, Any]:
    if format not in WRITERS:
        raise ValueError(f"format={format!r}: choose one of {', '.join(WRITERS)}")
    if on_error not in ("fail", "skip"):
        raise ValueError(f"on_error={on_error!r}: choose 'fail' or 'skip'")
    if check not in ("header", "decode"):
        raise ValueError(f"check={check!r}: choose 'header' or 'decode'")
    if workers is not None and workers < 1:
        raise ValueError(f"workers={workers}: must be at least 1")
    if max_side is not None and max_side < 1:
        raise ValueError(f"max_side={max_side}: must be a positive number of pixels")
    if quality is not None and not 1 <= quality <= 100:
        raise ValueError(f"quality={quality}: must be between 1 and 100")
    max_pixels = pixel_limit(max_pixels)  # a positive whole number; 5e8 is one
    if restart_markers:
        check_available()
    reencode = {"max_side": max_side, "quality": quality or 90} if (max_side or quality) else None
    return {"format_version": FORMAT_VERSION, "storage": format,
            "shard_size": parse_size(shard_size, name="shard_size"), "workers": workers or default_workers(),
            "on_error": on_error, "reencode": reencode, "check": check, "max_pixels": max_pixels,
            "restart_markers": bool(restart_markers),
            "max_file_size": parse_size(max_file_size, name="max_file_size")}


def _check_out_location(src: Path, src_root: Path, out: Path) -> None:
    real_out, real_root = Path(os.path.realpath(out)), Path(os.path.realpath(src_root))
    if src.is_dir() and (real_out == real_root or real_root in real_out.parents):
        raise PackError(f"{out}: the output is inside the source folder {src}; "
                        "choose an -o outside it (default: SRC.fl next to SRC)")
    if real_out in real_root.parents:
        raise PackError(f"{out}: the source {src} is inside the output folder; choose another -o")


@dataclass
class _Loaded:
    """One source file read and checked by a worker thread."""

    index: int
    data: bytes | None
    width: int = -1
    height: int = -1
    reason: str | None = None
    checksum: int = 0
    kept_as_is: str | None = None  # why --restart-markers left this JPEG's bytes as they were
    files: list[tuple[bytes, int, FileFacts]] | None = None  # each file field's bytes, checksum, facts


class _Packer:
    """Runs the read → check → write pipeline over the shards that are not finished yet."""

    def __init__(self, items: list[SourceItem], out: Path, storage: StorageKind,
                 options: dict[str, Any], progress: bool | None, src_store: RemoteStore | None = None,
                 on_shard: Callable[[Path], None] | None = None, file_types: dict[str, str] | None = None) -> None:
        self.items, self.out, self.storage, self.options = items, out, storage, options
        self.file_types = file_types or {}  # file field → type, in the order of each item's ``files``
        self.src_store, self.on_shard = src_store, on_shard
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.journal = Journal(out)
        self.work = out / PACK_STATE_DIR  # private (0700): shards are written here, then renamed
        self.pixels = PixelBudget(_PIXELS_IN_FLIGHT)
        self.decodes = bool(options["reencode"] or options["restart_markers"] or options["check"] == "decode")
        if self.decodes:
            give_back_large_blocks()
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
        for extra in self.out.iterdir():  # shards of an older, longer plan or another storage kind
            if SHARD_NAME.match(extra.name) and extra.name not in names:
                remove_entry(extra)
        total = sum(self.items[i].total_size for p in todo for i in range(p.start, p.end))
        indices = [i for plan in todo for i in range(plan.start, plan.end)]
        with interrupt_between_files() as check_interrupt, \
                progress_bar(total, self.progress) as bar, \
                ThreadPoolExecutor(self.options["workers"], thread_name_prefix="fastload-pack") as pool:
            behind = WriteBehind()
            loaded = self._loaded(pool, indices)
            try:
                for plan in todo:
                    records[plan.number] = self._write_shard(plan, loaded, behind, bar,
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

    def _loaded(self, pool: ThreadPoolExecutor, indices: list[int]) -> Iterator[_Loaded]:
        """Every item read and examined, in order (see converters.packing.readahead for the two ways)."""
        workers = self.options["workers"]
        if self.decodes:
            yield from map_in_order(pool, self._load, indices, lambda i: self.items[i].total_size,
                                    max_items=workers * 8, max_weight=_READ_AHEAD_BYTES)
            return
        if self.src_store is not None:  # small objects: batches of GETs in flight, in order
            contents = fetch_in_order(self.src_store, [(self.items[i].rel, self.items[i].size) for i in indices])
        else:  # a record's files one after the other: its image, then its file fields' files
            contents = read_in_order([path for i in indices for path in self._paths(i)], depth=workers * 8,
                                     limit=self.options["max_file_size"])
        try:
            for index in indices:
                data = next(contents)
                yield self._examine(index, data, [next(contents) for _ in self.items[index].files])
        finally:
            contents.close()  # the files opened ahead

    def _stamps(self, plan: ShardPlan) -> str:
        return stamps_digest(self.items[plan.start:plan.end])

    def _paths(self, index: int) -> list[Path]:
        item = self.items[index]
        return [item.path, *(file.path for file in item.files)]

    def _load(self, index: int) -> _Loaded:
        item = self.items[index]
        try:
            data: bytes | OSError = (read_regular(item.path, self.options["max_file_size"])
                                     if self.src_store is None else
                                     self.src_store.read_ranges([(item.rel, 0, item.size)])[0])
        except OSError as exc:
            data = exc
        files: list[bytes | OSError] = []
        for file in item.files:
            try:
                files.append(read_regular(file.path, self.options["max_file_size"]))
            except OSError as exc:
                files.append(exc)
        return self._examine(index, data, files)

    def _examine(self, index: int, data: bytes | OSError, files: list[bytes | OSError] = ()) -> _Loaded:
        """Check (and re-encode, or rewrite with restart markers) one file's bytes, then its record's
        other ``files``; a reason instead of bytes when it cannot be packed."""
        loaded = self._examine_file(index, data)
        if loaded.data is None or not self.file_types:
            return loaded
        try:
            loaded.files = check_record_files(self.file_types, self.items[index].files, files, loaded.width,
                                              loaded.height, self.options["max_pixels"],
                                              decode=self.options["check"] == "decode")
        except InvalidFile as exc:
            return _Loaded(index, None, reason=exc.reason)
        return loaded

    def _examine_file(self, index: int, data: bytes | OSError) -> _Loaded:
        if isinstance(data, OSError):
            return _Loaded(index, None, reason=f"unreadable file ({data.strerror or data})")
        if not self.items[index].rel.lower().endswith(IMAGE_EXTENSIONS):
            return _Loaded(index, data, checksum=record_checksum(data))
        kept_as_is = None
        try:
            header = check_image(data, max_pixels=self.options["max_pixels"])
            width, height = header.width, header.height
            if self.decodes:
                with self.pixels.hold(width * height):  # what decoding this image will allocate
                    if self.options["check"] == "decode":
                        check_image(data, decode=True, max_pixels=self.options["max_pixels"])
                    if self.options["reencode"]:
                        data, width, height = reencode_jpeg(data, **self.options["reencode"])
                    if self.options["restart_markers"]:
                        data, kept_as_is = with_restart_markers(data)
        except InvalidFile as exc:
            return _Loaded(index, None, reason=exc.reason)
        return _Loaded(index, data, width, height, checksum=record_checksum(data), kept_as_is=kept_as_is)

    def _write_shard(self, plan: ShardPlan, loaded: Iterator[_Loaded], behind: WriteBehind,
                     bar: Any, check_interrupt: Callable[[], None]) -> dict[str, Any]:
        """Hand one shard's payloads to the writer thread; the record is complete once it is done."""
        name = shard_name(self.storage, plan.number)
        final, tmp = self.out / name, self.work / (name + ".tmp")
        planned = sum(self.items[i].total_size for i in range(plan.start, plan.end))
        record: dict[str, Any] = {"digest": plan.digest, "file": name, "items": [], "sizes": [],
                                  "offsets": [], "checksums": [], "widths": [], "heights": [], "skips": [],
                                  "kept_as_is": [], "positions": [], "stamps": self._stamps(plan),
                                  # per file field, a list per index column ("positions", ...; see finalize)
                                  "files": {field: {part + "s": [] for part in FILE_COLUMNS} for field in self.file_types}}

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
        offset = position = 0  # writers store payloads back to back: offsets are known before they are written
        for _ in range(plan.start, plan.end):
            check_interrupt()  # Ctrl-C lands here (or in close) while the threads run
            got = next(loaded)
            bar.update(self.items[got.index].total_size)
            if got.data is None:
                self._skip(got, record)
                continue
            behind.append(got.data)
            record["positions"].append(position)
            record["offsets"].append(offset)
            record["items"].append(got.index)
            record["sizes"].append(len(got.data))
            record["checksums"].append(got.checksum)
            record["widths"].append(got.width)
            record["heights"].append(got.height)
            if got.kept_as_is:
                record["kept_as_is"].append([self.items[got.index].rel, got.kept_as_is])
            offset += len(got.data)
            position += 1
            for field, (data, checksum, facts) in zip(self.file_types, got.files or ()):
                behind.append(data)  # right after its record's file: one sequential read serves both
                columns = (position, offset, len(data), checksum, facts.width, facts.height)  # FILE_COLUMNS' order
                for part, value in zip(FILE_COLUMNS, columns, strict=True):
                    record["files"][field][part + "s"].append(value)
                offset += len(data)
                position += 1
        record["entries"] = position
        behind.end_shard()
        return record

    def _skip(self, got: _Loaded, record: dict[str, Any]) -> None:
        item = self.items[got.index]
        if self.options["on_error"] == "fail":
            raise SourceError(f"{item.path}: {got.reason}; fix or remove it, or pass --on-error skip")
        record["skips"].append([item.rel, got.reason])
