"""Verify a packed dataset: every record's checksum (and optionally its decode) against the index."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastload.errors import FastloadError
from fastload.format import record_checksum
from fastload.storage.packed import locate_packed, open_packed

BATCH = 256


@dataclass(frozen=True)
class BadRecord:
    """One record that failed verification."""

    shard: str
    record: int
    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.shard} record {self.record} ({self.path}): {self.problem}"


@dataclass
class VerifyReport:
    """What ``verify`` checked and what it found; ``ok`` only when nothing is wrong."""

    root: Path | str
    num_records: int = 0
    checked: int = 0
    bad: list[BadRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # dataset-level (missing or resized shards)

    @property
    def ok(self) -> bool:
        return not self.bad and not self.problems and self.checked == self.num_records


def verify(path: str | os.PathLike[str], *, decode: bool = False,
           progress: Callable[[int], None] | None = None,
           storage_options: dict[str, Any] | None = None) -> VerifyReport:
    """Recompute every record's checksum (``decode=True``: also decode every image). A dataset in
    an object store is read from the store itself, never from the node cache."""
    opened = open_packed(locate_packed(path, storage_options))
    manifest, reader = opened.manifest, opened.reader
    report = VerifyReport(root=opened.location.root, num_records=manifest.num_records)
    root = opened.location.root
    for number, shard in enumerate(manifest.shards):
        try:
            if isinstance(root, Path):
                size = (root / shard.file).stat().st_size
                if size != shard.bytes:
                    report.problems.append(f"{shard.file}: {size} bytes on disk, the manifest says {shard.bytes}")
            else:
                reader.stat_shard(number)  # in the store, of the size and ETag the pack recorded
        except FastloadError as exc:
            report.problems.append(str(exc))
        except OSError as exc:
            report.problems.append(f"{shard.file}: {exc.strerror}")
    try:
        for start in range(0, manifest.num_records, BATCH):
            indices = list(range(start, min(start + BATCH, manifest.num_records)))
            for i, data in zip(indices, _read_each(reader, indices, report)):
                if data is not None:
                    _check_record(report, reader, i, data, decode)
                report.checked += 1
            if progress is not None:
                progress(len(indices))
    finally:
        reader.close()
    return report


def _read_each(reader, indices: list[int], report: VerifyReport) -> list[bytes | None]:
    try:
        return reader.read_raw(indices)
    except FastloadError:
        out: list[bytes | None] = []
        for i in indices:  # find exactly which records cannot be read
            try:
                out.append(reader.read_raw([i])[0])
            except FastloadError as exc:
                report.bad.append(_bad(reader, i, str(exc).split(": ", 1)[-1]))
                out.append(None)
        return out


def _check_record(report: VerifyReport, reader, i: int, data: bytes, decode: bool) -> None:
    if record_checksum(data) != int(reader.index.checksum[i]):
        report.bad.append(_bad(reader, i, "checksum mismatch"))
        return
    if decode and reader.index.width[i] >= 0:
        from PIL import Image

        try:
            Image.open(io.BytesIO(data)).load()
        except Exception as exc:
            report.bad.append(_bad(reader, i, f"does not decode ({exc})"))


def _bad(reader, i: int, problem: str) -> BadRecord:
    shard = reader.manifest.shards[int(reader.index.shard[i])].file
    return BadRecord(shard=shard, record=i, path=reader.index.path[i], problem=problem)
