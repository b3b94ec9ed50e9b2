"""Tables as a source: Parquet, Arrow IPC / Feather files, Hugging Face ``save_to_disk`` folders and
in-memory ``datasets.Dataset`` objects, one record per row, its image read in place at pack time.

The image column holds encoded bytes (binary, or a struct with a ``bytes`` field as HF's ``Image``
feature stores it); the label column whole numbers (kept), text (classes numbered by sorted name,
as ImageFolder does) or an HF ``ClassLabel`` (its names are the classes); a null label is -1. Every
other column (or those ``columns`` names) is a typed field (see converters.sources.table_columns).
A row's path is its file's name and its row, ``train.parquet/000123``; a dataset's row,
``dataset/000123``. Listing reads the other columns once, never an image; packing reads the images
a row group or record batch at a time (see converters.sources.table_rows), so memory is bounded by
one row group, whatever the table's size. A null image, or a row group that cannot be
read, is that row's bad entry (named, or skipped and reported with ``on_error="skip"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from fastload.converters.sources.items import SourceItem, SourceListing, check_field_names
from fastload.converters.sources.table_columns import (
    choose_image,
    choose_label,
    field_type,
    field_values,
    hf_features,
    raw_labels,
)
from fastload.converters.sources.table_files import (
    MemoryTable,
    TableFile,
    open_table,
    table_paths,
)
from fastload.converters.sources.table_rows import TableRows

from fastload.errors import SourceError
from fastload.optional import require


def is_dataset(src: object) -> bool:
    """Whether ``src`` is a Hugging Face ``datasets`` object (checked without importing datasets)."""
    return type(src).__module__.split(".")[0] == "datasets"


def list_tables(src: Path, *, max_file_size: int | None, image_column: str | None = None,
                label_column: str | None = None, columns: Sequence[str] | None = None) -> SourceListing:
    """Every row of the table files ``src`` names, in file and row order (see the module's docstring)."""
    root, paths = table_paths(src)
    tables = [open_table(path, path.relative_to(root).as_posix()) for path in paths]
    return _listing(root, tables, image_column, label_column, columns, max_file_size)


def list_opened_tables(root: object, tables: list[TableFile], *, max_file_size: int | None,
                       image_column: str | None = None, label_column: str | None = None,
                       columns: Sequence[str] | None = None) -> SourceListing:
    """Every row of ``tables``, opened already (a store's objects: converters.sources.store_files)."""
    return _listing(root, tables, image_column, label_column, columns, max_file_size)  # type: ignore[arg-type]


def list_dataset(src: Any, *, max_file_size: int | None, image_column: str | None = None,
                 label_column: str | None = None, columns: Sequence[str] | None = None) -> SourceListing:
    """Every row of an in-memory ``datasets.Dataset``, in its order (a ``select``/``shuffle`` included),
    read from its Arrow table: no row is turned into Python objects."""
    datasets = require("datasets", "packing a Hugging Face dataset")
    if isinstance(src, datasets.DatasetDict):
        raise SourceError(f"a DatasetDict (splits: {', '.join(src)}); pack one split at a time: "
                          f"ds[{next(iter(src), 'train')!r}]")
    if not isinstance(src, datasets.Dataset):
        raise SourceError(f"a {type(src).__name__}: only a map-style datasets.Dataset can be packed (an "
                          "IterableDataset has no rows to index); load it without streaming=True")
    # Its fingerprint changes with every change to its data: in the plan digest, it keeps a resume
    # from mixing the shards of two versions (a file source's mtime does the same).
    version = xxhash.xxh64_intdigest(str(src._fingerprint).encode()) & (2**63 - 1)
    indices = src._indices  # a select/shuffle/filter: rows of the table, in the dataset's order
    order = None if indices is None else indices.column(0).to_numpy().astype(np.int64)
    table = MemoryTable(src.data.table, "dataset", version)
    return _listing(Path(f"datasets.Dataset({src._fingerprint})"), [table], image_column, label_column,
                    columns, max_file_size, order)


def _listing(root: Path, tables: list[TableFile], image_column: str | None, label_column: str | None,
             columns: Sequence[str] | None, max_file_size: int | None,
             order: np.ndarray | None = None) -> SourceListing:
    first = tables[0]
    schema = first.schema.remove_metadata()
    twice = sorted({n for n in schema.names if schema.names.count(n) > 1})
    if twice:  # a column's name is how it is read, and a field's name
        raise SourceError(f"{first.path}: {len(twice)} name(s) given to more than one column ({', '.join(map(repr, twice))}); "
                          "rename the columns so each name is one column's")
    for table in tables[1:]:
        _check_same_columns(first, table)
    image = choose_image(first.path, schema, image_column)
    label = choose_label(first.path, schema, label_column)
    if label == image:
        raise SourceError(f"{first.path}: column {image!r} cannot be the image and the label; name another")
    keep = [n for n in schema.names if n not in (image, label)] if columns is None else list(columns)
    for name in keep:
        if name not in schema.names or name in (image, label):
            what = "is the image or label column" if name in schema.names else "is not a column"
            raise SourceError(f"{first.path}: --columns names {name!r}, which {what} (columns: "
                              f"{', '.join(schema.names)})")
    types = {name: field_type(first.path, name, schema.field(name).type) for name in keep}
    check_field_names(first.path, keep, "a column; choose the columns to keep with --columns")
    feature = hf_features(first.schema).get(label or "", {})
    names = feature.get("names") if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" else None
    listing = SourceListing(root=root, layout="table", items=[], classes=None, images=True,
                            reader=TableRows({t.path: t for t in tables}, image, max_file_size))
    per_table: list[tuple[TableFile, np.ndarray, np.ndarray, Any]] = []  # table, rows, sizes, raw labels
    values: dict[str, list[Any]] = {name: [] for name in keep}
    for table in tables:
        data = table.read_all([c for c in (label, *keep) if c is not None])
        rows, sizes = np.arange(table.num_rows, dtype=np.int64), table.sizes(image)
        if order is not None:
            data, rows, sizes = data.take(order), order, sizes[order]
        raw = raw_labels(table.path, label, data.column(label)) if label else np.full(len(rows), -1, np.int64)
        per_table.append((table, rows, sizes, raw))
        for name in keep:
            values[name].append(field_values(table.path, name, types[name], data.column(name)))
    listing.classes, labels = _labels(per_table, names)
    for (table, rows, sizes, _), numbers in zip(per_table, labels):
        listing.items += [SourceItem(table.path, f"{table.name}/{i:06d}", int(label), int(size), table.mtime_ns,
                                     stamp=table.stamp, offset=int(row))
                          for i, (row, size, label) in enumerate(zip(rows, sizes, numbers))]
    if not listing.items:
        raise SourceError(f"{root}: no rows in {len(tables)} table(s)")
    for name in keep:
        parts = values[name]
        listing.fields[name] = types[name]
        listing.field_values[name] = (list(np.concatenate(parts)) if isinstance(parts[0], np.ndarray)
                                      else [v for part in parts for v in part])
    return listing


def _check_same_columns(first: TableFile, other: TableFile) -> None:
    a, b = first.schema, other.schema
    for name in dict.fromkeys([*a.names, *b.names]):
        if name not in a.names or name not in b.names:
            where = first.name if name in a.names else other.name
            raise SourceError(f"{other.path}: column {name!r} is only in {where}; the tables of one source "
                              "share their columns: pack them apart")
        if a.field(name).type != b.field(name).type:
            raise SourceError(f"{other.path}: column {name!r} holds {b.field(name).type} here but "
                              f"{a.field(name).type} in {first.name}; the tables of one source share their columns")


def _labels(per_table: list[tuple[TableFile, np.ndarray, np.ndarray, Any]],
            names: list[str] | None) -> tuple[list[str] | None, list[np.ndarray]]:
    """The classes and each table's labels: text numbered by sorted name; a ClassLabel's ids checked."""
    raws = [raw for *_, raw in per_table]
    if raws and not isinstance(raws[0], list):  # whole numbers, null as -1: the index stores -1 and up
        for table, rows, _, raw in per_table:
            bad = np.flatnonzero(raw < -1)
            if len(bad):
                raise SourceError(f"{table.path}: row {rows[bad[0]]}: label {raw[bad[0]]} is out of the range a label "
                                  "is stored in (-1 for none, or a class id 0..2**63-1); fix the label column, or "
                                  "name another with --label-column")
    if raws and isinstance(raws[0], list):
        classes = sorted({v for raw in raws for v in raw if v is not None})
        number = {name: k for k, name in enumerate(classes)}
        return classes, [np.array([number.get(v, -1) for v in raw], dtype=np.int64) for raw in raws]
    if names is not None:
        for (table, *_), raw in zip(per_table, raws):
            bad = np.flatnonzero((raw < -1) | (raw >= len(names)))
            if len(bad):
                raise SourceError(f"{table.path}: row {bad[0]}: label {raw[bad[0]]} is not one of the "
                                  f"{len(names)} classes its ClassLabel names (0..{len(names) - 1}, or -1)")
        return list(names), raws
    return None, raws
