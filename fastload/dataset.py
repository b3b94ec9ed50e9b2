"""PackedDataset: a packed directory as a map-style torch Dataset (reader + decode + transforms)."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch.utils.data

from fastload.config import CACHE_LIMIT, PIXEL_CACHE_LIMIT
from fastload.samples.options import check_kind, check_options
from fastload.decode.files import FileDecode
from fastload.decode.images import MAX_PIXELS, pixel_limit
from fastload.decode.pipeline import ImagePipeline, ThreadDecoder
from fastload.format import Manifest, RecordIndex
from fastload.pixels import pixel_cache_for
from fastload.readers import ShardReader
from fastload.samples.fields import SampleFields, field_names
from fastload.samples.reading import SampleReading
from fastload.samples.user_transforms import SampleTransform
from fastload.storage import node_cache
from fastload.storage.packed import locate_packed, open_packed


class PackedDataset(SampleReading, torch.utils.data.Dataset):
    """Read-only random access to a dataset written by ``fastload pack``.

    Args:
        path: the packed dataset directory (the one holding ``manifest.json``).
        transform: without ``image_size``, applied to the PIL image, as in torchvision's ImageFolder
            (the slow, general path). With ``image_size``, a tensor transform ``fn(image) -> tensor``
            applied to each sample after the built-in decode and crop (``image``: uint8 3×H×W), in
            the decode threads or workers; the batch stacks what it returns (any dtype, one shape
            for every sample). It draws from torch's RNG as your transforms do anywhere; for draws
            that repeat across workers and resumes use ``sample_transform``.
        target_transform: applied to the label.
        image_size: turns on the built-in image pipeline: samples are ``uint8`` ``3×H×W`` tensors.
        train: with ``image_size``, which pipeline, said every time: ``True``, RandomResizedCrop +
            flip (a new random crop each epoch: training); ``False``, resize + centre crop (the same
            every time: validation and test sets). Left out with ``image_size``, it is an error:
            a validation set that got training's random crops would go unnoticed.
        scale, ratio: RandomResizedCrop's area and aspect-ratio ranges.
        resize_ratio: eval crop side over resized shorter side (224/256 = 0.875).
        decode_threads: threads decoding a batch in ``__getitems__``; None: every core in the main
            process, one inside a DataLoader worker process.
        on_error: what a damaged record does (checksum mismatch, or bytes that do not decode: a
            :class:`~fastload.errors.CorruptRecordError` naming shard, record and source path).
            ``"raise"``: the read fails. ``"skip"``: a batch read (``__getitems__``, which
            torch's and fastload's loaders use) leaves the record out, so the batch is smaller
            (empty when every record in it is damaged; the number of batches never changes);
            the record is counted in ``loader.stats()["skipped"]`` (also from worker processes)
            and the first one of each shard is warned about (``SkippedRecordWarning``, once per
            shard in each process that reads). ``ds[i]`` raises either way: one sample has no
            sound stand-in. Dataset-level damage (a missing or resized shard) always raises.
        storage_options: for a URL (``s3://bucket/images.fl``): fsspec options of its store
            (``endpoint_url``, ``key``/``secret``, ``anon``, ...); credentials otherwise come the
            store's standard way (environment variables, config files).
        cache_dir, cache_limit, cache_policy: a remote dataset's fetched bytes are kept in a cache
            on this machine's disk, shared by its processes and ranks (``cache_dir`` default:
            ``FASTLOAD_CACHE_DIR``, else ``~/.cache/fastload``), never above ``cache_limit``
            (``0``: no cache). ``"keep"``: once full, keep what it holds instead of evicting
            this dataset's bytes for others of it (under a shuffle every epoch then hits the kept
            part; ``"lru"`` would evict what the next epoch needs). See docs/remote.md.
        max_pixels: refuse images larger than this before decoding them (decompression bombs),
            with a CorruptRecordError; ``fastload pack --max-pixels`` is the pack-time twin. A
            whole number (``5e8`` is accepted); it is the one read-time limit: Pillow's
            process-wide ``Image.MAX_IMAGE_PIXELS`` is raised as far as needed (never lowered) so
            it does not refuse an image this allows.
        sample_transform: with ``image_size``, your augmentation ``fn(sample, generator) -> sample``
            on each decoded sample, in the decode threads or workers: ``sample`` is ``{"image":
            uint8 3×H×W tensor, "label": int, "index": int}``, ``generator`` a ``torch.Generator``
            seeded from ``(seed, epoch, index)`` (the same draws for any number of workers, and after
            a resume). See :mod:`fastload.samples.user_transforms`, and :mod:`fastload.augment` for ready-made ones.
        fields: return each sample as a dict of these fields (``"image"``, ``"label"`` and any the
            pack stored, see ``fastload info``), and batches as dicts collated by each field's type
            (numbers as tensors, text as lists, arrays stacked or listed). File fields are read and
            decoded too (see :mod:`fastload.samples.file_fields`): with ``image_size``, masks and other
            fields of the image's size get its crop and flip.
        sample_as: ``"dict"``, or ``"tuple"``: samples and batches as tuples in the order of ``fields``.
        pad_fields: ``{name: value}``: variable-length array fields to pad into one
            ``N×max×…`` tensor (plus ``<name>_lengths``) instead of a list.
        boxes: with ``image_size``, the field of boxes (``x0, y0, x1, y1`` in the image's pixels)
            that follows the crop and flip into output pixels; boxes left without area are dropped,
            with their rows of ``box_fields`` (their labels, say).
        decode: for a dataset of files that are not images: ``"bytes"`` (as packed), ``"npy"``
            (a tensor), ``"text"`` (a str), ``"wav"`` (a channels × frames tensor) or ``"auto"``
            (by each file's extension); see :mod:`fastload.decode.files`.
        pixel_cache, pixel_cache_limit, pixel_side: with ``image_size``, decode each image once,
            whole, to its shorter side at ``pixel_side`` (default ``round(max(image_size) /
            resize_ratio)``, 256 for 224; never enlarged), keep the pixels in a folder on this
            machine's disk shared by its processes and ranks (``pixel_cache=True``:
            ``FASTLOAD_PIXEL_CACHE_DIR``, else ``pixels`` in the node cache folder; or a path), and
            crop every later epoch from them: no JPEG decode. At most ``pixel_cache_limit`` for
            every dataset's pixels together (``0``: none); what does not fit decodes as without it.
            ``loader.stats()["pixel_cache"]`` says hits, misses and bytes. See docs/loader.md.

    Without ``image_size``, ``ds[i]`` is ``(PIL.Image in RGB, label)`` (``(bytes, label)``, or what
    ``decode`` makes of them, when the packed files are not all images); with it, ``(uint8 tensor, label)``, and ``__getitems__``
    reads and decodes a whole batch into one preallocated tensor.
    ``ds.record(i)`` gives the stored bytes and metadata.
    Shard handles open lazily in the process that reads, so the dataset can go to DataLoader workers
    under fork or spawn; per-record metadata lives in NumPy arrays, never Python lists.
    """

    def __init__(self, path: str | os.PathLike[str], transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[int], Any] | None = None, *,
                 image_size: int | tuple[int, int] | None = None, train: bool | None = None,
                 scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3),
                 resize_ratio: float = 0.875, decode_threads: int | None = None,
                 on_error: Literal["raise", "skip"] = "raise",
                 max_pixels: int | float = MAX_PIXELS,  # noqa: PYI041 - a count, 5e8 too
                 storage_options: dict[str, Any] | None = None,
                 cache_dir: str | os.PathLike[str] | None = None, cache_limit: int | str = CACHE_LIMIT,
                 cache_policy: Literal["keep", "lru"] = "keep",
                 sample_transform: SampleTransform | None = None, decode: FileDecode = "bytes",
                 fields: Iterable[str] | None = None, pad_fields: Mapping[str, float] | None = None,
                 boxes: str | None = None, box_fields: Sequence[str] = (),
                 sample_as: Literal["dict", "tuple"] = "dict",
                 pixel_cache: str | os.PathLike[str] | bool | None = None,
                 pixel_cache_limit: int | str = PIXEL_CACHE_LIMIT, pixel_side: int | None = None) -> None:
        if image_size is not None and train is None:
            raise ValueError(f"PackedDataset({os.fspath(path)!r}, image_size={image_size!r}): say which pipeline, "
                             "train=True (a random crop and flip of each image, new every epoch: for training) "
                             "or train=False (resize and centre crop, the same every time: for validation and "
                             "test sets)")
        fields = None if fields is None else field_names(fields)  # read once: a generator too
        check_options(on_error=on_error, transform=transform, target_transform=target_transform,
                      image_size=image_size, sample_transform=sample_transform, decode=decode,
                      decode_threads=decode_threads, fields=fields, pad_fields=pad_fields, boxes=boxes,
                      box_fields=box_fields, sample_as=sample_as)
        self.on_error = on_error
        self.max_pixels = pixel_limit(max_pixels)
        self.skipped = 0  # records skipped in this process (each worker counts its own)
        self._warned_shards: set[int] = set()
        self.location = locate_packed(path, storage_options)
        self.root = self.location.root  # absolute: a later os.chdir must not move the dataset
        self.cache = (node_cache(cache_dir, cache_limit, cache_policy)
                      if self.location.store is not None else None)
        self.transform = transform
        self.target_transform = target_transform
        self.pipeline = (ImagePipeline(image_size, bool(train), scale, ratio, resize_ratio)
                         if image_size is not None else None)
        self.sample_transform = sample_transform
        self.decode = decode
        self.decode_threads = decode_threads
        self._decoder: ThreadDecoder | None = None
        self._records: np.ndarray | None = None  # a subset's record numbers (see subset), else every record
        self._open()
        check_kind(self.manifest.kind, self.root, image_pipeline=self.pipeline is not None, decode=decode)
        self.sample_as = sample_as
        self._fields = None if fields is None else SampleFields(
            self.manifest, self.index, fields, pad_fields, boxes, box_fields,
            cropped=self.pipeline is not None, where=str(self.root), as_tuple=sample_as == "tuple",
            max_pixels=self.max_pixels)
        if self._fields is not None:
            self._fields.reader = self.reader
        self.pixel_cache = pixel_cache_for(
            pixel_cache, pixel_cache_limit, pixel_side, manifest=self.manifest, max_pixels=self.max_pixels,
            out_size=self.pipeline.out_size if self.pipeline else None, resize_ratio=resize_ratio, dataset=str(self.root))

    @property
    def fields(self) -> tuple[str, ...] | None:
        """The fields of dict samples (``fields=``), or None for ``(image, label)`` samples."""
        return self._fields.names if self._fields is not None else None

    def collate(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        """Dict samples (``fields=``) into one batch, each field by its type (see :mod:`fastload.samples.fields`)."""
        if self._fields is None:
            raise TypeError("collate: this dataset's samples are (image, label) pairs: torch's default_collate "
                            "fits them; PackedDataset.collate is for fields=")
        return self._fields.collate(samples)

    def _open(self) -> None:
        opened = open_packed(self.location, self.cache)
        self.manifest: Manifest = opened.manifest
        self.index: RecordIndex = opened.index
        self.reader: ShardReader = opened.reader
        self._check_shard_files()

    def _check_shard_files(self) -> None:
        """A missing, truncated or extended shard is refused at open, not at its first read."""
        for shard in range(len(self.manifest.shards)):
            self.reader.stat_shard(shard)

    def __getstate__(self) -> dict[str, Any]:
        # Spawned workers re-open from the directory instead of receiving pickled arrays.
        state = self.__dict__.copy()
        for name in ("manifest", "index", "reader", "_decoder"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._decoder = None
        self._open()
        if self._fields is not None:
            self._fields.index, self._fields.reader = self.index, self.reader

    def __len__(self) -> int:
        return self.manifest.num_records if self._records is None else len(self._records)

    def subset(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> PackedDataset:
        """The samples ``indices`` of this dataset, as a PackedDataset of their own (sample ``k``
        of the subset is sample ``indices[k]`` here): same settings, same open files, and the
        fast path a DataLoader gives a PackedDataset (batched reads, decode threads, the epoch
        sampler, resume). ``torch.utils.data.Subset`` of a PackedDataset becomes one in the loader."""
        wanted = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = len(self)
        if len(wanted) and (wanted.min() < -n or wanted.max() >= n):
            bad = int(wanted[(wanted < -n) | (wanted >= n)][0])
            raise IndexError(f"subset: index {bad} is out of range for {self!r}")
        wanted = np.where(wanted < 0, wanted + n, wanted)
        view = copy.copy(self)
        view._records = wanted if self._records is None else self._records[wanted]
        view._records.setflags(write=False)
        view.skipped, view._warned_shards = 0, set()
        return view

    def split(self, lengths: Sequence[int | float], *, seed: int = 0) -> list[PackedDataset]:
        """Disjoint random subsets (see :meth:`subset`) of the given lengths, or fractions summing
        to 1, as ``torch.utils.data.random_split`` cuts them; the same ``seed``, the same split."""
        n = len(self)
        if lengths and all(isinstance(x, float) for x in lengths) and abs(sum(lengths) - 1) < 1e-9:
            counts = [int(n * x) for x in lengths]
            for k in range(n - sum(counts)):  # the remainder, one each round-robin, as torch does
                counts[k % len(counts)] += 1
        else:
            counts = [int(x) for x in lengths]
        if sum(counts) != n or any(c < 0 for c in counts):
            raise ValueError(f"split: lengths {list(lengths)} must be counts summing to {n} (the dataset's "
                             "length) or fractions summing to 1")
        order = np.random.default_rng(seed).permutation(n)
        ends = np.cumsum(counts)
        return [self.subset(order[end - count:end]) for count, end in zip(counts, ends)]

    @property
    def record_sizes(self) -> np.ndarray:
        """Each sample's stored payload bytes (int64), in this dataset's (or subset's) order."""
        return self.index.size if self._records is None else self.index.size[self._records]

    def fill_cache(self) -> None:
        """For a dataset in an object store with a node cache: fetch its shards into the cache in
        a background thread, ahead of the reads (``fastload.DataLoader`` calls this as an epoch
        begins; a whole epoch wants every shard). Nothing for a local dataset or without a cache."""
        if self.reader.remote is not None:
            self.reader.remote.fill(range(len(self.manifest.shards)))

    @property
    def classes(self) -> list[str]:
        """Class names in label order (empty when the source had no labels)."""
        return list(self.manifest.classes or [])

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.classes)}

    @property
    def targets(self) -> np.ndarray:
        """Every sample's label as a read-only int64 array (-1 where unlabeled)."""
        return self.index.label if self._records is None else self.index.label[self._records]

    def _check(self, i: int) -> int:
        """The record number of sample ``i`` (a subset's own numbering mapped to the records)."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"record index {i} is out of range for a dataset of {n} records")
        i = i + n if i < 0 else int(i)
        return i if self._records is None else int(self._records[i])

    def record(self, i: int) -> dict[str, Any]:
        """The stored record: ``data`` (bytes), ``label``, ``path``, ``width``, ``height`` and extra
        fields; a file field's stored bytes, but a mask stored as rows ("mask-rows") as an image
        file of its values (PNG; TIFF for 32-bit and float values)."""
        i = self._check(i)
        out: dict[str, Any] = {
            "data": self.reader.read(i), "label": int(self.index.label[i]), "path": self.index.path[i],
            "width": int(self.index.width[i]), "height": int(self.index.height[i]),
        }
        for name in self.index.fields:
            out[name] = self.index.field(name, i)
        for name in self.index.files:
            out[name] = self.reader.read(i, name)  # a file field: its stored bytes
            if self.manifest.fields[name] == "mask-rows":
                from fastload.decode.masks import mask_file

                out[name] = mask_file(out[name], where=self.reader.where(i, name), max_pixels=self.max_pixels)
        return out

    def __repr__(self) -> str:
        return (f"PackedDataset({str(self.root)!r}, records={len(self)}, classes={len(self.classes)}, "
                f"storage={self.manifest.storage!r})")
