"""Cluster packing into a folder every node sees (a shared file system): OUT checked and locked for
the pack, the tasks' work folder inside it, and the finished dataset adopted there, or swapped in
over the one ``overwrite`` replaces only once it is complete (converters.destination.out_dir's rules)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastload.converters.cluster.adopt import adopt
from fastload.converters.cluster.task_shards import SinkSettings, TaskPart
from fastload.converters.destination.out_dir import (
    PackLock,
    inspect_out,
    prepare_out,
    remove_dataset,
    staging_path,
    swap_in,
)
from fastload.converters.packing.report import PackReport

from fastload.errors import PackError
from fastload.format import PACK_STATE_DIR, Manifest
from fastload.format.files import ensure_dir
from fastload.format.folder import RAY_WORK_DIR


class FolderTarget:
    """OUT, a folder: new, an unfinished pack (a Ray pack's finished task datasets are reused), or with
    ``overwrite`` a finished dataset. Checked when made (the tasks get a copy made before ``start``)."""

    def __init__(self, out: str | os.PathLike[str], overwrite: bool) -> None:
        self.out = Path(os.path.realpath(out))
        found = inspect_out(self.out)
        if found.state == "dataset" and not overwrite:
            raise PackError(f"{self.out}: already holds a finished dataset; pass overwrite=True to replace it, "
                            "or choose another folder")
        self.old: Manifest | None = found.manifest
        self.folder = staging_path(self.out) if self.old is not None else self.out
        self.work = str(self.folder / PACK_STATE_DIR / RAY_WORK_DIR)
        self._lock: PackLock | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_lock": None}  # the driver's lock stays with the driver

    def start(self) -> None:
        """Check OUT is as it was, lock the folder written and make the tasks' work folder."""
        found = inspect_out(self.out)
        if (found.manifest is None) != (self.old is None) or found.foreign:
            raise PackError(f"{self.out}: changed since this PackSink was made ({found.state}"
                            f"{', holds ' + found.foreign[0] if found.foreign else ''}); make a new PackSink")
        if self.old is not None:
            staged = inspect_out(self.folder)
            if staged.manifest is not None:
                remove_dataset(self.folder, staged.manifest)  # a replacement killed before its swap
        prepare_out(self.folder)
        self._lock = PackLock(self.folder).__enter__()
        ensure_dir(self.folder / PACK_STATE_DIR, 0o700)
        ensure_dir(self.work)

    def check_task(self) -> None:
        """In a write task: the work folder is seen from this node."""
        if not os.path.isdir(self.work):
            raise PackError(f"{self.work}: not found from this node; PackSink's output must be on a file "
                            "system every node of the cluster sees")

    def finish(self, parts: list[TaskPart | None], settings: SinkSettings) -> PackReport:
        """Adopt the tasks' datasets as the dataset at OUT (swapped in over the old one last)."""
        try:
            report = adopt(self.folder, Path(self.work), parts, settings)
            if self.old is not None:
                swap_in(self.folder, self.out)
                if self._lock is not None:  # its file went with the new dataset, to OUT
                    self._lock.path = self.out / self._lock.path.name
                self.give_up()
                remove_dataset(self.folder, self.old)  # the old dataset, now at the staging name
                report.moved_to(self.out)
        finally:
            self.give_up()
        return report

    def give_up(self) -> None:
        """Release the lock; no manifest was written, the tasks' datasets stay for a re-run."""
        if self._lock is not None:
            self._lock.__exit__(None)
            self._lock = None
