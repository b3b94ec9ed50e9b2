"""Samples: PackedDataset's read path, from a key to a sample or a batch (decode, transforms, skips)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch.utils.data

from fastload.config import available_cpus
from fastload.decode.files import FileDecode, decoder_for
from fastload.decode.images import decode_rgb
from fastload.decode.pipeline import ImagePipeline, ThreadDecoder, decode_batch
from fastload.errors import CorruptRecordError, SkippedRecordWarning
from fastload.samples.collate import ImageBatch, SkipCountedList, pixels_in
from fastload.sampling.epoch_sampler import SampleKey

if TYPE_CHECKING:
    from fastload.format import Manifest, RecordIndex
    from fastload.pixels import PixelCache
    from fastload.readers import ShardReader
    from fastload.samples.fields import SampleFields
    from fastload.samples.user_transforms import SampleTransform


class SampleReading:
    """How :class:`~fastload.dataset.PackedDataset` makes samples of its records: ``ds[key]``, and
    ``__getitems__`` for a batch (one read pass, one decode pass, damaged records skipped and counted).

    A base class of PackedDataset, which sets the attributes below and maps a sample's index to its
    record number (``_check``: a subset numbers its samples from 0).
    """

    reader: ShardReader
    index: RecordIndex
    manifest: Manifest
    pipeline: ImagePipeline | None
    pixel_cache: PixelCache | None
    transform: Callable[[Any], Any] | None
    target_transform: Callable[[int], Any] | None
    sample_transform: SampleTransform | None
    decode: FileDecode
    decode_threads: int | None
    max_pixels: int
    on_error: str
    skipped: int
    fields: tuple[str, ...] | None
    _fields: SampleFields | None
    _decoder: ThreadDecoder | None
    _warned_shards: set[int]
    _check: Callable[[int], int]

    def __getitem__(self, key: int | SampleKey) -> tuple[Any, Any]:
        """One sample; a damaged record raises CorruptRecordError whatever ``on_error`` says."""
        parsed = self._key(key)
        i = parsed[0]
        if self.pipeline is not None:
            batch = self._read_batch([parsed], None)
            image, label = batch[0]  # target_transform applied once
            if self.fields:
                return self._as_fields(i, image, label, batch.samples[0])  # type: ignore[attr-defined]
            return image, label
        return self._finish(i, self.payload(i, self.reader.read(i)))

    def __getitems__(self, keys: list[int | SampleKey]) -> list[Any]:
        """A whole batch: one read pass, one decode pass (threads), one preallocated tensor.

        torch's DataLoader calls this instead of ``__getitem__`` once per sample. With
        ``on_error="skip"``, damaged records are left out and the list says how many
        (``.skipped``), for the collate function to pass on to the loader's stats.
        """
        parsed = [self._key(k) for k in keys]
        if self.on_error == "raise":
            return self._read_batch(parsed, None)
        failed: dict[int, CorruptRecordError] = {}
        batch = self._read_batch(parsed, failed)
        skipped = len(parsed) - len(batch)  # not len(failed): a batch may hold a record twice
        self._count_skips(failed, skipped)
        if isinstance(batch, ImageBatch):
            batch.skipped = skipped
            return batch
        return SkipCountedList(batch, skipped, pixels_in(batch))

    def _key(self, key: int | SampleKey | tuple[int, int, int]) -> tuple[int, int, int]:
        """``(index, epoch, seed)``: from fastload's sampler as given (reproducible crops); for a
        plain index, the seed is drawn from torch's RNG, as torchvision's random transforms do."""
        if isinstance(key, tuple):
            index, epoch, seed = key
            return self._check(index), int(epoch), int(seed)
        seed = int(torch.randint(2**62, ())) if self.pipeline is not None and self.pipeline.train else 0
        return self._check(key), 0, seed

    def _read_batch(self, parsed: list[tuple[int, int, int]],
                    failed: dict[int, CorruptRecordError] | None) -> list[Any]:
        """Read, decode and transform records ``parsed``; with a ``failed`` dict, damaged records
        are left out and their errors put there (keyed by record index)."""
        if self.pipeline is not None:
            return self._decode_batch(self.pipeline, parsed, failed)
        indices = [p[0] for p in parsed]
        if failed is None:
            payloads = self.reader.read_many(indices)
        else:
            payloads = self._read_skipping(indices, failed)
            if failed:  # drop the unreadable records before decoding
                parsed = [p for p in parsed if p[0] not in failed]
                indices = [p[0] for p in parsed]
                payloads = [data for data in payloads if data is not None]
        reads = self._file_field_reads(indices)
        samples = []
        for i, data in zip(indices, payloads):
            try:
                image = self.payload(i, data)
                values = (self._fields.values(i, None, self.reader.where(i), reads)
                          if self._fields is not None else None)
            except CorruptRecordError as exc:  # the record's file, or one of its file fields
                if failed is None:
                    raise
                failed[i] = exc
                continue
            samples.append(self._finish(i, image, values))
        return samples

    def _decode_batch(self, pipeline: ImagePipeline, parsed: list[tuple[int, int, int]],
                      failed: dict[int, CorruptRecordError] | None) -> list[Any]:
        """:meth:`_read_batch` for the built-in image pipeline: each decode thread reads too."""
        indices = [p[0] for p in parsed]
        files = self._fields.files if self._fields is not None else ()
        pixels = None if self.pixel_cache is None else self.pixel_cache.batch(
            indices, self.index.width[indices], self.index.height[indices])
        # the records the pixel cache holds are cropped from it: their bytes are not read
        unread = indices if pixels is None else [i for i, held in zip(indices, pixels.cached()) if not held]
        if len(indices) > 1:  # the whole batch's reads in flight, not one per thread
            self.reader.will_read(unread)
            for field in files:
                self.reader.will_read(indices, field)
        undecoded: dict[int, CorruptRecordError] | None = None if failed is None else {}
        read = self.reader.prefetched(unread)  # a remote batch is fetched here, all at once
        values, slots = None, None
        if self._fields is not None:
            sample_fields, reads = self._fields, self._file_field_reads(indices)
            slots = sample_fields.slots(indices, pipeline.out_size)  # masks cut straight into the batch
            values = lambda i, plan, at: sample_fields.values(i, plan, at, reads, slots)  # noqa: E731
        batch = decode_batch(pipeline, read, parsed, self.index.width[indices],
                             self.index.height[indices], self.index.label[indices],
                             self.decoder, self.reader.where, max_pixels=self.max_pixels,
                             failed=undecoded, sample_transform=self.sample_transform, values=values,
                             tensor_transform=self.transform, pixels=pixels)
        if pixels is not None:
            batch.pixel_counts = self.pixel_cache.count(pixels)  # type: ignore[union-attr]
        if failed is not None and undecoded:
            # in the batch's order, not the order the decode threads met them: the first is warned of
            failed.update((indices[k], exc) for k, exc in sorted(undecoded.items()))
            indices = [i for k, i in enumerate(indices) if k not in undecoded]
        if self._fields is not None:
            self._fields.into_batch(batch, batch.samples, slots)
            return batch
        if self.target_transform is not None:
            samples = [(image, self._target(i, label)) for i, (image, label) in zip(indices, batch)]
            return samples if pixels is None else SkipCountedList(samples, 0, batch.pixel_counts)
        return batch

    def _file_field_reads(self, indices: list[int]) -> dict[str, Callable[[int], bytes]]:
        """``read(i)`` of each file field asked for, for a batch's records (a store's batch fetched
        at once, a field at a time)."""
        files = self._fields.files if self._fields is not None else ()
        return {name: self.reader.prefetched(indices, name) for name in files}

    def _read_skipping(self, indices: list[int], failed: dict[int, CorruptRecordError]) -> list[Any]:
        """Payloads of ``indices``, None (and an entry in ``failed``) for each damaged record."""
        try:
            return list(self.reader.read_many(indices))
        except CorruptRecordError:
            pass  # find which records are damaged: one read each
        payloads: list[Any] = []
        for i in indices:
            try:
                payloads.append(self.reader.read(i))
            except CorruptRecordError as exc:
                failed[i] = exc
                payloads.append(None)
        return payloads

    def _count_skips(self, failed: dict[int, CorruptRecordError], skipped: int) -> None:
        """Count every skipped record; warn about the first one of each shard."""
        self.skipped += skipped
        for i, exc in failed.items():
            shard = int(self.index.shard[i])
            if shard not in self._warned_shards:
                self._warned_shards.add(shard)
                warnings.warn(f"{exc} [skipped: on_error='skip'; other damaged records of "
                              f"{self.manifest.shards[shard].file} are skipped without a warning and "
                              "counted in loader.stats()['skipped']]", SkippedRecordWarning, stacklevel=2)

    def _finish(self, i: int, image: Any, values: dict[str, Any] | None = None) -> Any:
        if self.transform is not None:
            try:
                image = self.transform(image)
            except Exception as exc:
                exc.add_note(f"fastload: raised by transform on {self.reader.where(i)}")
                raise
        label = self._target(i, int(self.index.label[i]))
        return self._as_fields(i, image, label, values) if self.fields else (image, label)

    def _target(self, i: int, label: int) -> Any:
        if self.target_transform is None:
            return label
        try:
            return self.target_transform(label)
        except Exception as exc:
            exc.add_note(f"fastload: raised by target_transform on {self.reader.where(i)}")
            raise

    def _as_fields(self, i: int, image: Any, label: Any, values: dict[str, Any] | None = None) -> dict[str, Any]:
        assert self._fields is not None
        return self._fields.sample(image, label, self._fields.values(i, None, self.reader.where(i))
                                   if values is None else values)

    @property
    def decoder(self) -> ThreadDecoder:
        if self._decoder is None:
            threads = self.decode_threads
            if threads is None:
                in_worker = torch.utils.data.get_worker_info() is not None
                threads = 1 if in_worker else available_cpus()
            self._decoder = ThreadDecoder(threads)
        return self._decoder

    def payload(self, i: int, data: bytes) -> Any:
        """Record ``i`` as a sample: an RGB PIL image, or in a dataset of other files its bytes
        decoded as ``decode`` says (see :mod:`fastload.decode.files`)."""
        if self.manifest.kind == "images":
            return self.load_image(i, data)
        decoder = decoder_for(self.decode, self.index.path[i])  # type: ignore[arg-type]
        return data if decoder is None else decoder(data, self.reader.where(i))

    def load_image(self, i: int, data: bytes) -> Any:
        """Full decode to an RGB PIL image; damage raises CorruptRecordError naming the record."""
        return decode_rgb(data, where=self.reader.where(i), max_pixels=self.max_pixels)
