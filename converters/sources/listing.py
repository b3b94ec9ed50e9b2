"""SRC → what to pack: a store prefix, or a local folder or file list with its sidecars and file
columns attached (converters.sources.sidecars, converters.sources.file_fields)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastload.converters.sources.folders import list_source
from fastload.converters.sources.items import Layout, SourceListing
from fastload.converters.sources.store import list_store_source
from fastload.errors import SourceError


def list_to_pack(src: object, src_store: Any, src_path: Path | None, *, layout: Layout, extensions: tuple[str, ...],
                 on_error: str, options: dict[str, Any], sidecars: bool, file_columns: tuple[str, ...],
                 root: str | os.PathLike[str] | None = None, allow_outside_root: bool = False,
                 sidecar_names: dict[str, str] | None = None) -> SourceListing:
    """The listing of ``src`` (``src_store`` for a store prefix, else the local ``src_path``) in
    record order, each item with its record's other files; a file list's paths confined to
    ``root`` (None: its folder) unless ``allow_outside_root`` (see converters.sources.confine)."""
    if src_store is not None:
        if sidecars or sidecar_names or file_columns or root is not None or allow_outside_root:
            raise SourceError(f"{src}: --sidecars, --file-columns, --root and --allow-outside-root are for local "
                              "folders and file lists; a store prefix as SRC cannot have them yet: copy it to "
                              "a local folder first")
        return list_store_source(src_store, layout=layout, extensions=extensions, on_error=on_error,
                                 max_file_size=options["max_file_size"])
    assert src_path is not None
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
