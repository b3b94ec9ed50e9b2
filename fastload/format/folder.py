"""What a folder without a manifest is: the names a pack leaves while it runs, and the message a
reader gives for a source folder, an empty folder or an unfinished pack."""

from __future__ import annotations

import os
import re
from pathlib import Path

from fastload.format.layout import (
    IMAGE_EXTENSIONS, INDEX_DIR, MANIFEST_NAME, PACK_LOCK_NAME, PACK_OWNER_NAME, PACK_STATE_DIR, SHARD_NAME,
    SKIPPED_REPORT_NAME, STAGING_MARKER_NAME, UPLOAD_JOURNAL_NAME,
)

WRITE_PROBE = ".pack.write-test"
# Names a running or interrupted pack may leave at the top of its folder (shards: SHARD_NAME).
PACK_WORK_NAMES = frozenset({PACK_STATE_DIR, PACK_LOCK_NAME, WRITE_PROBE, INDEX_DIR, SKIPPED_REPORT_NAME,
                             SKIPPED_REPORT_NAME + ".tmp", MANIFEST_NAME + ".tmp", UPLOAD_JOURNAL_NAME,
                             STAGING_MARKER_NAME})
# Names a pack writes inside PACK_STATE_DIR: its owner file, journal entries, shards being written.
DATASET_PLAN_NAME = "dataset-plan.json"  # a map-style dataset's pack: its shard plan (converters.packing.dataset_plan)
RAY_WORK_DIR = "ray"  # a Ray pack's write tasks' datasets, adopted at its end (converters.cluster)
_PACK_STATE_ENTRY = re.compile(
    rf"^(?:{re.escape(PACK_OWNER_NAME)}|{re.escape(DATASET_PLAN_NAME)}|{RAY_WORK_DIR}|shard-\d{{5,}}\.json|shard-\d{{5,}}\.(?:lmdb|h5)\.tmp(?:\.exact)?)(?:\.tmp)?$")
_LOOK_AT = 2000  # entries looked at to tell an image folder from anything else


def left_by_a_pack(name: str) -> bool:
    """Whether ``name`` (at the top of a folder) is something fastload's pack writes."""
    return bool(SHARD_NAME.match(name.removesuffix(".tmp").removesuffix(".exact"))) or name in PACK_WORK_NAMES


def in_pack_state(name: str) -> bool:
    """Whether ``name`` (inside PACK_STATE_DIR) is something fastload's pack writes there."""
    return bool(_PACK_STATE_ENTRY.match(name))


def missing_manifest_message(root: Path) -> str:
    """What the existing folder ``root``, which has no manifest, is, and what to do."""
    names = [Path(p).name for p in _entries(root)]
    if not names:
        return f"{root}: is empty, not a packed dataset; pass the folder `fastload pack` wrote (it holds {MANIFEST_NAME})"
    if any(left_by_a_pack(name) for name in names):
        return (f"{root}: holds an unfinished pack (shards, no {MANIFEST_NAME}), so it is not a finished "
                "dataset yet; run the same `fastload pack` command again to finish it")
    if _holds_images(root):
        out = root.with_name(root.name + ".fl")
        done = f" (a packed copy is already there: `fastload info {out}`)" if (out / MANIFEST_NAME).exists() else ""
        return (f"{root}: is a folder of images, not a packed dataset; pack it with "
                f"`fastload pack {root} -o {out}`{done}")
    return (f"{root}: has no {MANIFEST_NAME} and holds no images or shards, so it is not a packed "
            "dataset; pass the folder `fastload pack` wrote")


def _holds_images(root: Path) -> bool:
    """An image file in ``root`` or one level below (an ImageFolder's class folders)."""
    seen = 0
    for directory in (root, *sorted(p for p in _entries(root) if p.is_dir())):
        for entry in _entries(directory):
            seen += 1
            if entry.name.lower().endswith(IMAGE_EXTENSIONS) and entry.is_file():
                return True
            if seen >= _LOOK_AT:
                return False
    return False


def _entries(directory: Path) -> list[Path]:
    try:
        with os.scandir(directory) as it:
            return [Path(e.path) for _, e in zip(range(_LOOK_AT), it)]
    except OSError:
        return []
