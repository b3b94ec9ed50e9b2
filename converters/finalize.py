"""Finishing a pack: the index columns, the skipped-files report, then the manifest, written last."""

from __future__ import annotations

import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from fastload.converters.destination.append import AppendBase
from fastload.converters.packing.report import PackReport, write_skipped_report
from fastload.converters.sources.items import Skip
from fastload.errors import PackError
from fastload.format import (
    FIELD_PREFIX, PACK_STATE_DIR, SKIPPED_REPORT_NAME, Manifest, ShardInfo, StorageKind, encode_arrays,
    encode_strings, file_digest, write_columns, write_manifest,
)
from fastload.format.layout import FILE_COLUMNS, array_type


def finalize(out: Path, storage: StorageKind, listing: Any, records: list[dict[str, Any]],
             options: dict[str, Any], exts: tuple[str, ...], plan: str,
             extra: dict[str, Any] | None = None, base: AppendBase | None = None) -> PackReport:
    """Index columns, skipped report, then the manifest, written last; ``extra``: more of the
    manifest's ``packed`` facts (the Python writer's image encoder); ``base``: the dataset the
    records are appended to (its columns first, its shards kept, the next version)."""
    skipped = list(listing.skipped) + [Skip(rel, reason) for r in records for rel, reason in r["skips"]]
    kept_as_is = [Skip(rel, reason) for r in records for rel, reason in r.get("kept_as_is", [])]
    items = np.array([i for r in records for i in r["items"]], dtype=np.int64)
    if len(items) == 0:
        raise PackError(f"{listing.root}: no file could be packed ({len(skipped)} skipped: first "
                        f"{skipped[0].rel if skipped else '?'}: {skipped[0].reason if skipped else '?'})")
    first = base.first_shard if base is not None else 0
    shard_col = np.concatenate([np.full(len(r["items"]), first + k, dtype=np.int32) for k, r in enumerate(records)])
    classes, labels = listing.classes, np.array([listing.items[i].label for i in items], dtype=np.int64)
    if base is not None:  # new class names after the dataset's: its labels keep their meaning
        base.check(storage, {**listing.fields, **listing.file_fields}, classes, labels,
                   all(listing.is_image(listing.items[i]) for i in items), listing.root)
        classes, labels = base.labels(classes, labels)
    columns: dict[str, np.ndarray] = {
        "label": labels,
        "shard": shard_col,
        "position": np.concatenate([np.array(r.get("positions", range(len(r["items"]))), dtype=np.int64)
                                    for r in records]),
        "offset": np.array([o for r in records for o in r["offsets"]], dtype=np.int64),
        "size": np.array([s for r in records for s in r["sizes"]], dtype=np.int64),
        "checksum": np.array([c for r in records for c in r["checksums"]], dtype=np.uint64),
        "width": np.array([w for r in records for w in r["widths"]], dtype=np.int32),
        "height": np.array([h for r in records for h in r["heights"]], dtype=np.int32),
    }
    _add_strings(columns, "path", [listing.items[i].rel for i in items])
    for name, dtype in listing.fields.items():
        values = [listing.field_values[name][i] for i in items]
        if dtype == "str":
            _add_strings(columns, FIELD_PREFIX + name, values)
        elif (kind := array_type(dtype)) is not None:
            offsets, flat = encode_arrays(values, kind[0])
            columns[f"{FIELD_PREFIX}{name}.offsets"], columns[f"{FIELD_PREFIX}{name}.values"] = offsets, flat
        else:
            columns[FIELD_PREFIX + name] = np.array(values, dtype=dtype)
    for name in listing.file_fields:
        for part, dtype in FILE_COLUMNS.items():
            columns[f"{FIELD_PREFIX}{name}.{part}"] = np.array(
                [v for r in records for v in r["files"][name][part + "s"]], dtype=dtype)
    index = (write_columns(out, columns) if base is None else
             write_columns(out, base.merge(columns), base.index_dir))
    shards, first = [], 0
    for r in records:
        n = len(r["items"])
        checksums = [columns["checksum"][first:first + n].tobytes()]
        checksums += [columns[f"{FIELD_PREFIX}{name}.checksum"][first:first + n].tobytes()
                      for name in listing.file_fields]
        files_bytes = sum(sum(r["files"][name]["sizes"]) for name in listing.file_fields)
        shards.append(ShardInfo(file=r["file"], num_records=n, bytes=r["bytes"],
                                data_bytes=sum(r["sizes"]) + files_bytes, records_digest=file_digest(b"".join(checksums)),
                                data_offset=r["data_offset"], num_entries=r.get("entries", n)))
        first += n
    report_path = write_skipped_report(out, skipped) if base is None else base.skipped_report(skipped)
    is_images = all(listing.is_image(listing.items[i]) for i in items)
    from fastload import __version__

    manifest = Manifest(
        storage=storage, num_records=len(items), total_bytes=sum(shard.data_bytes for shard in shards),
        kind="images" if is_images else "files", classes=classes, shards=shards, index=index,
        fields={**listing.fields, **listing.file_fields},
        packed={"source": listing.source or str(listing.root), "layout": listing.layout,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "fastload_version": __version__, "reencode": options["reencode"],
                "check": options["check"], "max_pixels": options.get("max_pixels"),
                "extensions": list(exts), "shard_size": options["shard_size"],
                "restart_markers": ({"kept_as_is": len(kept_as_is)} if options["restart_markers"]
                                    else None),
                "skipped": len(skipped), "skipped_report": SKIPPED_REPORT_NAME if report_path else None,
                "ignored": dict(listing.ignored), "plan": plan, **(extra or {})},
    )
    if base is not None:
        manifest = base.appended(manifest, len(skipped))
        base.keep_previous()
    write_manifest(out, manifest)  # an append: version N+1 replaces N here, in one rename
    shutil.rmtree(out / PACK_STATE_DIR, ignore_errors=True)
    return PackReport(out=out, storage=storage, num_records=len(items),
                      total_bytes=sum(shard.data_bytes for shard in shards), num_shards=len(shards),
                      skipped=len(skipped), skipped_files=skipped, skipped_report=report_path,
                      ignored=dict(listing.ignored), kept_as_is=kept_as_is, version=manifest.version)


def _add_strings(columns: dict[str, np.ndarray], name: str, values: list[str]) -> None:
    columns[f"{name}.offsets"], columns[f"{name}.blob"] = encode_strings(values)
