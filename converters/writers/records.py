"""A shard's record for finalize: its payloads handed to the writer thread in order, and beside
them the index columns of each (where it lands, its size, checksum and image size)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastload.converters.writers.behind import WriteBehind

from fastload.format.layout import FILE_COLUMNS

RECORD_COLUMNS = ("items", "sizes", "offsets", "checksums", "widths", "heights", "positions")


def new_shard_record(name: str, file_fields: Iterable[str], **facts: Any) -> dict[str, Any]:
    """The record of shard ``name`` (see converters.finalize): a list per index column of its
    records, one per file field and FILE_COLUMNS part, its skips, where the next payload lands
    (``offset``, ``position``), and ``facts`` as given (its plan's digest, stamps, ...)."""
    return {"file": name, "skips": [], "offset": 0, "position": 0, **{column: [] for column in RECORD_COLUMNS},
            # per file field, a list per index column ("positions", ...)
            "files": {field: {part + "s": [] for part in FILE_COLUMNS} for field in file_fields}, **facts}


def add_record(record: dict[str, Any], behind: WriteBehind, item: int, data: bytes, checksum: int, width: int,
               height: int, files: Iterable[tuple[bytes, int, Any]], file_fields: Iterable[str]) -> None:
    """Hand one record's payload to ``behind``, then its file fields' (``(bytes, checksum, facts)``
    each, right after it: one sequential read serves them all), noting where each lands: writers
    store payloads back to back, so offsets are known before they are written."""
    behind.append(data)
    offset, position = record["offset"], record["position"]
    for column, value in (("positions", position), ("offsets", offset), ("sizes", len(data)),
                          ("checksums", checksum), ("widths", width), ("heights", height), ("items", item)):
        record[column].append(value)
    offset, position = offset + len(data), position + 1
    for field, (payload, payload_checksum, facts) in zip(file_fields, files):
        behind.append(payload)
        columns = (position, offset, len(payload), payload_checksum, facts.width, facts.height)  # FILE_COLUMNS' order
        for part, value in zip(FILE_COLUMNS, columns, strict=True):
            record["files"][field][part + "s"].append(value)
        offset, position = offset + len(payload), position + 1
    record["offset"], record["position"] = offset, position


def end_shard_record(record: dict[str, Any], behind: WriteBehind) -> None:
    """The shard's last payload is handed over: its entry count is known, its writer finishes behind."""
    record["entries"] = record["position"]
    behind.end_shard()
