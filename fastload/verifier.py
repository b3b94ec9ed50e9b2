"""Verify a packed dataset: every payload's checksum (and optionally its decode) against the index.

A record's payloads are its file and its file fields' files (a mask, a .npy): each is read and
checked; a bad one is reported under its record, naming the field. The index columns themselves
(labels, array fields, text) are checked against their digests in the manifest as the dataset opens.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastload.config import MAX_PIXELS
from fastload.errors import FastloadError
from fastload.decode.files import decode_npy
from fastload.decode.images import decode_as_stored, pixel_limit
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

    field: str | None = None  # a file field's file, or None: the record's own

    def __str__(self) -> str:
        field = f" field {self.field!r}" if self.field else ""
        return f"{self.shard} record {self.record} ({self.path}){field}: {self.problem}"


@dataclass
class VerifyReport:
    """What ``verify`` checked and what it found; ``ok`` only when nothing is wrong."""

    root: Path | str
    num_records: int = 0
    checked: int = 0
    bad: list[BadRecord] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # dataset-level (missing or resized shards)
    file_fields: tuple[str, ...] = ()  # checked with each record

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
    decode_limit = packed_bound(manifest) if decode else 0  # 0: checksums only
    report = VerifyReport(root=opened.location.root, num_records=manifest.num_records,
                          file_fields=tuple(opened.index.files))
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
    fields = (None, *reader.index.files)
    reads = ((list(range(start, min(start + BATCH, manifest.num_records))), field)
             for start in range(0, manifest.num_records, BATCH) for field in fields)
    pending = None
    try:
        # the next reads started before this batch is checked: the disk or store never waits on us
        for indices, field in reads:
            previous, pending = pending, (indices, field, reader.start_reads(indices, field))
            if previous is not None:
                _check_batch(report, reader, *previous, decode_limit, progress, fields)
        if pending is not None:
            previous, pending = pending, None
            _check_batch(report, reader, *previous, decode_limit, progress, fields)
    finally:
        if pending is not None:  # a batch's check raised: the reads started after it are not wanted
            pending[2].cancel()
        reader.close()
    return report


def packed_bound(manifest: Any) -> int:
    """The pixel limit the dataset was packed with (``--max-pixels``; MAX_PIXELS when the manifest
    does not say): what its images were allowed, and so what ``--decode`` allows them."""
    recorded = manifest.packed.get("max_pixels")
    try:
        return MAX_PIXELS if recorded is None else pixel_limit(recorded)
    except (TypeError, ValueError):
        return MAX_PIXELS


def _check_batch(report: VerifyReport, reader, indices: list[int], field: str | None, reads: Any,
                 decode: int, progress: Callable[[int], None] | None, fields: tuple[str | None, ...]) -> None:
    """Check one batch's payloads of ``field``; once its last field is checked, count the batch."""
    for i, data in zip(indices, _read_each(reader, indices, reads, report, field)):
        if data is not None:
            _check_record(report, reader, i, data, decode, field)
    if field == fields[-1]:
        report.checked += len(indices)
        if progress is not None:
            progress(len(indices))


def _read_each(reader, indices: list[int], reads: Any, report: VerifyReport,
               field: str | None) -> list[bytes | None]:
    try:
        return reads.result()
    except FastloadError:
        out: list[bytes | None] = []
        for i in indices:  # find exactly which records cannot be read
            try:
                out.append(reader.read_raw([i], field)[0])
            except FastloadError as exc:
                report.bad.append(_bad(reader, i, str(exc).split(": ", 1)[-1], field))
                out.append(None)
        return out


def _check_record(report: VerifyReport, reader, i: int, data: bytes, decode: int, field: str | None) -> None:
    """``decode``: 0 to check the checksum only, else also decode, refusing images over ``decode`` pixels."""
    places = reader.places(field)
    if record_checksum(data) != int(places.checksum[i]):
        report.bad.append(_bad(reader, i, "checksum mismatch", field))
        return
    kind = "image" if field is None else reader.manifest.fields[field]
    if not decode or (kind == "image" and places.width[i] < 0) or kind == "file":
        return
    try:
        if kind == "npy":
            decode_npy(data, "")
        elif kind == "mask-rows":
            from fastload.decode.masks import decode_mask_rows

            decode_mask_rows(data, None, where="", max_pixels=decode)
        else:
            decode_as_stored(data, max_pixels=decode)
    except Exception as exc:  # noqa: BLE001 - whatever the decoder raises, the payload is bad
        report.bad.append(_bad(reader, i, f"does not decode ({str(exc).lstrip(': ')})", field))


def _bad(reader, i: int, problem: str, field: str | None = None) -> BadRecord:
    shard = reader.manifest.shards[int(reader.index.shard[i])].file
    return BadRecord(shard=shard, record=i, path=reader.index.path[i], problem=problem, field=field)
