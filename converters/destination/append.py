"""Append: new shards and a new index version added to a finished dataset, its old files never rewritten.

The rules, each in one place here:
- OUT is a finished local dataset (a store URL is refused: see ``storage_for_append``) holding
  nothing else but what an interrupted append leaves (shards numbered after the dataset's, the
  next version's index folder, ``versions/``).
- The appended records have the dataset's storage kind, fields and file fields (names and
  types); their class names are the dataset's, or new ones added after them (old labels keep
  their meaning); they get the next record and shard numbers.
- The new version's index goes in ``index/v<N+1>/`` and the version it replaces keeps its
  manifest in ``versions/v<N>.json``: no file a reader of version N opened is written again, so a
  reader opened before the append (and the workers it starts after) keep reading version N.
  Every version is kept; docs/format.md says how to prune them.
- The manifest is swapped last, atomically (a rename): until then OUT is version N, readable and
  unchanged, and the same command run again resumes from the shards it finished.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from fastload.converters.destination.append_held import held_records
from fastload.converters.destination.append_whole import check_whole
from fastload.converters.destination.out_dir import PackLock, inspect_out
from fastload.converters.packing.plan import ShardPlan, plan_digest
from fastload.converters.packing.report import PackReport, already_packed
from fastload.converters.sources.items import Skip
from fastload.converters.sources.samples import Schema

from fastload.errors import PackError
from fastload.format import (
    INDEX_DIR,
    MANIFEST_NAME,
    PACK_STATE_DIR,
    SKIPPED_REPORT_NAME,
    Manifest,
    load_column,
    write_atomically,
)
from fastload.format.files import read_regular, remove_entry
from fastload.format.layout import (
    SHARD_NAME,
    VERSIONS_DIR,
    split_generation,
    version_dir,
    version_manifest_name,
)
from fastload.format.manifest import MAX_MANIFEST_BYTES
from fastload.storage.location import is_remote

_log = logging.getLogger(__name__)


def mask_storage_of(manifest: Manifest, given: str | None) -> str:
    """How an append stores masks: as the dataset stores them (a PNG-mask dataset gets PNG masks,
    so its mask fields keep one type), unless ``given`` says otherwise (then the field check names
    the mismatch); "rows" for a dataset without masks."""
    types = set(manifest.fields.values())
    return given or ("file" if "mask" in types else "rows")


def storage_for_append(src: object, out: str | os.PathLike[str] | None, format: str | None,
                       overwrite: bool = False, mask_storage: str | None = None) -> tuple[str, str]:
    """The storage kind an append of ``src`` to ``out`` writes: the dataset's (``format``, when
    given, must be it), and how it stores masks (mask_storage_of). What cannot be appended is
    refused here, before SRC is listed."""
    if overwrite:
        raise ValueError("append=True adds to the dataset at out, overwrite=True replaces it: choose one")
    if out is None:
        raise ValueError("append needs out= (-o): the dataset to add to")
    if not isinstance(src, (str, os.PathLike)):
        raise TypeError(f"append=True takes a source on disk; append samples of an in-memory "
                         f"{type(src).__name__} with fastload.Writer(out, append=True)")
    if is_remote(out):
        raise PackError(f"{out}: appending to a dataset in an object store is not supported yet; append to a "
                        "local copy and upload that, or pack every source to a new URL")
    manifest = AppendBase.open(Path(os.path.realpath(out))).manifest
    if format is not None and format != manifest.storage:
        raise PackError(f"{out}: holds {manifest.storage} shards, and an append adds shards of the dataset's kind; "
                        f"pass --format {manifest.storage} (or leave it out), not {format}")
    return manifest.storage, mask_storage_of(manifest, mask_storage)


class AppendBase:
    """The finished dataset an append adds to: its manifest (version N) and where version N+1 goes."""

    def __init__(self, out: Path, manifest: Manifest) -> None:
        self.out, self.manifest = out, manifest
        self.version = manifest.version + 1
        self.first_shard = len(manifest.shards)
        self.index_dir = f"{INDEX_DIR}/{version_dir(self.version)}"

    @classmethod
    def open(cls, out: Path) -> AppendBase:
        """The dataset at ``out``; a folder that is not one, or holds more, is refused."""
        try:
            found = inspect_out(out)
        except PackError as exc:  # a folder of other files, a manifest of something else
            raise PackError(f"{out}: is not a fastload dataset --append can add to ({exc})") from None
        if found.state != "dataset" or found.manifest is None:
            raise PackError(f"{out}: is not a fastload dataset (no {MANIFEST_NAME}); --append adds to a finished "
                            f"dataset: pack the first source without --append")
        base = cls(out, found.manifest)
        if any(split_generation(s.file)[0] for s in found.manifest.shards):
            raise PackError(f"{out}: its files lie in a store pack's folder ({found.manifest.shards[0].file}); "
                            "appending to a dataset packed for an object store is not supported yet")
        foreign = [name for name in found.foreign if not base._left_by_append(name)]
        if foreign:
            raise PackError(f"{out}: holds files that are not part of its dataset ({', '.join(foreign[:3])}); "
                            "--append adds only to a folder that holds a fastload dataset alone: move them out")
        check_whole(out, found.manifest)
        return base

    def _left_by_append(self, name: str) -> bool:
        """Whether ``name`` (not the dataset's) is what an interrupted append to it leaves."""
        if name in (VERSIONS_DIR, self.index_dir):
            return True
        found = SHARD_NAME.match(name.removesuffix(".tmp"))
        return found is not None and int(found.group(1)) >= self.first_shard

    def clear_leftovers(self) -> None:
        """Delete what an interrupted append left (a writer does not resume): OUT is version N alone."""
        for name in os.listdir(self.out):
            if name != VERSIONS_DIR and self._left_by_append(name):
                remove_entry(self.out / name)
        for folder in (self.out / self.index_dir, self.out / PACK_STATE_DIR):
            if folder.is_dir() and not folder.is_symlink():
                for name in os.listdir(folder):
                    remove_entry(folder / name)
                folder.rmdir()

    def renumber(self, plans: list[ShardPlan]) -> list[ShardPlan]:
        """The shard plan numbered after the dataset's shards."""
        return [replace(plan, number=plan.number + self.first_shard) for plan in plans]

    def check(self, storage: str, fields: dict[str, str], classes: list[str] | None, labels: Any,
              images: bool, where: object) -> None:
        """Refuse, before anything is written, records that do not fit the dataset: naming the field."""
        old, out = self.manifest, self.out
        if storage != old.storage:
            raise PackError(f"{out}: holds {old.storage} shards; an append adds shards of the same kind, not {storage}")
        problem = _field_mismatch(old.fields, fields)
        if problem is not None:
            raise PackError(f"{where}: {problem} {out}; an append's records have the dataset's fields and types "
                            f"({', '.join(f'{n}: {t}' for n, t in old.fields.items()) or 'none'})")
        if old.kind == "images" and not images:
            raise PackError(f"{where}: holds files that are not images, and {out} is a dataset of images; "
                            "pack them into a dataset of their own")
        if (old.classes is None) != (classes is None) and (classes is not None or np.any(np.asarray(labels) >= 0)):
            have = "class names" if old.classes is not None else "labels without class names"
            raise PackError(f"{where}: its labels {'have' if classes else 'have no'} class names, {out}'s records "
                            f"have {have}; give an append's labels as the dataset's do")

    def labels(self, classes: list[str] | None, labels: np.ndarray) -> tuple[list[str] | None, np.ndarray]:
        """The dataset's class names with the new ones added after them, and ``labels`` (ids into
        ``classes``) as ids into those: an old label keeps its meaning."""
        if self.manifest.classes is None or classes is None:
            return self.manifest.classes, labels
        merged = self.manifest.classes + [c for c in classes if c not in self.manifest.classes]
        ids = np.array([merged.index(c) for c in classes] or [0], dtype=np.int64)
        return merged, np.where(labels >= 0, ids[np.clip(labels, 0, len(ids) - 1)], labels)

    def merge(self, columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every index column: version N's, then the appended records' (offsets columns shifted)."""
        merged = {}
        for name, entry in self.manifest.index.items():
            old = load_column(self.out, name, entry, None, max_len=2**62)
            new = columns[name]
            if name.endswith(".offsets"):  # strings and arrays: N+1 offsets into a blob or values
                new = new[1:] + old[-1]
            merged[name] = np.concatenate([old, new.astype(old.dtype, copy=False)])
        return merged

    def keep_previous(self) -> None:
        """Keep version N's manifest under ``versions/`` before version N+1 replaces it."""
        kept = self.out / version_manifest_name(self.manifest.version)
        if not kept.exists():
            os.makedirs(self.out / VERSIONS_DIR, exist_ok=True)
            write_atomically(kept, read_regular(self.out / MANIFEST_NAME, MAX_MANIFEST_BYTES))

    def skipped_report(self, skipped: list[Skip]) -> Path | None:
        """``skipped.jsonl``: version N's lines, then the appended sources' (each with its version)."""
        path = self.out / SKIPPED_REPORT_NAME
        old = read_regular(path, 2**40) if self.manifest.packed.get("skipped_report") else b""
        if not skipped:
            return path if old else None
        lines = "".join(json.dumps({"path": s.rel, "reason": s.reason, "version": self.version}) + "\n"
                        for s in skipped)
        write_atomically(path, old + lines.encode())
        return path

    def appended(self, new: Manifest, skipped: int) -> Manifest:
        """The manifest of version N+1: version N's shards then ``new``'s (the appended records'
        alone, its index already merged), counts summed, and in ``packed`` this append's facts, the
        whole dataset's skips and ``versions``: what each version added."""
        old = self.manifest
        history = list(old.packed.get("versions") or [_version_facts(1, old.packed, old.num_records,
                                                                     len(old.shards), old.packed.get("skipped", 0))])
        history.append(_version_facts(self.version, new.packed, new.num_records, len(new.shards), skipped))
        total = (old.packed.get("skipped") if isinstance(old.packed.get("skipped"), int) else 0) + skipped
        return replace(new, num_records=old.num_records + new.num_records, total_bytes=old.total_bytes + new.total_bytes,
                       kind="images" if old.kind == new.kind == "images" else "files", shards=old.shards + new.shards,
                       version=self.version, packed={**new.packed, "skipped": total, "versions": history,
                                                     "skipped_report": SKIPPED_REPORT_NAME if total else None})


def _field_mismatch(old: Mapping[str, str], new: Mapping[str, str]) -> str | None:
    """The first field that differs, in words that end before the dataset's name, or None."""
    for name, dtype in {**old, **new}.items():
        if name not in new:
            return f"has no field {name!r} ({dtype}), which every record has in"
        if name not in old:
            return f"field {name!r} ({dtype}) is new, no record has it in"
        if old[name] != dtype:
            return f"field {name!r} is {dtype}, it is {old[name]} in"
    return None


def _as_given(types: Mapping[str, str]) -> dict[str, str]:
    return {n: "mask" if t == "mask-rows" else t for n, t in types.items()}  # a writer is given a mask as one


def _version_facts(version: int, packed: dict[str, Any], records: int, shards: int, skipped: Any) -> dict[str, Any]:
    return {"version": version, "source": packed.get("source"), "created": packed.get("created"),
            "records": records, "shards": shards, "skipped": skipped}


def pack_append(job: Any, out: Path, allow_duplicates: bool = False) -> PackReport:
    """Pack ``job`` (converters.packing.job) as the next version of the dataset at ``out``; the
    records the dataset holds already are left out and counted (converters.destination.append_held),
    unless ``allow_duplicates``. What will be added is logged before anything is written."""
    with PackLock(out):
        base = AppendBase.open(out)  # under the lock: no other pack changes it from here on
        if base.manifest.packed.get("plan") == plan_digest(job.plans) and not allow_duplicates:
            report = already_packed(out, base.manifest)  # this exact append finished: nothing to add
            report.version = base.manifest.version
            return report
        listing = job.listing
        base.check(job.options["storage"], {**listing.fields, **listing.file_fields}, listing.classes,
                   [item.label for item in listing.items], all(listing.is_image(i) for i in listing.items),
                   listing.root)
        held = [] if allow_duplicates else held_records(out, base.manifest, job)
        if held:
            job.leave_out(held)
        if not listing.items:
            report = already_packed(out, base.manifest)
            report.held = len(held)
            return report
        _log.info("%s: appending %d record%s of %s as version %d%s", out, len(listing.items),
                  "" if len(listing.items) == 1 else "s", listing.root, base.version,
                  f"; {len(held)} more {'is' if len(held) == 1 else 'are'} held by the dataset already "
                  "(same path and content), left out: --allow-duplicates appends them" if held else "")
        job.plans, job.base = base.renumber(job.plans), base
        report = job.pack_into(out)
    report.out, report.held = out, len(held)
    return report


def writer_schema(base: AppendBase, format: str | None, fields: Mapping[str, str] | None,
                  classes: list[str] | None) -> tuple[str, Schema]:
    """What a ``fastload.Writer(append=True)`` writes: the dataset's storage kind, and its samples
    checked against the dataset's fields and classes (or those given, which must fit them)."""
    old = base.manifest
    given = dict(fields) if fields is not None else _as_given(old.fields)
    problem = _field_mismatch(_as_given(old.fields), _as_given(given))
    if problem is not None:
        raise PackError(f"fields=: {problem} {base.out}; leave fields out to write the dataset's ("
                        f"{', '.join(f'{n}: {t}' for n, t in old.fields.items()) or 'none'})")
    if format is not None and format != old.storage:
        raise PackError(f"{base.out}: holds {old.storage} shards, and an append adds shards of the dataset's "
                        f"kind; pass format={old.storage!r} (or leave it out), not {format!r}")
    schema = Schema(given, classes if classes is not None else old.classes)
    # without class names a label is a number: the samples have one when the dataset's records do
    labels = load_column(base.out, "label", old.index["label"], old.num_records)
    schema.has_label = old.classes is not None or classes is not None or bool(np.any(labels >= 0))
    schema.seen = True  # decided here, not by the first sample
    return old.storage, schema
