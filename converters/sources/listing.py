"""SRC → what to pack: a store prefix, or a local folder or file list with its sidecars and file
columns attached (converters.sources.sidecars, converters.sources.file_fields)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastload.converters.sources.folders import list_source
from fastload.converters.sources.items import Layout, SourceListing
from fastload.converters.sources.store import list_store_source
from fastload.converters.sources.table_files import is_table_source
from fastload.converters.sources.tars import is_tar_source

from fastload.errors import SourceError
from fastload.format.layout import IMAGE_EXTENSIONS


def list_to_pack(src: object, src_store: Any, src_path: Path | None, **options: Any) -> SourceListing:
    """The listing of ``src`` (see ``_listing``), with ``source``: SRC as named (a path made
    absolute, a URL or brace list as given), what the manifest says it was packed from."""
    listing = _listing(src, src_store, src_path, **options)
    if src_path is not None:
        listing.source = os.path.abspath(src_path)
    elif src_store is not None:
        listing.source = str(src)
    return listing


def _listing(src: object, src_store: Any, src_path: Path | None, *, layout: Layout, extensions: tuple[str, ...],
             on_error: str, options: dict[str, Any], sidecars: bool, file_columns: tuple[str, ...],
             root: str | os.PathLike[str] | None = None, allow_outside_root: bool = False,
             sidecar_names: dict[str, str] | None = None, table: dict[str, Any] | None = None) -> SourceListing:
    """The listing of ``src`` (``src_store`` for a store prefix, else the local ``src_path``, else
    ``src`` is an in-memory dataset) in record order, each item with its record's other files; a
    file list's paths confined to ``root`` (None: its folder) unless ``allow_outside_root`` (see
    converters.sources.confine). ``table``: the image/label/field columns of a table source."""
    table = {k: v for k, v in (table or {}).items() if v is not None}
    found = None  # what a store URL names: tars, tables or files (converters.sources.store_files)
    if src_store is not None and layout in ("auto", "webdataset", "table", "imagefolder"):
        from fastload.converters.sources.store_files import store_source

        found = store_source(src_store, layout)
        if found[0] == "tables":
            return _list_table(src, None, extensions, options, sidecars, file_columns, root, allow_outside_root,
                               sidecar_names, table, found)
    if src_path is None and src_store is None or layout == "table" or (
            layout == "auto" and src_path is not None and is_table_source(src_path)):
        return _list_table(src, src_path, extensions, options, sidecars, file_columns, root, allow_outside_root,
                           sidecar_names, table)
    if table:
        raise SourceError(f"{src}: --{next(iter(table)).replace('_', '-')} is for tables (.parquet, .arrow, "
                          ".feather files and Hugging Face datasets), which SRC is not")
    if found is not None and found[0] == "tars":
        return _list_tars(src, layout, extensions, on_error, options, False, file_columns, root, allow_outside_root,
                          sidecar_names, found)
    if src_store is not None:
        if sidecars or sidecar_names or file_columns or root is not None or allow_outside_root:
            raise SourceError(f"{src}: --sidecars, --file-columns, --root and --allow-outside-root are for local "
                              "folders and file lists; a store prefix as SRC cannot have them yet: copy it to "
                              "a local folder first")
        return list_store_source(src_store, layout=layout, extensions=extensions, on_error=on_error,
                                 max_file_size=options["max_file_size"], objects=found and found[2])
    assert src_path is not None
    if layout == "webdataset" or (layout in ("auto", "imagefolder") and is_tar_source(src_path)):
        return _list_tars(src_path, layout, extensions, on_error, options, sidecars, file_columns, root,
                          allow_outside_root, sidecar_names)
    listing = list_source(src_path, layout=layout, extensions=extensions, on_error=on_error,
                          max_file_size=options["max_file_size"], root=root, allow_outside_root=allow_outside_root)
    if sidecars:
        if listing.layout == "list":
            raise SourceError(f"{src}: --sidecars is for folders; a file list names its fields as columns")
        from fastload.converters.sources.sidecars import attach_sidecars

        attach_sidecars(listing, on_error, sidecar_names)
    elif sidecar_names:
        raise SourceError(f"{src}: --sidecar-names renames the fields of --sidecars; add --sidecars")
    if file_columns:
        if listing.layout != "list":
            raise SourceError(f"{src}: --file-columns names columns of a CSV/JSONL file list; in a folder, "
                              "files that share a basename form one sample with --sidecars")
        from fastload.converters.sources.file_fields import attach_file_columns

        attach_file_columns(listing, file_columns, options["max_file_size"], on_error)
    if options["reencode"] and options["reencode"]["max_side"] and listing.file_fields:
        raise SourceError(f"{src}: --max-side would shrink the images but not their file fields "
                          f"({', '.join(listing.file_fields)}), which must stay their size; pack without it")
    return listing


def _list_tars(src: object, layout: str, extensions: tuple[str, ...], on_error: str, options: dict[str, Any],
               sidecars: bool, file_columns: tuple[str, ...], root: object, allow_outside_root: bool,
               sidecar_names: dict[str, str] | None, found: Any = None) -> SourceListing:
    """WebDataset tars, or an ImageFolder tree in tars (on disk, or ``found`` in a store): their
    members are grouped by key already (``--sidecars`` changes nothing); one ``--extensions`` names
    the image member (jpg) when samples hold several images, several choose a tree's images."""
    from fastload.converters.sources.store_files import list_store_tars
    from fastload.converters.sources.webdataset import list_tars

    if file_columns or root is not None or allow_outside_root:
        raise SourceError(f"{src}: --file-columns, --root and --allow-outside-root are for CSV/JSONL file lists; "
                          "a tar's members are its samples' fields already: leave them out")
    if found is None:
        listing = list_tars(src, on_error=on_error, max_file_size=options["max_file_size"],  # type: ignore[arg-type]
                            extensions=extensions, layout=layout, names=sidecar_names)
    else:
        _, folder, objects, others = found
        listing = list_store_tars(str(src), folder, objects, on_error=on_error, max_file_size=options["max_file_size"],
                                  extensions=extensions, layout=layout, names=sidecar_names)
        listing.ignored.update(others)
    if options["reencode"] and options["reencode"]["max_side"] and listing.file_fields:
        raise SourceError(f"{src}: --max-side would shrink the images but not their file fields "
                          f"({', '.join(listing.file_fields)}), which must stay their size; pack without it")
    return listing


def _list_table(src: object, src_path: Path | None, extensions: tuple[str, ...], options: dict[str, Any],
                sidecars: bool, file_columns: tuple[str, ...], root: object, allow_outside_root: bool,
                sidecar_names: dict[str, str] | None, table: dict[str, Any], found: Any = None) -> SourceListing:
    """Parquet / Arrow tables (on disk, or ``found`` in a store), or an in-memory Hugging Face dataset:
    one record per row."""
    from fastload.converters.sources.tables import is_dataset, list_dataset, list_tables

    where = src_path if src_path is not None else src if found is not None else "the dataset"
    if sidecars or sidecar_names or file_columns or root is not None or allow_outside_root:
        raise SourceError(f"{where}: --sidecars, --sidecar-names, --file-columns, --root and --allow-outside-root "
                          "are for folders and file lists; a table's columns are its fields: choose them with "
                          "--columns")
    if extensions != IMAGE_EXTENSIONS:
        raise SourceError(f"{where}: --extensions chooses files; a table's image is a column: name it with "
                          "--image-column")
    if found is not None:
        from fastload.converters.sources.store_files import list_store_tables

        _, folder, objects, others = found
        listing = list_store_tables(str(src), folder, objects, max_file_size=options["max_file_size"], **table)
        listing.ignored.update(others)
        return listing
    if src_path is None:
        if not is_dataset(src):
            raise SourceError(f"a {type(src).__name__} is not a source fastload packs: give a path or URL, a "
                              "datasets.Dataset, or a map-style dataset (len and [i]; an iterable one: write its "
                              "samples with fastload.Writer)")
        return list_dataset(src, max_file_size=options["max_file_size"], **table)
    return list_tables(src_path, max_file_size=options["max_file_size"], **table)
