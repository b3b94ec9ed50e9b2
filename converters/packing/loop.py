"""Pack orchestration: list SRC → parallel read + check → shard writers → index + manifest, resumable."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Literal

from fastload.converters.destination.append import pack_append, storage_for_append
from fastload.converters.packing.dataset_pack import DatasetPackJob
from fastload.converters.packing.dataset_reads import default_dataset_workers
from fastload.converters.packing.job import pack_job
from fastload.converters.packing.local import pack_local
from fastload.converters.packing.options import (
    check_options,
    check_out_location,
    default_out,
    on_error_spelling,
)
from fastload.converters.packing.report import PackReport
from fastload.converters.sources.items import Layout, normalize_extensions
from fastload.converters.sources.listing import list_to_pack
from fastload.converters.sources.torch_dataset import is_sequence_source

from fastload.config import MAX_FILE_SIZE, MAX_PIXELS
from fastload.format import StorageKind
from fastload.format.layout import IMAGE_EXTENSIONS
from fastload.storage.location import is_remote, local_path
from fastload.storage.remote import RemoteStore

OnError = Literal["raise", "skip"]  # "fail": the old spelling of "raise" (converters.packing.options)
MaskStorage = Literal["rows", "file"]


def pack(src: str | os.PathLike[str] | Any, out: str | os.PathLike[str] | None = None, *,
         format: StorageKind | None = None, shard_size: str | int = "256MB", workers: int | None = None,
         extensions: list[str] | None = None, on_error: OnError = "raise", max_side: int | None = None,
         quality: int | None = None, overwrite: bool = False, append: bool = False, progress: bool | None = None,
         layout: Layout = "auto", check: Literal["header", "decode"] = "header",
         max_pixels: int = MAX_PIXELS, restart_markers: bool = False,
         max_file_size: str | int = MAX_FILE_SIZE, storage_options: dict[str, Any] | None = None,
         staging: str | os.PathLike[str] | None = None, sidecars: bool = False,
         file_columns: list[str] | tuple[str, ...] = (), root: str | os.PathLike[str] | None = None,
         allow_outside_root: bool = False, sidecar_names: dict[str, str] | None = None,
         image_column: str | None = None, label_column: str | None = None,
         columns: list[str] | tuple[str, ...] | None = None, mask_storage: MaskStorage | None = None,
         allow_duplicates: bool = False) -> PackReport:
    """Pack a folder, file list, tars or tables into a fastload dataset; see ``fastload pack --help``.

    Returns a PackReport (``already_packed`` when OUT holds this exact pack). Raises SourceError /
    SourceNotFoundError for a bad source or file (with ``on_error="raise"``) and PackError when
    the output cannot be written. With ``overwrite`` a finished dataset at OUT is replaced only
    once the new one is complete (see converters.destination.out_dir); ``append`` adds to it (destination.append).

    SRC and OUT may be object-store URLs (``s3://bucket/images/``), reached with
    ``storage_options``; a pack to a store is written in the local ``staging`` folder and each
    shard uploaded as it finishes (see converters.destination.upload). ``sidecars``: a folder's ``.json`` and
    ``.txt`` files beside each image, of its basename, become its fields, and other images or
    ``.npy`` files of its basename its file fields (see converters.sources.sidecars), named by extension
    unless ``sidecar_names`` renames one (``{"png": "mask"}``). ``file_columns``: the
    columns of a file list that name more files of each record (a mask, a depth map), packed beside
    its file as file fields (see converters.sources.file_fields). A file list's paths (and file columns)
    must resolve inside ``root`` (default: the list's folder) unless ``allow_outside_root``; none
    is ever read from /proc, /sys or /dev (see converters.sources.confine).

    A map-style dataset as SRC (a torch ``Dataset``, or a sequence of samples as ``Writer.write`` takes
    them or ``(image, label[, {fields}])`` tuples; it needs ``out``) packs one record per item, read
    in ``workers`` processes, resumable after a kill (see converters.packing.dataset_pack).

    Tables (a ``.parquet``, ``.arrow`` or ``.feather`` file, a folder of them, a Hugging Face
    ``save_to_disk`` folder, or SRC an in-memory ``datasets.Dataset``, which needs ``out``) pack
    one record per row (see converters.sources.tables): ``image_column`` holds the image bytes
    (default: the one binary column, or HF ``Image`` column), ``label_column`` the label (default:
    ``label`` when there is one; whole numbers, class names, or an HF ``ClassLabel``), and every
    other column, or those ``columns`` names, is a typed field.

    ``mask_storage``: a one-channel mask file field is stored as its values' rows (``"rows"``, the
    default: type "mask-rows", a crop decodes only its rows: fastload.format.mask_rows) or as the
    file given (``"file"``: type "mask", a PNG inflated whole for each crop); an append stores
    masks as the dataset does.

    ``append`` leaves out the records the dataset holds already (the same path, and the same
    bytes as they would be stored), counted in the report, unless ``allow_duplicates``.
    """
    started = time.perf_counter()
    on_error = on_error_spelling(on_error)  # type: ignore[assignment]
    if allow_duplicates and not append:
        raise ValueError("allow_duplicates=True is for append=True (--allow-duplicates with --append): "
                         "a pack without append writes each listed record once")
    format, mask_storage = (storage_for_append(src, out, format, overwrite, mask_storage) if append  # type: ignore[assignment]
                            else (format or "lmdb", mask_storage or "rows"))
    table = {"image_column": image_column, "label_column": label_column,
             "columns": None if columns is None else tuple(columns)}
    if not isinstance(src, (str, os.PathLike)):  # an in-memory dataset: no path to put OUT beside
        if out is None:
            raise ValueError(f"an in-memory {type(src).__name__} as SRC needs out= (the dataset folder to write)")
        given = {"extensions": extensions, "layout": layout != "auto", "storage_options": storage_options,
                 "staging": staging, "sidecars": sidecars, "file_columns": file_columns, "root": root,
                 "allow_outside_root": allow_outside_root, "sidecar_names": sidecar_names}
        if any(given.values()):
            raise ValueError(f"{next(k for k, v in given.items() if v)}= is for sources on disk; an in-memory "
                             f"{type(src).__name__}'s columns are chosen with image_column=, label_column=, columns=")
        return _pack_object(src, out, table, started, format=format, shard_size=shard_size, workers=workers,
                            on_error=on_error, max_side=max_side, quality=quality, check=check,
                            max_pixels=max_pixels, restart_markers=restart_markers, max_file_size=max_file_size,
                            overwrite=overwrite, progress=progress, mask_storage=mask_storage)
    src_store = RemoteStore(str(src), storage_options) if is_remote(src) else None
    out_remote = out is not None and is_remote(out)
    if src_store is None and not out_remote and storage_options:
        raise ValueError("storage_options are for object-store URLs (s3://...); SRC and OUT are local paths")
    src_path = Path(local_path(src)) if src_store is None else None
    if out is None and src_path is None:
        raise ValueError(f"{src}: a source in an object store needs -o/--out (a local folder or a URL)")
    out_path = (None if out_remote else
                Path(local_path(out)) if out is not None else default_out(src_path))
    if out_path is not None and out_path.is_symlink():  # the user named a link to their folder: pack where it points
        out_path = Path(os.path.realpath(out_path))
    options = check_options(format, shard_size, workers, on_error, max_side, quality, check, max_pixels,
                             restart_markers, max_file_size, mask_storage)
    exts = normalize_extensions(extensions)
    listing = list_to_pack(src, src_store, src_path, layout=layout, extensions=exts, on_error=on_error,
                           options=options, sidecars=sidecars, file_columns=tuple(file_columns), root=root,
                           allow_outside_root=allow_outside_root, sidecar_names=sidecar_names, table=table)
    if src_path is not None and out_path is not None:
        check_out_location(src_path, listing.root, out_path)
    job = pack_job(listing, options, exts, progress, src_store)
    if out_path is None:
        from fastload.converters.destination.upload import pack_to_store

        report = pack_to_store(job, RemoteStore(str(out), storage_options), staging, overwrite)
    else:
        report = (pack_append(job, out_path, allow_duplicates) if append
                  else pack_local(job, out_path, overwrite))
    report.elapsed_s = time.perf_counter() - started
    return report


def _pack_object(src: Any, out: str | os.PathLike[str], table: dict[str, Any], started: float, *,
                 overwrite: bool, progress: bool | None, **checked: Any) -> PackReport:
    """Pack an in-memory dataset (a ``datasets.Dataset``, or a map-style torch Dataset or sequence of
    samples: converters.packing.dataset_pack) to a local folder."""
    if is_remote(out):
        raise ValueError(f"{out}: an in-memory dataset is packed to a local folder; upload that folder after")
    options = check_options(**checked)
    out_path = Path(os.path.realpath(local_path(out)))
    if is_sequence_source(src):
        if any(v is not None for v in table.values()):
            raise ValueError("image_column=, label_column=, columns= are for tables; a dataset's items name their fields")
        with DatasetPackJob(src, {**options, "workers": checked["workers"] or default_dataset_workers()},
                            progress, overwrite) as job:
            report = pack_local(job, out_path, overwrite)
    else:
        listing = list_to_pack(src, None, None, layout="auto", extensions=IMAGE_EXTENSIONS,
                               on_error=checked["on_error"], options=options, sidecars=False, file_columns=(),
                               table=table)
        report = pack_local(pack_job(listing, options, IMAGE_EXTENSIONS, progress, None), out_path, overwrite)
    report.elapsed_s = time.perf_counter() - started
    return report
