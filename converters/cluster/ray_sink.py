"""Cluster packing on Ray Data: ``PackSink``, a Datasink whose write tasks each write whole shards
(converters.cluster.task_shards) and whose driver adopts them as one dataset, manifest last: in a
folder every node sees (converters.cluster.folder_target) or in an object store
(converters.cluster.store_target). Imported through ``fastload.ray``, which checks Ray is installed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from fastload.converters.cluster.cluster_pack import ClusterPack
from fastload.converters.cluster.task_shards import SinkSettings, TaskPart, write_rows
from fastload.converters.packing.report import PackReport
from ray.data.block import Block, BlockAccessor
from ray.data.datasource.datasink import Datasink, WriteResult

from fastload.config import MAX_FILE_SIZE, MAX_PIXELS
from fastload.format import StorageKind


class PackSink(Datasink[TaskPart | None]):
    """A Ray Data sink that packs a dataset's rows into a fastload dataset at ``out``
    (``ds.write_datasink(PackSink(out, ...))``; docs/ray.md).

    Each write task sorts its rows by ``key`` and writes them as whole shards with the Writer's
    checks and encodings (``fastload.Writer``); the driver then links the shards into ``out`` in key
    order (in a store: has the store copy them), joins the index columns and writes the manifest,
    last. ``report`` holds the ``PackReport`` once the write is done.

    Args:
        out: The dataset folder, on a file system every node of the cluster sees, or a store URL
            (``s3://bucket/out.fl``: the tasks upload their shards, the driver publishes the dataset).
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
        on_error: ``"raise"``, or ``"skip"``: a bad row is left out, counted and reported.
        check: ``"header"`` checks each image's structure; ``"decode"`` decodes every pixel too.
        mask_storage: As ``fastload.Writer``'s.
        storage_options: The store client's options when ``out`` is a URL (``endpoint_url``,
            ``key``, ...); by default the environment's, on every node.
    """

    def __init__(self, out: str | os.PathLike[str], *, image: str = "image", label: str | None = "label",
                 key: str = "path", order: str | None = None, fields: Sequence[str] | Mapping[str, str] = (),
                 classes: Sequence[str] | None = None, format: StorageKind = "lmdb", shard_size: str | int = "256MB",
                 overwrite: bool = False, quality: int | None = None, on_error: Literal["raise", "skip"] = "raise",
                 check: Literal["header", "decode"] = "header", max_pixels: int = MAX_PIXELS,
                 max_file_size: str | int = MAX_FILE_SIZE, mask_storage: Literal["rows", "file"] = "rows",
                 storage_options: dict[str, Any] | None = None) -> None:
        self.pack = ClusterPack(out, image=image, label=label, key=key, order=order, fields=fields, classes=classes,
                                format=format, shard_size=shard_size, overwrite=overwrite, quality=quality,
                                on_error=on_error, check=check, max_pixels=max_pixels, max_file_size=max_file_size,
                                mask_storage=mask_storage, storage_options=storage_options)
        self.out = self.pack.out
        self.overwrite = overwrite

    @property
    def settings(self) -> SinkSettings:
        """What every write task gets: where to write, the columns, the Writer's options."""
        return self.pack.settings

    @property
    def report(self) -> PackReport | None:
        """The pack's report, once the write is done."""
        return self.pack.report

    @property
    def min_bytes_per_write(self) -> int:
        return self.pack.shard_bytes

    def on_write_start(self, schema: Any = None) -> None:
        self.pack.start()

    def write(self, blocks: Iterable[Block], ctx: Any) -> TaskPart | None:
        self.pack.check_task()
        rows = (row for block in blocks for row in BlockAccessor.for_block(block).iter_rows(public_row_format=True))
        return write_rows(rows, self.settings)

    def on_write_complete(self, write_result: WriteResult[TaskPart | None]) -> None:
        self.pack.finish(list(write_result.write_returns))

    def on_write_failed(self, error: Exception) -> None:
        """No manifest is written: OUT holds no new dataset (an overwritten one stays); the tasks'
        finished datasets stay in OUT's work folder, and running the same pack again reuses them."""
        self.pack.give_up()
