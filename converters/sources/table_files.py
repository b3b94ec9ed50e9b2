"""Tables as a source, the files: which Parquet / Arrow IPC / Feather files SRC names, and each one
read a row group (Parquet) or record batch (IPC) at a time, only the columns asked for.

An in-memory table (a ``datasets.Dataset``'s, or a ``pyarrow.Table``) is read the same way, a
chunk at a time. Only the image column is read at pack time; the others once, when listing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from fastload.converters.sources.confine import where_outside
from fastload.converters.sources.json_text import BadJson, parse_json
from fastload.converters.sources.table_pages import Unsupported, image_spans

from fastload.errors import SourceError, SourceNotFoundError
from fastload.format.files import read_regular
from fastload.format.layout import IMAGE_EXTENSIONS
from fastload.optional import require

TABLE_SUFFIXES = (".parquet", ".arrow", ".feather")
HF_STATE, HF_DICT = "state.json", "dataset_dict.json"  # what save_to_disk writes beside the data files
_MEMORY_BATCH_ROWS = 8192  # an in-memory table's rows per batch: zero-copy slices, any size would do
MAX_STATE_BYTES = 2**24
"""Largest state.json read: save_to_disk writes a few KB (an entry per data file, and the features)."""
_SAVE_AGAIN = "save the dataset again with save_to_disk"


def arrow() -> Any:
    return require("pyarrow", "packing Parquet or Arrow tables")


def is_table_source(src: Path) -> bool:
    """Whether ``src`` names tables: a table file, a save_to_disk folder, or a folder that holds
    table files and no images."""
    if src.is_file():
        return src.suffix.lower() in TABLE_SUFFIXES
    if not src.is_dir():
        return False
    names = [e for e in os.scandir(src) if not e.name.startswith(".")]
    if any(e.name in (HF_STATE, HF_DICT) for e in names):
        return True
    return (any(e.name.lower().endswith(TABLE_SUFFIXES) for e in names)
            and not any(e.name.lower().endswith(IMAGE_EXTENSIONS) for e in names))


def table_paths(src: Path) -> tuple[Path, list[Path]]:
    """The listing's root and its table files, in record order: a save_to_disk folder's in the order
    its state.json gives, a folder's sorted by name."""
    if src.is_file():
        return src.parent, [src]
    if (src / HF_DICT).is_file():
        splits = sorted(p.name for p in src.iterdir() if p.is_dir() and (p / HF_STATE).is_file())
        raise SourceError(f"{src}: a Hugging Face DatasetDict (splits: {', '.join(splits) or 'none'}); "
                          f"pack one split at a time: {src / (splits[0] if splits else 'train')}")
    if (src / HF_STATE).is_file():
        state = src / HF_STATE
        try:
            text = read_regular(state, MAX_STATE_BYTES)
        except OSError as exc:
            raise SourceError(f"{state}: not a save_to_disk state file ({exc.strerror or exc}); "
                              f"{_SAVE_AGAIN}") from None
        real = Path(os.path.realpath(src))
        paths = [src / name for name in saved_data_files(text, state)]
        for path in paths:  # a link among them is followed, and held to the folder as a list's paths are
            outside = where_outside(path, real, f"the data files its {HF_STATE} names must be; {_SAVE_AGAIN}")
            if outside is not None:
                raise SourceError(f"{state}: data file {path.name!r} {outside}")
        missing = [p for p in paths if not p.is_file()]
        if missing:
            raise SourceNotFoundError(f"{missing[0]}: no such file, though {HF_STATE} lists it")
        _refuse_the_same_file_twice(state, paths)
        return src, paths
    paths = sorted(p for p in src.iterdir() if p.name.lower().endswith(TABLE_SUFFIXES) and p.is_file())
    if not paths:
        raise SourceError(f"{src}: no {', '.join(TABLE_SUFFIXES)} files in this folder")
    return src, paths


def saved_data_files(state: bytes, where: object) -> list[str]:
    """The data files a ``save_to_disk`` folder's state.json (its bytes; ``where`` names it in an
    error) lists, in the order its rows are in: each a file name in that folder (save_to_disk
    writes ``data-00000-of-00001.arrow``), never a path that could lead out of it."""
    try:
        state_value = parse_json(state)
    except BadJson as exc:
        raise SourceError(f"{where}: not a save_to_disk state file (it is {exc}); {_SAVE_AGAIN}") from None
    files = state_value.get("_data_files") if isinstance(state_value, dict) else None
    if not isinstance(files, list) or not files:
        raise SourceError(f"{where}: not a save_to_disk state file (its _data_files is {_short(files)}, not a list "
                          f"of one or more data files); {_SAVE_AGAIN}")
    names = []
    for k, entry in enumerate(files):
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
            raise SourceError(f"{where}: _data_files[{k}] names {_short(name if isinstance(entry, dict) else entry)}, "
                              f"not a data file in its folder (a plain file name); {_SAVE_AGAIN}")
        if name in names:  # save_to_disk lists each file once: its rows would be packed twice
            raise SourceError(f"{where}: _data_files[{k}] names {name!r} again (as _data_files[{names.index(name)}] "
                              f"does), so its rows would be packed twice; {_SAVE_AGAIN}")
        names.append(name)
    return names


def _refuse_the_same_file_twice(state: Path, paths: list[Path]) -> None:
    """Two names of one data file (a link to another): its rows would be packed twice."""
    seen: dict[tuple[int, int], Path] = {}
    for path in paths:
        st = path.stat()
        first = seen.setdefault((st.st_dev, st.st_ino), path)
        if first is not path:
            raise SourceError(f"{state}: data files {first.name!r} and {path.name!r} are the same file (a link), so "
                              f"its rows would be packed twice; {_SAVE_AGAIN}")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class TableFile:
    """One table: its schema and its batches (row groups, record batches or chunks), each read on
    its own, only the columns asked for. ``name`` prefixes its rows' paths (``train.parquet/000123``)."""

    def __init__(self, path: Path, name: str, schema: Any, rows: list[int]) -> None:
        self.path, self.name, self.schema = path, name, schema
        self.starts = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)]).astype(np.int64)
        self.mtime_ns, self.stamp = 0, (-1, -1)
        if isinstance(path, Path) and path.is_file():  # a rewritten file redoes its shards (see converters.packing.plan)
            st = path.stat()
            self.mtime_ns, self.stamp = st.st_mtime_ns, (st.st_ctime_ns, st.st_ino)

    @property
    def num_rows(self) -> int:
        return int(self.starts[-1])

    def batch_of(self, row: int) -> int:
        return int(np.searchsorted(self.starts, row, side="right")) - 1

    def read(self, k: int, columns: list[str]) -> Any:
        """Batch ``k``'s ``columns`` as a pyarrow Table."""
        raise NotImplementedError

    def sizes(self, column: str) -> np.ndarray:
        """Each row's image bytes (int64): exact here, where reading the column costs nothing."""
        from fastload.converters.sources.table_columns import image_bytes, numbers

        pc = require("pyarrow.compute", "packing Parquet or Arrow tables")
        out = [np.zeros(0, np.int64)]
        for k in range(len(self.starts) - 1):
            sizes, null = numbers(pc.binary_length(image_bytes(self.read(k, [column]).column(0))))
            out.append(np.where(null, 0, sizes) if null is not None else sizes.astype(np.int64))
        return np.concatenate(out).astype(np.int64)

    def image_spans(self, k: int, column: str, fd: int) -> tuple[np.ndarray, np.ndarray]:
        """Where each row of batch ``k``'s image lies in the file open at ``fd``, and its length
        (start -1: null); Unsupported where the batch is read through pyarrow (see table_pages)."""
        raise Unsupported("not a local Parquet file")

    def read_all(self, columns: list[str]) -> Any:
        pa = arrow()
        if not columns:
            return pa.table({})
        return pa.concat_tables([self.read(k, columns) for k in range(len(self.starts) - 1)] or
                                [self.schema.empty_table().select(columns)])

    def close(self) -> None:
        pass


class ParquetTable(TableFile):
    """A Parquet file: row groups; a row's size estimated from its row group's metadata (the image
    column's uncompressed bytes over its rows), so listing reads no image. ``source``: a file object
    to read it through (an object of a store: converters.sources.store_files), ``version`` its ETag's
    hash, standing in for a file's mtime."""

    def __init__(self, path: Path, name: str, source: Any = None, version: int = 0) -> None:
        pq = require("pyarrow.parquet", "packing Parquet tables")
        try:
            self.file = pq.ParquetFile(path if source is None else source)
        except (OSError, ValueError) as exc:  # ArrowInvalid is a ValueError
            if is_unreachable(exc):
                raise
            raise SourceError(f"{path}: not a readable Parquet file ({exc}); re-write it, or leave it out") from None
        meta = self.file.metadata
        super().__init__(path, name, self.file.schema_arrow, [meta.row_group(k).num_rows for k in range(meta.num_row_groups)])
        if source is not None:
            self.mtime_ns = version
        self.in_place = source is None  # a local file: its images are read where they lie (table_pages)
        self.leaves: dict[str, tuple[int, int] | None] = {}  # image column -> (leaf, max definition level)

    def read(self, k: int, columns: list[str]) -> Any:
        return self.file.read_row_group(k, columns=columns)

    def image_spans(self, k: int, column: str, fd: int) -> tuple[np.ndarray, np.ndarray]:
        if column not in self.leaves:
            schema = self.file.schema  # a struct's image (HF's Image) is its "bytes" leaf
            found = [j for j in range(len(schema)) if schema.column(j).path in (column, f"{column}.bytes")
                     and schema.column(j).max_repetition_level == 0]
            self.leaves[column] = (found[0], schema.column(found[0]).max_definition_level) if found else None
        leaf = self.leaves[column]
        if leaf is None or not self.in_place:
            raise Unsupported("not a local Parquet file, or no image leaf")
        group = self.file.metadata.row_group(k)
        return image_spans(fd, group.column(leaf[0]), leaf[1], group.num_rows)

    def sizes(self, column: str) -> np.ndarray:
        meta, out = self.file.metadata, []
        for k in range(meta.num_row_groups):
            group = meta.row_group(k)
            total = sum(group.column(j).total_uncompressed_size for j in range(group.num_columns)
                        if group.column(j).path_in_schema in (column, f"{column}.bytes"))
            out.append(np.full(group.num_rows, max(1, total // max(1, group.num_rows)), dtype=np.int64))
        return np.concatenate(out or [np.zeros(0, np.int64)])

    def close(self) -> None:
        self.file.close()


class IpcTable(TableFile):
    """An Arrow IPC file (Feather v2) or stream (a save_to_disk ``data-*.arrow``), memory-mapped:
    a batch's columns are read in place (decompressed only when the file is compressed). A stream
    is read forwards; a batch before the last one read opens it again. ``source``: what opens the
    file afresh for each pass (an object of a store: converters.sources.store_files, whose batches
    are then fetched once to count their rows and again to pack them, one batch in memory at a
    time, as a store's tars are), ``version`` its ETag's hash, standing in for a file's mtime."""

    def __init__(self, path: Path, name: str, source: Callable[[], Any] | None = None, version: int = 0) -> None:
        pa, self.ipc = arrow(), require("pyarrow.ipc", "packing Arrow tables")
        self.open = source or (lambda: pa.memory_map(str(path)))
        self.stream: Iterator[Any] | None = None
        self.next_batch, self.columns = 0, list[str]()
        try:
            self.file = self.ipc.open_file(self.open())
            rows = [self.file.get_batch(k).num_rows for k in range(self.file.num_record_batches)]
            schema = self.file.schema
        except (OSError, ValueError) as exc:
            if is_unreachable(exc):
                raise
            self.file = None
            try:
                reader = self.ipc.open_stream(self.open())
                schema, rows = reader.schema, [batch.num_rows for batch in reader]
            except (OSError, ValueError) as exc:
                if is_unreachable(exc):
                    raise
                raise SourceError(f"{path}: neither an Arrow IPC file (Feather v2) nor an Arrow stream ({exc}); "
                                  "re-write it with pyarrow.feather.write_feather, or leave it out") from None
        super().__init__(path, name, schema, rows)
        if source is not None:
            self.mtime_ns = version

    def read(self, k: int, columns: list[str]) -> Any:
        pa = arrow()
        options = self.ipc.IpcReadOptions(included_fields=[self.schema.get_field_index(c) for c in columns])
        if self.file is not None:
            reader = self.ipc.open_file(self.open(), options=options)
            return pa.Table.from_batches([reader.get_batch(k)]).select(columns)
        if self.stream is None or k < self.next_batch or self.columns != columns:
            self.stream, self.next_batch, self.columns = iter(self.ipc.open_stream(
                self.open(), options=options)), 0, columns
        while True:  # earlier batches are passed over: in place, nothing is read but their headers
            batch, self.next_batch = next(self.stream), self.next_batch + 1
            if self.next_batch - 1 == k:
                return pa.Table.from_batches([batch]).select(columns)


class MemoryTable(TableFile):
    """A table in memory (a ``datasets.Dataset``'s Arrow table): zero-copy slices of it."""

    def __init__(self, table: Any, name: str, version: int) -> None:
        self.table = table
        n = table.num_rows
        rows = [min(_MEMORY_BATCH_ROWS, n - start) for start in range(0, n, _MEMORY_BATCH_ROWS)]
        super().__init__(Path(name), name, table.schema, rows)
        self.mtime_ns = version  # what a change to the data changes (its fingerprint; see tables.py)

    def read(self, k: int, columns: list[str]) -> Any:
        start = int(self.starts[k])
        return self.table.select(columns).slice(start, int(self.starts[k + 1]) - start)


def is_unreachable(exc: BaseException) -> bool:
    """A store that failed for good (retries ran out, credentials refused): it stops the pack, which
    resumes, rather than making every row after it a bad entry. A missing object is that row's."""
    from fastload.errors import RemoteNotFound, RemoteReadError

    return isinstance(exc, RemoteReadError) and not isinstance(exc, RemoteNotFound)


def open_table(path: Path, name: str) -> TableFile:
    return ParquetTable(path, name) if path.suffix.lower() == ".parquet" else IpcTable(path, name)
