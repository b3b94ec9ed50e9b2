"""Cluster packing, the driver's side without Ray Data: the write tasks' settings, OUT (a shared
folder or a store URL) checked and locked, and the tasks' parts adopted as one dataset, manifest
last. ``PackSink`` (a Ray Data sink) and ``fastload pack --ray`` (plain Ray tasks) both drive one;
the CLI path so never imports Ray Data (~0.4 s and pandas on a job's first pack).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from fastload.converters.cluster.folder_target import FolderTarget
from fastload.converters.cluster.store_target import StoreTarget
from fastload.converters.cluster.task_shards import SinkSettings, TaskPart
from fastload.converters.packing.options import on_error_spelling
from fastload.converters.packing.report import PackReport
from fastload.converters.writers import WRITERS

from fastload.config import MAX_FILE_SIZE, MAX_PIXELS, parse_size
from fastload.format import StorageKind
from fastload.storage.location import is_remote


class ClusterPack:
    """One cluster pack into ``out``: ``start`` before the tasks run, then ``finish`` with their
    parts (the report), or ``give_up`` (OUT unlocked, no manifest, the parts kept for a re-run).
    Arguments as ``fastload.ray.PackSink``'s; OUT is checked here, when made: tasks get a copy made
    before ``start``."""

    def __init__(self, out: str | os.PathLike[str], *, image: str, label: str | None, key: str,
                 order: str | None, fields: Sequence[str] | Mapping[str, str], classes: Sequence[str] | None,
                 format: StorageKind = "lmdb", shard_size: str | int = "256MB", overwrite: bool = False,
                 quality: int | None = None, on_error: Literal["raise", "skip"] = "raise",
                 check: Literal["header", "decode"] = "header", max_pixels: int = MAX_PIXELS,
                 max_file_size: str | int = MAX_FILE_SIZE, mask_storage: Literal["rows", "file"] = "rows",
                 storage_options: dict[str, Any] | None = None, origin: dict[str, Any] | None = None) -> None:
        if format not in WRITERS:
            raise ValueError(f"format={format!r}: choose one of {', '.join(WRITERS)}")
        on_error = on_error_spelling(on_error, stacklevel=4)  # type: ignore[assignment]
        if check not in ("header", "decode"):
            raise ValueError(f"check={check!r}: choose 'header' or 'decode'")
        self.shard_bytes = parse_size(shard_size, name="shard_size")
        types = dict(fields) if isinstance(fields, Mapping) else None
        settings = SinkSettings(
            work="", image=image, label=label, key=key, fields=tuple(fields), types=types,
            classes=tuple(classes) if classes is not None else None,
            writer={"format": format, "shard_size": self.shard_bytes, "quality": quality, "on_error": on_error,
                    "check": check, "max_pixels": max_pixels, "max_file_size": max_file_size,
                    "mask_storage": mask_storage}, order=order, storage_options=storage_options,
            origin=origin)
        self.target: FolderTarget | StoreTarget = (
            StoreTarget(str(out), overwrite, storage_options, settings.facts()) if is_remote(out)
            else FolderTarget(out, overwrite))
        self.out = self.target.out
        self.settings = dataclasses.replace(settings, work=self.target.work)
        self.report: PackReport | None = None

    def start(self) -> None:
        """OUT locked for this pack and its work folder made (a re-run's finished parts kept)."""
        self.target.start()

    def check_task(self) -> None:
        """In a write task: OUT's work folder is reachable from this node."""
        self.target.check_task()

    def finish(self, parts: list[TaskPart | None]) -> PackReport:
        """The parts adopted in order, the index written, then the manifest, last; the report."""
        self.report = self.target.finish(parts, self.settings)
        return self.report

    def give_up(self) -> None:
        """No manifest written: OUT holds no new dataset (an overwritten one stays); the tasks'
        finished parts stay in OUT's work folder, and running the same pack again reuses them."""
        self.target.give_up()
