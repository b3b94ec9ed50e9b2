"""Cluster packing on Ray Data: ``PackSink``, a Datasink whose write tasks each write whole shards
(converters.cluster.task_shards) and whose driver adopts them as one dataset, manifest last
(converters.cluster.adopt). Imported through ``fastload.ray``, which checks Ray is installed.

OUT follows ``pack``'s rules (converters.destination.out_dir): new, an unfinished pack (a Ray
pack's finished task datasets are reused), or with ``overwrite`` a finished dataset, replaced
only once the new one is complete. OUT must be a path every node sees (a shared file system).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from fastload.converters.cluster.adopt import adopt
from fastload.converters.cluster.task_shards import SinkSettings, TaskPart, write_rows
from fastload.converters.destination.out_dir import (
    PackLock,
    inspect_out,
    prepare_out,
    remove_dataset,
    staging_path,
    swap_in,
)
from fastload.converters.packing.report import PackReport
from fastload.converters.writers import WRITERS
from ray.data.block import Block, BlockAccessor
from ray.data.datasource.datasink import Datasink, WriteResult

from fastload.config import MAX_FILE_SIZE, MAX_PIXELS, parse_size
from fastload.errors import PackError
from fastload.format import PACK_STATE_DIR, Manifest, StorageKind
from fastload.format.files import ensure_dir
from fastload.format.folder import RAY_WORK_DIR
from fastload.storage.location import is_remote


class PackSink(Datasink[TaskPart | None]):
    """A Ray Data sink that packs a dataset's rows into a fastload dataset at ``out``
    (``ds.write_datasink(PackSink(out, ...))``; docs/ray.md).

    Each write task sorts its rows by ``key`` and writes them as whole shards with the Writer's
    checks and encodings (``fastload.Writer``); the driver then links the shards into ``out`` in key
    order, joins the index columns and writes the manifest, last. ``report`` holds the
    ``PackReport`` once the write is done.

    Args:
        out: The dataset folder, on a file system every node of the cluster sees.
        image: The column holding each record's image (bytes, a NumPy array, a path).
        label: The column holding its label (a number, or a class name); ``None``: no labels.
        key: The column naming each record (unique text: the index's ``path``); records are
            written in key order, unless ``order`` names another column.
        order: A column of whole numbers (or text) records are written in the order of, instead
            of their key's (``fastload pack --ray`` passes the local listing's positions).
        fields: Other columns to keep, by name (typed from the values) or as ``{name: type}``.
        classes: Class names in label order; default: the names found, sorted (as a folder's).
        format: Shard storage, ``"lmdb"`` or ``"hdf5"``.
        shard_size: Bytes per shard (``"256MB"``); each write task gets about this much input.
        overwrite: Replace a finished dataset at ``out``, once the new one is complete.
        quality: As ``fastload.Writer``'s: arrays given as the image encoded as JPEG at this quality.
        on_error: ``"fail"``, or ``"skip"``: a bad row is left out, counted and reported.
        check: ``"header"`` checks each image's structure; ``"decode"`` decodes every pixel too.
        mask_storage: As ``fastload.Writer``'s.
    """

    def __init__(self, out: str | os.PathLike[str], *, image: str = "image", label: str | None = "label",
                 key: str = "path", order: str | None = None, fields: Sequence[str] | Mapping[str, str] = (),
                 classes: Sequence[str] | None = None, format: StorageKind = "lmdb", shard_size: str | int = "256MB",
                 overwrite: bool = False, quality: int | None = None, on_error: Literal["fail", "skip"] = "fail",
                 check: Literal["header", "decode"] = "header", max_pixels: int = MAX_PIXELS,
                 max_file_size: str | int = MAX_FILE_SIZE, mask_storage: Literal["rows", "file"] = "rows") -> None:
        if format not in WRITERS:
            raise ValueError(f"format={format!r}: choose one of {', '.join(WRITERS)}")
        if on_error not in ("fail", "skip") or check not in ("header", "decode"):
            raise ValueError(f"on_error={on_error!r}, check={check!r}: choose 'fail' or 'skip', 'header' or 'decode'")
        if is_remote(out):
            raise PackError(f"{out}: PackSink writes to a file system path every node sees; packing to an object "
                            "store from Ray is not supported yet: pack to a shared folder, then upload it")
        self.out = Path(os.path.realpath(out))
        self.overwrite = overwrite
        self.shard_bytes = parse_size(shard_size, name="shard_size")
        # Decided here, not in on_write_start: the tasks get a copy of this object made before it.
        found = inspect_out(self.out)
        if found.state == "dataset" and not overwrite:
            raise PackError(f"{self.out}: already holds a finished dataset; pass overwrite=True to replace it, "
                            "or choose another folder")
        self.old: Manifest | None = found.manifest
        self.folder = staging_path(self.out) if self.old is not None else self.out
        types = dict(fields) if isinstance(fields, Mapping) else None
        self.settings = SinkSettings(
            work=str(self.folder / PACK_STATE_DIR / RAY_WORK_DIR), image=image, label=label, key=key,
            fields=tuple(fields), types=types, classes=tuple(classes) if classes is not None else None,
            writer={"format": format, "shard_size": self.shard_bytes, "quality": quality, "on_error": on_error,
                    "check": check, "max_pixels": max_pixels, "max_file_size": max_file_size,
                    "mask_storage": mask_storage}, order=order)
        self.report: PackReport | None = None
        self._lock: PackLock | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_lock": None}  # the driver's lock stays with the driver

    @property
    def min_bytes_per_write(self) -> int:
        return self.shard_bytes

    def on_write_start(self, schema: Any = None) -> None:
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
        ensure_dir(self.settings.work)

    def write(self, blocks: Iterable[Block], ctx: Any) -> TaskPart | None:
        if not os.path.isdir(self.settings.work):
            raise PackError(f"{self.settings.work}: not found from this node; PackSink's output must be on a file "
                            "system every node of the cluster sees")
        rows = (row for block in blocks for row in BlockAccessor.for_block(block).iter_rows(public_row_format=True))
        return write_rows(rows, self.settings)

    def on_write_complete(self, write_result: WriteResult[TaskPart | None]) -> None:
        try:
            report = adopt(self.folder, Path(self.settings.work), list(write_result.write_returns), self.settings)
            if self.old is not None:
                swap_in(self.folder, self.out)
                if self._lock is not None:  # its file went with the new dataset, to OUT
                    self._lock.path = self.out / self._lock.path.name
                self._release()
                remove_dataset(self.folder, self.old)  # the old dataset, now at the staging name
                report.out = self.out
        finally:
            self._release()
        self.report = report

    def on_write_failed(self, error: Exception) -> None:
        """No manifest is written: OUT holds no new dataset (an overwritten one stays); the tasks'
        finished datasets stay in OUT's work folder, and running the same pack again reuses them."""
        self._release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.__exit__(None)
            self._lock = None
