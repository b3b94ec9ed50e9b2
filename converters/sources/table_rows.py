"""Tables as a source, at pack time: each row's image read, a batch (row group, record batch or
chunk) at a time, the next one found on a thread while this one's rows are packed. A local Parquet
file's images are read where they lie in it, one ``pread`` each as a folder's files are read (see
converters.sources.table_pages: through pyarrow, each image was copied twice more, and the row
group decoded, which put Parquet at 0.44x the folder's pack rate); any other batch through pyarrow.
"""

from __future__ import annotations

import errno
import itertools
import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from fastload.converters.sources.items import SourceItem
from fastload.converters.sources.table_files import TableFile, is_unreachable
from fastload.converters.sources.table_pages import Unsupported


class TableRows:
    """Reads each row's image in place: one batch of one table at a time, the image column alone;
    a local Parquet file's images read where they lie in it, as a folder's files are read (see
    converters.sources.table_pages), any other batch through pyarrow."""

    def __init__(self, tables: dict[Path, TableFile], column: str, max_file_size: int | None) -> None:
        self.tables, self.column, self.limit = tables, column, max_file_size
        self.key: tuple[Path, int] | None = None
        self.cells: Any = None  # the batch's image column, its _Spans, or the OSError reading it raised
        self.start = 0

    def read(self, path: Path, offset: int, size: int) -> bytes:
        cell = self._cell(self.tables[path], offset)
        if isinstance(cell, OSError):
            raise cell
        return cell

    def contents(self, items: Sequence[SourceItem]) -> Iterator[bytes | OSError]:
        """Each item's image bytes, in order (an OSError in the place of one that cannot be read);
        the next batch is found (or read, through pyarrow) on a thread while this one's rows are
        packed."""
        needed = [(item.path, self.tables[item.path].batch_of(item.offset)) for item in items]
        batches = iter([key for n, key in enumerate(needed) if n == 0 or needed[n - 1] != key])
        files: dict[Path, int] = {}  # the tables read in place, opened on the thread; closed here
        try:
            with ThreadPoolExecutor(1, thread_name_prefix="fastload-table-read") as pool:
                ahead: deque[Future[Any]] = deque(pool.submit(self._batch, *k, files)
                                                  for k in itertools.islice(batches, 2))
                try:
                    for item, key in zip(items, needed):
                        if self.key != key:
                            self.key, self.cells = key, ahead.popleft().result()
                            self.start = int(self.tables[key[0]].starts[key[1]])
                            ahead.extend(pool.submit(self._batch, *k, files) for k in itertools.islice(batches, 1))
                        yield self._value(item.offset)
                finally:
                    for future in ahead:
                        future.cancel()
                    self.key = self.cells = None
        finally:
            for fd in files.values():
                os.close(fd)

    def _batch(self, path: Path, k: int, files: dict[Path, int] | None = None) -> Any:
        """Batch ``k``'s images where they lie (_Spans), its image column, or the OSError reading
        it raised (an unreachable store raises)."""
        table = self.tables[path]
        try:
            if files is not None and getattr(table, "in_place", False):
                spans = self._spans(table, k, files)
                if spans is not None:
                    return spans
            return table.read(k, [self.column]).column(0)
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            if is_unreachable(exc):
                raise
            return OSError(errno.EIO, f"its batch {k} of {table.name} cannot be read ({exc})")

    def _spans(self, table: TableFile, k: int, files: dict[Path, int]) -> _Spans | None:
        """Where batch ``k``'s images lie in its file; None where pyarrow is to read it (a compressed
        chunk, an encoding the page walk does not know, a file that would not open here)."""
        if table.path not in files:
            try:
                files[table.path] = os.open(table.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None  # pyarrow, reading it, names what is wrong
        fd = files[table.path]
        try:
            starts, lengths = table.image_spans(k, self.column, fd)
        except Unsupported:
            return None
        present = starts >= 0
        if present.any():  # from a cold cache, the disk reads the batch while the rows before it are packed
            first, end = int(starts[present].min()), int((starts + lengths)[present].max())
            try:
                os.posix_fadvise(fd, first, end - first, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass  # a file system without fadvise reads on demand
        return _Spans(table, k, fd, starts, lengths)

    def _cell(self, table: TableFile, row: int) -> bytes | OSError:
        k = table.batch_of(row)
        if self.key != (table.path, k):
            self.key, self.start, self.cells = (table.path, k), int(table.starts[k]), self._batch(table.path, k)
        return self._value(row)

    def _value(self, row: int) -> bytes | OSError:
        if isinstance(self.cells, OSError):
            return self.cells
        if isinstance(self.cells, _Spans):
            return self._value_in_place(self.cells, row - self.start)
        value = self.cells[row - self.start].as_py()
        where = None
        if isinstance(value, dict):  # an HF Image: {"bytes": ..., "path": ...}
            value, where = value.get("bytes"), value.get("path")
        if value is None:
            return self._no_image(where)
        if self.limit is not None and len(value) > self.limit:
            return self._too_large(len(value))
        return value

    def _value_in_place(self, spans: _Spans, i: int) -> bytes | OSError:
        start, size = int(spans.starts[i]), int(spans.lengths[i])
        if start < 0:  # an HF Image's path, if it has one, is named (read through pyarrow: a rare row)
            value = spans.table.read(spans.batch, [self.column]).column(0)[i].as_py()
            return self._no_image(value.get("path") if isinstance(value, dict) else None)
        if self.limit is not None and size > self.limit:
            return self._too_large(size)
        try:
            data = os.pread(spans.fd, size, start)
        except OSError as exc:
            return OSError(exc.errno, f"its image cannot be read from {spans.table.name} ({exc.strerror})")
        if len(data) != size:
            return OSError(errno.EIO, f"its image runs past the end of {spans.table.name} (at byte "
                                      f"{start + len(data)}, of {start + size}): the file was cut short")
        return data

    def _no_image(self, where: str | None) -> OSError:
        also = f" (its path {where!r} is not read: store the bytes in the table)" if where else ""
        return OSError(errno.ENODATA, f"no image: column {self.column!r} is null in this row{also}")

    def _too_large(self, size: int) -> OSError:
        return OSError(errno.EFBIG, f"its image holds {size} bytes, over --max-file-size {self.limit}")


@dataclass
class _Spans:
    """A batch of a local Parquet file read in place: each row's image's start (-1: null) and length."""

    table: TableFile
    batch: int
    fd: int
    starts: np.ndarray
    lengths: np.ndarray
