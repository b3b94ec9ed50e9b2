"""Append, what the dataset holds already: SRC's records that are records of the dataset, left out.

A record is held when the dataset has a record of the same source path whose stored bytes (its
file's, and each file field's) have the same checksums as this record's would: appending the same
folder again, with another ``--shard-size`` or one new file, adds only what is new. Only SRC's
records whose path the dataset has are read here (examined as the pack would, so a re-encoded or
rewritten file is compared as it would be stored); the others are read once, by the pack.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastload.converters.packing.examine import Examiner

from fastload.format import FIELD_PREFIX, Manifest, load_column, load_strings


def held_records(out: Path, manifest: Manifest, job: Any) -> list[int]:
    """The items of ``job``'s listing (converters.packing.job) that the dataset at ``out``
    (``manifest``) holds already, in listing order."""
    listing = job.listing
    listed: dict[str, list[int]] = {}
    for k, item in enumerate(listing.items):
        listed.setdefault(item.rel, []).append(k)
    held = _held_sums(out, manifest, listed, list(listing.file_fields))
    candidates = sorted(k for rel in held for k in listed[rel])
    if not candidates:
        return []
    examiner = Examiner(listing.items, job.options, dict(listing.file_fields), job.src_store, listing.reader,
                        listing.images)
    found = []
    with ThreadPoolExecutor(job.options["workers"], thread_name_prefix="fastload-append") as pool:
        for loaded in examiner.loaded(pool, candidates):
            if loaded.data is None:  # a bad file: the pack skips it (or stops), and says why
                continue
            sums = (loaded.checksum, *(checksum for _, checksum, _ in loaded.files or ()))
            if sums in held[listing.items[loaded.index].rel]:
                found.append(loaded.index)
    return found


def _held_sums(out: Path, manifest: Manifest, listed: dict[str, list[int]],
               file_fields: list[str]) -> dict[str, set[tuple[int, ...]]]:
    """For each path in ``listed`` that a record of the dataset has: the checksums of each such
    record's stored bytes (its file's, then each of ``file_fields``')."""
    paths = load_strings(out, manifest, "path")
    sums = [load_column(out, name, manifest.index[name], manifest.num_records)
            for name in ("checksum", *(f"{FIELD_PREFIX}{field}.checksum" for field in file_fields))]
    held: dict[str, set[tuple[int, ...]]] = {}
    for i in range(manifest.num_records):
        path = paths[i]
        if path in listed:
            held.setdefault(path, set()).add(tuple(int(column[i]) for column in sums))
    return held
