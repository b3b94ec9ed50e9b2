"""A source prefix in an object store (``s3://bucket/images/``) listed like a local folder:
the same layouts, record order, extensions, skips and errors, with no file system to walk."""

from __future__ import annotations

from typing import Any

import xxhash

from fastload.converters.sources.folders import _suffix, check_found, choose_layout
from fastload.converters.sources.items import Layout, SourceItem, SourceListing, bad_entry
from fastload.errors import SourceError, SourceNotFoundError
from fastload.format.layout import IMAGE_EXTENSIONS


def list_store_source(store: Any, *, layout: Layout = "auto", extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
                      on_error: str = "raise", max_file_size: int | None = None,
                      objects: list[tuple[str, int, str]] | None = None) -> SourceListing:
    """List the objects under ``store``'s folder in record order (the order a local pack of the same
    tree gives: depth first, names sorted at each level), with one listing request per 1,000 objects
    (none when ``objects`` gives its listing already)."""
    if layout == "list":
        raise SourceError(f"{store.url}: a CSV/JSONL file list is read from a local file; download it and "
                          "pass its path (the files it names may be URLs of a store only by their folder)")
    objects = sorted(store.list_objects() if objects is None else objects, key=lambda o: o[0].split("/"))
    if not objects:
        raise SourceNotFoundError(f"{store.url}: no objects under this prefix; check the URL (and the "
                                  "credentials' access to listing it), or upload the images first (for S3: "
                                  f"aws s3 sync ./images {store.url}/)")
    visible = [o for o in objects if not any(part.startswith(".") for part in o[0].split("/"))]
    subdirs = sorted({name.split("/", 1)[0] for name, _, _ in visible if "/" in name})
    top_files = [name for name, _, _ in visible if "/" not in name and name.lower().endswith(extensions)]
    layout = choose_layout(store.url, layout, subdirs, top_files)
    listing = SourceListing(root=store.url, layout=layout, items=[],  # type: ignore[arg-type]
                            classes=subdirs if layout == "imagefolder" else None)
    if len(objects) > len(visible):
        listing.ignored["(hidden)"] += len(objects) - len(visible)
    labels = {name: label for label, name in enumerate(subdirs)}
    for name, size, etag in visible:
        if layout == "imagefolder" and "/" not in name:
            listing.ignored["(file outside a class folder)" if name.lower().endswith(extensions)
                            else _suffix(name)] += 1
            continue
        if not name.lower().endswith(extensions):
            listing.ignored[_suffix(name)] += 1
            continue
        if max_file_size is not None and size > max_file_size:
            bad_entry(listing, on_error, store.display(name), name,  # type: ignore[arg-type]
                      f"{size} bytes is over --max-file-size {max_file_size}; raise the limit or remove it",
                      None)
            continue
        label = labels[name.split("/", 1)[0]] if layout == "imagefolder" else -1
        # The ETag stands in for a file's mtime in the shard plan: a changed object redoes its shard.
        version = xxhash.xxh3_64_intdigest(etag.encode()) & (2**62 - 1)
        listing.items.append(SourceItem(store.display(name), name, label, size, version))  # type: ignore[arg-type]
    check_found(store.url, listing, extensions, "objects")
    return listing
