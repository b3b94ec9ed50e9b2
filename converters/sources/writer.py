"""Python writer: samples written from code (``fastload.Writer``) into shards behind the caller, then
the index and the manifest by the same finalize as a pack.

Output rules as ``pack``'s (converters.destination.out_dir): OUT is new, an unfinished pack (its
working files are cleared: a writer does not resume) or, with ``overwrite``, a finished dataset,
replaced only once the new one is complete. Until ``close`` writes the manifest, OUT holds no
dataset: a writer that raises inside its ``with`` block, or is killed, leaves none, and an
overwritten dataset stays as it was. To a store URL the dataset is written in a local staging
folder, then uploaded as a pack's is (converters.destination.upload).
"""

from __future__ import annotations

import json
import os
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, Self

import xxhash
from fastload.converters.destination.append import mask_storage_of, writer_schema
from fastload.converters.destination.written import WrittenOut
from fastload.converters.finalize import finalize
from fastload.converters.packing.options import on_error_spelling
from fastload.converters.packing.plan import stored_values
from fastload.converters.packing.report import PackReport, write_error
from fastload.converters.sources.image_arrays import ImageLayout, check_layout
from fastload.converters.sources.items import Skip, SourceItem, SourceListing
from fastload.converters.sources.sample_payloads import Payloads, held, to_payloads
from fastload.converters.sources.samples import KEY, BadSample, Checked, Schema
from fastload.converters.writers import WRITERS
from fastload.converters.writers.behind import WriteBehind, WriteFailed
from fastload.converters.writers.records import add_record, end_shard_record, new_shard_record

from fastload.config import MAX_FILE_SIZE, MAX_PIXELS, available_cpus, parse_size
from fastload.errors import PackError, SourceError
from fastload.format import FORMAT_VERSION, PACK_STATE_DIR, StorageKind, shard_name
from fastload.format.files import create_new
from fastload.format.layout import MASK_STORAGES, stored_file_types
from fastload.storage.location import is_remote, local_path
from fastload.storage.remote import RemoteStore


class Writer:
    """Write samples from Python into a fastload dataset (docs/python-api.md: what each value becomes).

    Args:
        out: The dataset folder to create, or a store URL (``s3://bucket/train.fl``).
        format: Shard storage, ``"lmdb"`` (the default) or ``"hdf5"``; an append's is the dataset's.
        shard_size: Bytes per shard (``"256MB"``); a shard is cut before the record that would pass it.
        overwrite: Replace a finished dataset at ``out``, once the new one is complete.
        append: Add the samples to the finished dataset at ``out`` as its next version (its fields,
            classes and storage by default; see converters.destination.append).
        fields: Every field's type (``{"caption": "str", "boxes": "float64[*,4]", "seg": "mask"}``);
            default: typed from the first sample.
        classes: Class names: a label may then be given as a name.
        quality: Encode PIL images and arrays given as the image as JPEG at this quality; default
            PNG (lossless). Encoded bytes and paths are stored as given, whatever this is.
        on_error: ``"raise"``: a bad sample raises SourceError naming it and its field; ``"skip"``:
            it is left out, counted and listed in the report (``skipped.jsonl``).
        check: ``"header"`` checks each image's structure; ``"decode"`` decodes every pixel too.
        workers: Threads that encode and check samples (default: the CPUs, at most 8).
        mask_storage: ``"rows"`` (the default): a mask field is stored as its values' rows (type
            "mask-rows": a crop decodes its own rows alone); ``"file"``: as a one-channel PNG (type
            "mask"). An append stores masks as the dataset does.
        layout: How image arrays and tensors hold their channels, ``"CHW"`` (first, as the loader
            yields) or ``"HWC"`` (last, as PIL and NumPy give); default None: told by the shape,
            and an array whose shape cannot tell (3×50×3: both ends 1, 3 or 4) is refused
            (converters.sources.image_arrays).
    """

    def __init__(self, out: str | os.PathLike[str], *, format: StorageKind | None = None, shard_size: str | int = "256MB",
                 overwrite: bool = False, append: bool = False, fields: Mapping[str, str] | None = None, classes: list[str] | None = None,
                 quality: int | None = None, on_error: Literal["raise", "skip"] = "raise",
                 check: Literal["header", "decode"] = "header", workers: int | None = None,
                 max_pixels: int = MAX_PIXELS, max_file_size: str | int = MAX_FILE_SIZE,
                 storage_options: dict[str, Any] | None = None, staging: str | os.PathLike[str] | None = None,
                 mask_storage: Literal["rows", "file"] | None = None, layout: ImageLayout | None = None) -> None:
        if format is not None and format not in WRITERS:
            raise ValueError(f"format={format!r}: choose one of {', '.join(WRITERS)}")
        on_error = on_error_spelling(on_error)  # type: ignore[assignment]
        if check not in ("header", "decode"):
            raise ValueError(f"check={check!r}: choose 'header' or 'decode'")
        if quality is not None and not 1 <= quality <= 100:
            raise ValueError(f"quality={quality}: must be between 1 and 100 (or None: PNG, lossless)")
        if mask_storage not in (*MASK_STORAGES, None):
            raise ValueError(f"mask_storage={mask_storage!r}: choose 'rows' (a crop decodes its rows alone) or 'file'")
        self.mask_storage, self.layout = mask_storage or "rows", check_layout(layout)
        self.started = time.perf_counter()
        self.storage, self.quality, self.on_error, self.overwrite = format or "lmdb", quality, on_error, overwrite
        self.decode, self.max_pixels = check == "decode", max_pixels
        self.shard_size = parse_size(shard_size, name="shard_size")
        self.max_file_size = parse_size(max_file_size, name="max_file_size")
        self.schema = Schema(fields, classes)
        self.store = RemoteStore(str(out), storage_options) if is_remote(out) else None
        self.out = Path(os.path.realpath(local_path(out))) if self.store is None else None
        self.report: PackReport | None = None
        self.written = WrittenOut(self.out, self.store, overwrite, staging, append)
        self.folder, base = self.written.folder, self.written.base
        if base is not None:  # the dataset's storage, fields and classes; shards numbered after its
            try:
                self.storage, self.schema = writer_schema(base, format, fields, classes)
                self.mask_storage = mask_storage_of(base.manifest, mask_storage)
            except BaseException:
                self.written.give_up()
                raise
        self.first_shard = base.first_shard if base is not None else 0
        self.items: list[SourceItem] = []
        self.values: dict[str, list[Any]] = {}
        self.skipped: list[Skip] = []
        self.records: list[dict[str, Any]] = []
        self.keys: set[str] = set()
        self.encoded = self.count = self.filled = 0
        self.behind = WriteBehind()
        self.workers = workers or min(8, available_cpus())
        self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="fastload-writer")
        self.pending: deque[tuple[Checked, Future[Payloads]]] = deque()
        self.open = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if kind is None:
            self.close()
        elif self.open:
            self.abort()

    def write(self, sample: Mapping[str, Any]) -> None:
        """Add one sample (see the class docstring); it is encoded and written behind the caller."""
        if not self.open:
            raise PackError("this Writer is closed; open a new one to write more samples")
        number, self.count = self.count, self.count + 1
        try:
            checked = self.schema.check(sample, number)
            if checked.key in self.keys:
                raise BadSample(f"{KEY} {checked.key!r} was given to an earlier sample; keys name one sample each")
            held(checked, self.file_types, self.layout, max_pixels=self.max_pixels, max_file_size=self.max_file_size)
        except BadSample as exc:
            key = sample.get(KEY, f"{number:08d}") if isinstance(sample, Mapping) else f"{number:08d}"
            return self._bad(number, str(key), exc.reason)
        self.keys.add(checked.key)
        self.pending.append((checked, self.pool.submit(  # its arrays held: copied as HWC
            to_payloads, checked, self.file_types, self.quality, decode=self.decode,
            max_pixels=self.max_pixels, max_file_size=self.max_file_size, layout="HWC")))
        while len(self.pending) > 4 * self.workers:
            self._commit(*self.pending.popleft())

    @property
    def file_types(self) -> dict[str, str]:
        """Each file field's type as stored: a mask as rows unless ``mask_storage="file"``."""
        return stored_file_types(self.schema.file_types, self.mask_storage)

    def _bad(self, number: int, key: str, reason: str) -> None:
        if self.on_error != "skip":
            raise SourceError(f"sample {number} (key {key!r}): {reason}; fix the sample, or pass on_error='skip'")
        self.skipped.append(Skip(key, reason))

    def _commit(self, checked: Checked, future: Future[Payloads]) -> None:
        """Hand one sample's payloads to the shard writer thread, in the order they were written."""
        try:
            got = future.result()
        except BadSample as exc:
            self.keys.discard(checked.key)
            return self._bad(checked.number, checked.key, exc.reason)
        size = len(got.data) + sum(len(f[0]) for f in got.files)
        if self.records and "entries" not in self.records[-1] and self.filled + size > self.shard_size:
            self._end_shard()
        if not self.records or "entries" in self.records[-1]:
            self._start_shard()
        add_record(self.records[-1], self.behind, len(self.items), got.data, got.checksum, got.width, got.height,
                   got.files, self.schema.file_types)
        self.filled += size
        self.encoded += got.encoded
        self.items.append(SourceItem(Path(checked.key), checked.key, checked.label, size, 0))
        for name, value in checked.values.items():
            self.values.setdefault(name, []).append(value)

    def _start_shard(self) -> None:
        name = shard_name(self.storage, self.first_shard + len(self.records))
        final, tmp = self.folder / name, self.folder / PACK_STATE_DIR / (name + ".tmp")
        record = new_shard_record(name, self.schema.file_types)
        self.records.append(record)
        self.filled = 0

        def done(file_bytes: int, data_offset: int) -> None:
            record["bytes"], record["data_offset"] = file_bytes, data_offset
            os.replace(tmp, final)

        def make() -> Any:
            os.close(create_new(tmp))
            return WRITERS[self.storage](tmp, self.shard_size)

        self.behind.start_shard(name, make, done, lambda: tmp.unlink(missing_ok=True))

    def _end_shard(self) -> None:
        end_shard_record(self.records[-1], self.behind)

    def close(self) -> PackReport:
        """Write what is pending, then the index and the manifest (last); returns the report."""
        if not self.open:
            raise PackError("this Writer is closed already")
        try:
            while self.pending:
                self._commit(*self.pending.popleft())
            if not self.items:
                first = f" (first: {self.skipped[0].rel}: {self.skipped[0].reason})" if self.skipped else ""
                raise PackError(f"{self.written.where}: no sample was written, {len(self.skipped)} "
                                f"skipped{first}; a dataset needs at least one")
            self._end_shard()
            self.behind.close()
            report = self._finish()
        except WriteFailed as failed:
            self.abort()
            raise PackError(write_error(self.folder, failed.shard, failed.cause)) from None
        except BaseException:
            self.abort()
            raise
        self.open = False
        self.pool.shutdown()
        report.elapsed_s = time.perf_counter() - self.started
        self.report = report
        return report

    def _finish(self) -> PackReport:
        listing = SourceListing(root=Path("fastload.Writer"), layout="writer", items=self.items,
                                classes=self.schema.classes, fields=self.schema.index_types,
                                field_values=self.values, file_fields=self.file_types,
                                skipped=self.skipped, images=True)
        # "already packed" (an upload over the same dataset) means every stored value is the same:
        # the keys, labels, class names and field values, not the payloads' checksums alone
        digest = xxhash.xxh3_128(json.dumps([FORMAT_VERSION, self.storage, self.schema.types,
                                             self.schema.classes]).encode())
        values = stored_values(self.schema.index_types, self.values, len(self.items))
        for k, item in enumerate(self.items):
            digest.update(f"\n{item.rel}\0{item.label}".encode() + (values[k] if values is not None else b""))
        for record in self.records:
            digest.update(b"".join(c.to_bytes(8, "little") for c in record["checksums"]))
        encoder = {"format": "JPEG", "quality": self.quality} if self.quality else {"format": "PNG", "lossless": True}
        options = {"reencode": None, "check": "decode" if self.decode else "header", "shard_size": self.shard_size,
                   "restart_markers": False}
        try:
            report = finalize(self.folder, self.storage, listing, self.records, options, (), digest.hexdigest(),
                              extra={"encoded": {**encoder, "images": self.encoded}}, base=self.written.base)
        except OSError as exc:
            raise PackError(write_error(self.folder, "the index and manifest", exc)) from None
        return self.written.publish(report, digest.hexdigest())

    def abort(self) -> None:
        """Stop without a dataset: the shards written so far are deleted; an overwritten dataset stays."""
        self.open = False
        self.behind.cancel(finish_queued=False)
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.written.give_up()
