"""Pack orchestration: list SRC → parallel read + check → shard writers → index + manifest, resumable."""

from __future__ import annotations

import errno
import fcntl
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from converters.checks import InvalidFile, check_image
from converters.finalize import finalize
from converters.interrupt import interrupt_between_files
from converters.plan import Journal, ShardPlan, plan_shards
from converters.readahead import map_in_order, read_in_order
from converters.reencode import reencode_jpeg
from converters.restarts import check_available, with_restart_markers
from converters.report import PackReport
from converters.sources import IMAGE_EXTENSIONS, Layout, SourceItem, list_source, normalize_extensions
from converters.writers import WRITERS
from converters.writers.behind import WriteBehind, WriteFailed
from fastload.config import MAX_PIXELS, available_cpus, parse_size
from fastload.errors import PackError, SourceError
from fastload.format import (
    FORMAT_VERSION, INDEX_DIR, MANIFEST_NAME, PACK_LOCK_NAME, PACK_STATE_DIR, SKIPPED_REPORT_NAME,
    StorageKind, record_checksum, shard_name,
)

OnError = Literal["fail", "skip"]
# Source bytes read ahead of the writer when files are decoded on a thread pool.
_READ_AHEAD_BYTES = 64 * 2**20
_WRITE_PROBE = ".pack.write-test"
_FINISHED = "{out}: already holds a finished dataset; pass --overwrite to replace it"


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
         max_pixels: int = MAX_PIXELS, restart_markers: bool = False) -> PackReport:
    """Pack a folder or file list into a fastload dataset; see ``fastload pack --help``.

    Returns a PackReport. Raises SourceError / SourceNotFoundError for a bad source or file
    (with ``on_error="fail"``) and PackError when the output cannot be written.
    """
    started = time.perf_counter()
    src_path = Path(os.path.abspath(src))
    out_path = Path(os.path.abspath(out)) if out is not None else default_out(src_path)
    options = _check_options(format, shard_size, workers, on_error, max_side, quality, check, max_pixels,
                             restart_markers)
    exts = normalize_extensions(extensions)
    listing = list_source(src_path, layout=layout, extensions=exts, on_error=on_error)
    _check_out_location(src_path, listing.root, out_path)
    _prepare_out(out_path, overwrite)
    with _PackLock(out_path):
        _clear_finished(out_path, overwrite)  # under the lock: never delete what another pack writes
        # Read threads do not change what is written: a resume with other --workers keeps the shards.
        content = {k: v for k, v in options.items() if k != "workers"}
        plans = plan_shards(listing.items, options["shard_size"], {**content, "extensions": exts})
        writer = _Packer(listing.items, out_path, format, options, progress)
        shard_records = writer.run(plans)
        try:
            report = finalize(out_path, format, listing, shard_records, options, exts)
        except OSError as exc:  # the finished shards stay: the same command resumes from them
            raise PackError(_write_error(out_path, "the index and manifest", exc)) from None
    report.resumed_shards = writer.resumed
    report.elapsed_s = time.perf_counter() - started
    return report


def _check_options(format: str, shard_size: str | int, workers: int | None, on_error: str,
                   max_side: int | None, quality: int | None, check: str, max_pixels: int,
                   restart_markers: bool) -> dict[str, Any]:
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
    if max_pixels < 1:
        raise ValueError(f"max_pixels={max_pixels}: must be positive")
    if restart_markers:
        check_available()
    reencode = {"max_side": max_side, "quality": quality or 90} if (max_side or quality) else None
    return {"format_version": FORMAT_VERSION, "storage": format,
            "shard_size": parse_size(shard_size, name="shard_size"), "workers": workers or default_workers(),
            "on_error": on_error, "reencode": reencode, "check": check, "max_pixels": max_pixels,
            "restart_markers": bool(restart_markers)}


def _check_out_location(src: Path, src_root: Path, out: Path) -> None:
    real_out, real_root = Path(os.path.realpath(out)), Path(os.path.realpath(src_root))
    if src.is_dir() and (real_out == real_root or real_root in real_out.parents):
        raise PackError(f"{out}: the output is inside the source folder {src}; "
                        "choose an -o outside it (default: SRC.fl next to SRC)")
    if real_out in real_root.parents:
        raise PackError(f"{out}: the source {src} is inside the output folder; choose another -o")


def _prepare_out(out: Path, overwrite: bool) -> None:
    """OUT must be new, empty, an unfinished pack (resumed) or a finished dataset; create it."""
    if out.exists() and not out.is_dir():
        raise PackError(f"{out}: exists and is not a folder; choose another -o")
    if (out / MANIFEST_NAME).exists() and not overwrite:  # again under the lock
        raise PackError(_FINISHED.format(out=out))
    if out.exists() and not (out / MANIFEST_NAME).exists():
        # What an interrupted pack leaves (it may die after the skipped report, before the manifest).
        ours = (PACK_STATE_DIR, PACK_LOCK_NAME, INDEX_DIR, SKIPPED_REPORT_NAME, SKIPPED_REPORT_NAME + ".tmp",
                MANIFEST_NAME + ".tmp", _WRITE_PROBE)
        foreign = [e.name for e in out.iterdir() if e.name not in ours and not e.name.startswith("shard-")]
        if foreign:
            raise PackError(f"{out}: exists and holds other files ({foreign[0]}, ...); "
                            "pack into a new or empty folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / _WRITE_PROBE
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise PackError(f"{out}: cannot write the output folder ({exc.strerror}); choose another -o") from None


def _clear_finished(out: Path, overwrite: bool) -> None:
    """A finished dataset at OUT is replaced only with ``overwrite``."""
    if not (out / MANIFEST_NAME).exists():
        return
    if not overwrite:
        raise PackError(_FINISHED.format(out=out))
    os.unlink(out / MANIFEST_NAME)  # first: from here on it is an unfinished pack, never a dataset
    for entry in out.iterdir():
        if entry.name in (INDEX_DIR, PACK_STATE_DIR, SKIPPED_REPORT_NAME) or entry.name.startswith("shard-"):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


class _PackLock:
    """An exclusive flock on OUT/.pack.lock: a second pack into the same OUT refuses at once."""

    def __init__(self, out: Path) -> None:
        self.path = out / PACK_LOCK_NAME
        self.fd = -1

    def __enter__(self) -> _PackLock:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            raise PackError(f"{self.path.parent}: another pack (pid {holder}) is writing here; "
                            "wait for it to finish or choose another -o") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)  # releases the flock; the file stays (removing it would race)


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


class _Packer:
    """Runs the read → check → write pipeline over the shards that are not finished yet."""

    def __init__(self, items: list[SourceItem], out: Path, storage: StorageKind,
                 options: dict[str, Any], progress: bool | None) -> None:
        self.items, self.out, self.storage, self.options = items, out, storage, options
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.journal = Journal(out)
        self.resumed = 0

    def run(self, plans: list[ShardPlan]) -> list[dict[str, Any]]:
        for stale in self.out.glob("*.tmp"):
            stale.unlink()
        records: list[dict[str, Any] | None] = []
        todo = []
        for plan in plans:
            done = self.journal.load(plan, self.out / shard_name(self.storage, plan.number))
            records.append(done)
            if done is None:
                self.journal.forget(plan.number)
                todo.append(plan)
        self.resumed = len(plans) - len(todo)
        names = {shard_name(self.storage, plan.number) for plan in plans}
        for extra in self.out.glob("shard-*"):  # shards of an older, longer plan or another storage kind
            if extra.name not in names and extra.is_file():
                extra.unlink()
        total = sum(max(self.items[i].size, 0) for p in todo for i in range(p.start, p.end))
        indices = [i for plan in todo for i in range(plan.start, plan.end)]
        with interrupt_between_files() as check_interrupt, \
                _progress_bar(total, self.progress) as bar, \
                ThreadPoolExecutor(self.options["workers"], thread_name_prefix="fastload-pack") as pool:
            behind = WriteBehind()
            loaded = self._loaded(pool, indices)
            try:
                for plan in todo:
                    records[plan.number] = self._write_shard(plan, loaded, behind, bar,
                                                             check_interrupt)
                behind.close(while_waiting=check_interrupt)  # up to 64 MB still to write
            except WriteFailed as failed:
                raise PackError(_write_error(self.out, failed.shard, failed.cause)) from None
            except KeyboardInterrupt:
                behind.cancel(finish_queued=False)  # Ctrl-C: stop now, not after 64 MB of writes
                raise
            finally:
                behind.cancel()  # after a failure: ended shards are finished, the open one removed
                loaded.close()  # closes files read ahead and cancels queued work
        return [r for r in records if r is not None]

    def _loaded(self, pool: ThreadPoolExecutor, indices: list[int]) -> Iterator[_Loaded]:
        """Every item read and examined, in order (see converters.readahead for the two ways)."""
        workers = self.options["workers"]
        if self.options["reencode"] or self.options["restart_markers"] or self.options["check"] == "decode":
            yield from map_in_order(pool, self._load, indices, lambda i: max(self.items[i].size, 0),
                                    max_items=workers * 8, max_weight=_READ_AHEAD_BYTES)
            return
        contents = read_in_order([self.items[i].path for i in indices], depth=workers * 8)
        try:
            for index, data in zip(indices, contents):
                yield self._examine(index, data)
        finally:
            contents.close()  # the files opened ahead

    def _load(self, index: int) -> _Loaded:
        try:
            with open(self.items[index].path, "rb") as f:
                data: bytes | OSError = f.read()
        except OSError as exc:
            data = exc
        return self._examine(index, data)

    def _examine(self, index: int, data: bytes | OSError) -> _Loaded:
        """Check (and re-encode, or rewrite with restart markers) one file's bytes; a reason instead of
        bytes when it cannot be packed."""
        if isinstance(data, OSError):
            return _Loaded(index, None, reason=f"unreadable file ({data.strerror or data})")
        if not self.items[index].rel.lower().endswith(IMAGE_EXTENSIONS):
            return _Loaded(index, data, checksum=record_checksum(data))
        try:
            header = check_image(data, decode=self.options["check"] == "decode",
                                 max_pixels=self.options["max_pixels"])
            width, height = header.width, header.height
            if self.options["reencode"]:
                data, width, height = reencode_jpeg(data, **self.options["reencode"])
        except InvalidFile as exc:
            return _Loaded(index, None, reason=exc.reason)
        kept_as_is = None
        if self.options["restart_markers"]:
            data, kept_as_is = with_restart_markers(data)
        return _Loaded(index, data, width, height, checksum=record_checksum(data), kept_as_is=kept_as_is)

    def _write_shard(self, plan: ShardPlan, loaded: Iterator[_Loaded], behind: WriteBehind,
                     bar: Any, check_interrupt: Callable[[], None]) -> dict[str, Any]:
        """Hand one shard's payloads to the writer thread; the record is complete once it is done."""
        name = shard_name(self.storage, plan.number)
        final, tmp = self.out / name, self.out / (name + ".tmp")
        planned = sum(max(self.items[i].size, 0) for i in range(plan.start, plan.end))
        record: dict[str, Any] = {"digest": plan.digest, "file": name, "items": [], "sizes": [],
                                  "offsets": [], "checksums": [], "widths": [], "heights": [], "skips": [],
                                  "kept_as_is": []}

        def done(file_bytes: int, data_offset: int) -> None:
            record["bytes"], record["data_offset"] = file_bytes, data_offset
            os.replace(tmp, final)
            self.journal.save(plan.number, record)  # after the rename: a journal entry means done

        behind.start_shard(name, lambda: WRITERS[self.storage](tmp, planned), done,
                           lambda: tmp.unlink(missing_ok=True))
        offset = 0  # writers store payloads back to back: offsets are known before they are written
        for _ in range(plan.start, plan.end):
            check_interrupt()  # Ctrl-C lands here (or in close) while the threads run
            got = next(loaded)
            bar.update(max(self.items[got.index].size, 0))
            if got.data is None:
                self._skip(got, record)
                continue
            behind.append(got.data)
            record["offsets"].append(offset)
            record["items"].append(got.index)
            record["sizes"].append(len(got.data))
            record["checksums"].append(got.checksum)
            record["widths"].append(got.width)
            record["heights"].append(got.height)
            if got.kept_as_is:
                record["kept_as_is"].append([self.items[got.index].rel, got.kept_as_is])
            offset += len(got.data)
        behind.end_shard()
        return record

    def _skip(self, got: _Loaded, record: dict[str, Any]) -> None:
        item = self.items[got.index]
        if self.options["on_error"] == "fail":
            raise SourceError(f"{item.path}: {got.reason}; fix or remove it, or pass --on-error skip")
        record["skips"].append([item.rel, got.reason])


def _write_error(out: Path, shard: str, exc: BaseException) -> str:
    code = getattr(exc, "errno", None)
    text = getattr(exc, "strerror", None) or str(exc)
    if code in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT) or "No space" in text or "too large" in text \
            or _out_of_room(out, text):
        return (f"{out}: disk full while writing {shard} ({text}); free space or choose another -o, "
                "then run the same command again to resume")
    return f"{out}: cannot write {shard} ({text}); check the output folder and run the command again"


def _out_of_room(out: Path, text: str) -> bool:
    """LMDB reports a short write as EIO: blame a nearly full disk or a file-size limit (ulimit -f)."""
    if "Input/output error" not in text:
        return False
    try:
        nearly_full = shutil.disk_usage(out).free < 64 * 2**20
    except OSError:
        nearly_full = False
    return nearly_full or resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY


class _NoBar:
    def update(self, n: int) -> None:
        pass

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _progress_bar(total: int, show: bool) -> Any:
    """tqdm over source bytes (shows MB/s and ETA); the files/s rate is its postfix."""
    if not show:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1000, desc="packing",
                file=sys.stderr, dynamic_ncols=True, smoothing=0.1)
