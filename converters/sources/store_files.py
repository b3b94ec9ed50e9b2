"""WebDataset tars and Parquet tables in an object store as a source: which objects a URL names, each
read as a seekable file over ranged GETs, and tar members fetched in flight at pack time.

A URL names one object (``s3://bucket/table.parquet``), a brace list of them
(``s3://bucket/shards/data-{000000..000099}.tar``) or a prefix holding them (``s3://bucket/shards/``:
its ``.tar`` or table objects (``.parquet``, ``.arrow``, ``.feather``), not those under deeper
prefixes; a ``save_to_disk`` folder's data files in the order its ``state.json`` lists them).

Parquet: pyarrow reads the footer and then one row group's columns at a time through ``StoreFile``,
each read a ranged GET of exactly those bytes: no object is downloaded whole. Arrow IPC files and
streams hold their row counts in each batch's own message, so their batches are fetched (in
``TAR_BLOCK`` GETs) once to list the rows and again to pack them, one batch in memory at a time.

Tars: a member's offset is known only by walking the headers between members, and one GET per
header would cost a round trip per member. So listing streams each tar once, in ``TAR_BLOCK`` GETs
(tars walked ``TAR_WALKS`` at a time), keeping each member's offset and reading its small text
members (``.cls``, ``.txt``, ``.json``) from the same blocks; the pack then fetches the images and
file fields at those offsets, neighbours coalesced into GETs of up to 16 MB, many in flight. This
moves each tar's bytes twice (once to list, once to pack) but needs no disk, and a resumed pack
fetches only its unfinished shards' members. Staging each tar to a local file instead would move
them once, but the listing must see every sample (field types, labels, keys repeated across tars)
before the first shard is written, so it would hold the whole source on disk or fetch it twice too.

An object's ETag stands in for a file's mtime in the shard plan: a changed object redoes its shards.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import xxhash
from fastload.converters.packing.readahead import fetch_in_order
from fastload.converters.sources.folders import _suffix
from fastload.converters.sources.items import SourceItem, SourceListing
from fastload.converters.sources.table_files import (
    HF_DICT,
    HF_STATE,
    MAX_STATE_BYTES,
    TABLE_SUFFIXES,
    IpcTable,
    ParquetTable,
    saved_data_files,
)
from fastload.converters.sources.tars import TAR_SUFFIX, expand_braces

from fastload.errors import SourceError, SourceNotFoundError
from fastload.format.layout import IMAGE_EXTENSIONS
from fastload.storage.remote import RemoteStore

TAR_BLOCK = 8 * 2**20  # one GET of a tar walk: a round trip costs as much as ~0.5 MB, so 8 MB wastes ~6%
TAR_WALKS = 8  # tars listed at once: their GETs overlap each other's parsing and round trips
_STATS_IN_FLIGHT = 16
Object = tuple[str, int, str]  # (name under its folder, size, ETag), as RemoteStore.list_objects gives


class StoreFile(io.RawIOBase):
    """``name`` in ``store`` as a read-only, seekable file: each read a ranged GET (retried; a failure
    names the object and byte range) of the bytes asked for, or of ``block`` bytes from there when
    that is more, kept for the reads that follow (a walk from start to end then costs a GET per block)."""

    def __init__(self, store: RemoteStore, name: str, size: int, block: int = 0) -> None:
        super().__init__()
        self.store, self.name, self.size, self.block = store, name, size, block
        self.pos, self.kept, self.kept_at = 0, b"", 0
        self.gets = 0  # GETs made so far (what the tests count)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = max(0, offset + (0, self.pos, self.size)[whence])
        return self.pos

    def read(self, n: int | None = -1) -> bytes:
        start, end = self.pos, self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= start:
            return b""
        if not (self.kept_at <= start and end <= self.kept_at + len(self.kept)):
            body = self.store.read_ranges([(self.name, start, min(self.size, max(end, start + self.block)) - start)])[0]
            self.gets += 1
            if not self.block:
                self.pos = end
                return body
            self.kept, self.kept_at = body, start
        self.pos = end
        return self.kept[start - self.kept_at:end - self.kept_at]

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


class StoreMembers:
    """Tar members read from their objects at pack time: ranges of one tar side by side fetched as
    one GET, batches in flight (converters.packing.readahead.fetch_in_order). An item's path is its
    tar's URL under ``store``'s folder."""

    def __init__(self, store: RemoteStore) -> None:
        self.store = store

    def _name(self, url: object) -> str:
        return str(url)[len(self.store.url) + 1:]

    def read(self, path: Path, offset: int, size: int) -> bytes:
        return self.store.read_ranges([(self._name(path), offset, size)])[0]

    def contents(self, items: Sequence[SourceItem]) -> Iterator[bytes | OSError]:
        """Each item's payload, then its files', in order (an OSError in a refused one's place)."""
        ranges = [(self._name(w.path), w.offset, w.size) for item in items for w in (item, *item.files)]
        yield from fetch_in_order(self.store, ranges, batch_count=1024)

    def close(self) -> None:
        pass


def store_source(store: RemoteStore, layout: str) -> tuple[str, RemoteStore, list[Object], Counter[str]]:
    """What the URL of ``store`` names: ``("tars" | "tables", folder, objects, others)`` (objects named
    under that folder's store, in order; the prefix's other objects counted by suffix), or
    ``("objects", store, its listing, {})`` for a prefix of files."""
    last = store.url.rsplit("/", 1)[-1].lower()
    if "{" in store.url or last.endswith((TAR_SUFFIX, *TABLE_SUFFIXES)):
        return _named_objects(store)
    objects = store.list_objects()
    top = [o for o in objects if "/" not in o[0] and not o[0].startswith(".")]
    nested = any("/" in name and not name.startswith(".") for name, _, _ in objects)
    tars = [o for o in top if o[0].lower().endswith(TAR_SUFFIX)]
    tables = _saved_dataset(store, top) or [o for o in top if o[0].lower().endswith(TABLE_SUFFIXES)]
    images = nested or any(name.lower().endswith(IMAGE_EXTENSIONS) for name, _, _ in top)
    for kind, chosen, form in (("tars", tars, "webdataset"), ("tables", tables, "table")):
        if layout == form or (layout == "auto" and chosen and not images):
            picked = {name for name, _, _ in chosen}
            others = Counter("(hidden)" if name.startswith(".") else _suffix(name)
                             for name, _, _ in objects if name not in picked)
            return kind, store, chosen, others
    return "objects", store, objects, Counter()


def _named_objects(store: RemoteStore) -> tuple[str, RemoteStore, list[Object], Counter[str]]:
    brace = store.url.find("{")
    base = store.url[:store.url.rfind("/", 0, brace if brace >= 0 else len(store.url))]
    urls = expand_braces(store.url)
    kind = "tars" if urls[0].lower().endswith(TAR_SUFFIX) else "tables"
    if not all(u.lower().endswith(TABLE_SUFFIXES if kind == "tables" else (TAR_SUFFIX,)) for u in urls):
        raise SourceError(f"{store.url}: names neither .tar objects only nor tables only "
                          f"({', '.join(TABLE_SUFFIXES)}); name one kind at a time")
    folder = RemoteStore(base, store.options, retry=store.retry, max_in_flight=store.max_in_flight)
    names = [u[len(base) + 1:] for u in urls]

    def stat(name: str) -> tuple[str, int, str] | None:
        try:
            found = folder.stat(name)
        except FileNotFoundError:
            return None
        return name, found.size, found.etag
    with ThreadPoolExecutor(min(_STATS_IN_FLIGHT, len(names))) as pool:
        objects = list(pool.map(stat, names))
    missing = [name for name, found in zip(names, objects) if found is None]
    if missing:
        raise SourceNotFoundError(f"{folder.display(missing[0])}: no such object ({len(missing)} of the "
                                  f"{len(names)} that {store.url} names are missing); check the URL, or "
                                  "upload them first")
    return kind, folder, objects, Counter()  # type: ignore[return-value]


def _saved_dataset(store: RemoteStore, top: list[Object]) -> list[Object] | None:
    """A ``save_to_disk`` folder in the store: its data files in the order its state.json lists
    them (as a local one is read), or None when the prefix holds no state.json."""
    names = {name: (name, size, etag) for name, size, etag in top}
    if HF_DICT in names:
        raise SourceError(f"{store.url}: a Hugging Face DatasetDict; pack one split at a time: "
                          f"{store.url.rstrip('/')}/train (or the split you want)")
    if HF_STATE not in names:
        return None
    if names[HF_STATE][1] > MAX_STATE_BYTES:
        raise SourceError(f"{store.display(HF_STATE)}: holds {names[HF_STATE][1]} bytes, over the {MAX_STATE_BYTES} "
                          "a save_to_disk state file may hold (not read); save the dataset again with save_to_disk")
    files = saved_data_files(store.read_ranges([(HF_STATE, 0, names[HF_STATE][1])])[0], store.display(HF_STATE))
    missing = [f for f in files if f not in names]
    if missing:
        raise SourceNotFoundError(f"{store.display(missing[0])}: no such object, though {HF_STATE} lists it")
    return [names[f] for f in files]


def _version(etag: str) -> int:
    return xxhash.xxh3_64_intdigest(etag.encode()) & (2**62 - 1)


def list_store_tars(url: str, folder: RemoteStore, objects: list[Object], *, on_error: str,
                    max_file_size: int | None, extensions: tuple[str, ...] = IMAGE_EXTENSIONS, layout: str = "auto",
                    names: dict[str, str] | None = None) -> SourceListing:
    """Every sample of the tars ``objects`` of ``folder`` (see the module's docstring)."""
    from fastload.converters.sources.tar_walks import TarObject
    from fastload.converters.sources.webdataset import list_tar_objects

    if not objects:
        raise SourceNotFoundError(f"{url}: no .tar objects under this prefix; check the URL (and the "
                                  "credentials' access to listing it), or upload the tars first")
    tars = [TarObject(folder.display(name), name, size, _version(etag), (-1, -1),
                      lambda name=name, size=size: StoreFile(folder, name, size, TAR_BLOCK))
            for name, size, etag in objects]
    return list_tar_objects(url, folder.url, tars, StoreMembers(folder), on_error=on_error,
                            max_file_size=max_file_size, extensions=extensions, layout=layout, names=names,
                            walks=TAR_WALKS)


def list_store_tables(url: str, folder: RemoteStore, objects: list[Object], *,
                      max_file_size: int | None, **table: Any) -> SourceListing:
    """Every row of the table ``objects`` of ``folder`` (Parquet, Arrow IPC / Feather, a save_to_disk
    folder's data files), read through ranged GETs."""
    from fastload.converters.sources.tables import list_opened_tables

    if not objects:
        raise SourceNotFoundError(f"{url}: no {', '.join(TABLE_SUFFIXES)} objects under this prefix; check the "
                                  "URL (and the credentials' access to listing it), or upload the tables first")
    tables = [ParquetTable(folder.display(name), name, StoreFile(folder, name, size), _version(etag))  # type: ignore[arg-type]
              if name.lower().endswith(".parquet") else
              IpcTable(folder.display(name), name,  # type: ignore[arg-type]
                       lambda name=name, size=size: StoreFile(folder, name, size, TAR_BLOCK), _version(etag))
              for name, size, etag in objects]
    return list_opened_tables(folder.url, tables, max_file_size=max_file_size, **table)
