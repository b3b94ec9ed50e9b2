"""What a pack tells the user: the report object, the one-line summary, the skipped-files report,
the progress bar and the message of a failed write."""

from __future__ import annotations

import errno
import json
import resource
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastload.converters.sources.items import Skip
from fastload.config import format_size
from fastload.format import SKIPPED_REPORT_NAME, Manifest, write_atomically


@dataclass
class PackReport:
    """Returned by ``converters.packing.loop``; ``summary()`` is the line the CLI prints."""

    out: Path
    storage: str
    num_records: int = 0
    total_bytes: int = 0
    num_shards: int = 0
    skipped: int = 0
    skipped_files: list[Skip] = field(default_factory=list)
    skipped_report: Path | str | None = None  # str: its URL, for a pack to an object store
    ignored: dict[str, int] = field(default_factory=dict)
    resumed_shards: int = 0
    elapsed_s: float = 0.0
    kept_as_is: list[Skip] = field(default_factory=list)
    """JPEGs that ``restart_markers=True`` could not rewrite, packed byte for byte, with why."""
    already_packed: bool = False
    """OUT already held this exact pack (same files, sizes, times and options): nothing was written."""
    version: int = 1
    """The dataset's version the pack made (or found): 1, and one more with each append."""
    held: int = 0
    """An append's records the dataset held already (same path and content): left out."""

    def moved_to(self, out: Path) -> None:
        """The dataset packed at ``self.out`` (a staging folder) is now ``out``: its paths follow it."""
        if isinstance(self.skipped_report, Path) and isinstance(self.out, Path):
            try:
                self.skipped_report = Path(out) / self.skipped_report.relative_to(self.out)
            except ValueError:
                pass  # written elsewhere: it stays where it is
        self.out = out

    @property
    def mb_per_s(self) -> float:
        return self.total_bytes / 1e6 / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def rate(self) -> str:
        """The pack's bytes per second in a unit that shows them (``420.00 KB/s``, never ``0 MB/s``)."""
        return f"{format_size(self.mb_per_s * 1e6)}/s"

    def summary(self) -> str:
        if self.already_packed and self.held:
            return (f"nothing to append: {self.out} holds all {self.held} records of the source already (same "
                    f"path and content; version {self.version}, {self.num_records} records); pass "
                    "--allow-duplicates to append them again")
        if self.already_packed:
            return (f"already packed: {self.out} holds this exact pack ({self.num_records} records, "
                    f"{_count(self.num_shards, 'shard')}, {self.skipped} skipped); nothing to do")
        shards = f"{self.num_shards} {self.storage} shard{'s' if self.num_shards != 1 else ''}"
        parts = [f"packed {self.num_records} records ({format_size(self.total_bytes)}) into {shards} at {self.out}"
                 if self.version == 1 else f"appended {self.num_records} records ({format_size(self.total_bytes)}) "
                 f"in {shards} to {self.out}, now version {self.version}",
                 f"skipped {self.skipped}", f"{self.elapsed_s:.1f}s", self.rate()]
        if self.held:
            parts.append(f"left out {self.held} records the dataset holds already (same path and content; "
                         "--allow-duplicates appends them)")
        if self.resumed_shards:
            parts.append(f"resumed: kept {_count(self.resumed_shards, 'finished shard')}")
        if self.skipped_report:
            parts.append(f"skipped files listed in {self.skipped_report}")
        if self.kept_as_is:
            first = self.kept_as_is[0]
            parts.append(f"{len(self.kept_as_is)} JPEGs packed without restart markers, as they were "
                         f"(they load, without the faster crop decode; first: {first.rel}: {first.reason})")
        if self.ignored:
            kinds = ", ".join(f"{k} x{v}" for k, v in sorted(self.ignored.items()))
            parts.append(f"ignored {sum(self.ignored.values())} files not selected by extension ({kinds})")
        return "; ".join(parts)


def already_packed(out: Path | str, manifest: Manifest) -> PackReport:
    """The report of a pack whose OUT already holds this exact pack (``manifest``): nothing written."""
    skipped = manifest.packed.get("skipped", 0)
    return PackReport(out=out, storage=manifest.storage, num_records=manifest.num_records,
                      total_bytes=manifest.total_bytes, num_shards=len(manifest.shards),
                      skipped=skipped if isinstance(skipped, int) else 0, already_packed=True,
                      version=manifest.version)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def write_skipped_report(out: Path, skipped: list[Skip]) -> Path | None:
    """``OUT/skipped.jsonl``: one ``{"path", "reason"}`` line per skipped file (none: no file)."""
    if not skipped:
        return None
    path = out / SKIPPED_REPORT_NAME
    lines = "".join(json.dumps({"path": s.rel, "reason": s.reason}) + "\n" for s in skipped)
    write_atomically(path, lines.encode())
    return path


def write_error(out: Path, shard: str, exc: BaseException) -> str:
    """What a failed write of ``shard`` into ``out`` tells the user: a full disk said so, and how to resume."""
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


def progress_bar(total: int, show: bool, desc: str = "packing", position: int = 0) -> Any:
    """tqdm over bytes (shows MB/s and ETA): source bytes packed, or (``position=1``, a second
    line) shard bytes uploaded.

    Its rate is the average since it started (``smoothing=0``: bytes so far over time so far), the
    summary's measure. A smoothed rate weighs the last updates, which come in bursts as the reads
    ahead of the writer drain: a pack's bar once ended on 3.94 MB/s and its summary said 1 MB/s."""
    if not show:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1000, desc=desc, position=position,
                file=sys.stderr, dynamic_ncols=True, smoothing=0)
