"""Samples: several packed datasets as one, mixed by weight into each epoch (MixedDataset)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.utils.data

from fastload.dataset import PackedDataset
from fastload.samples.collate import ImageBatch, SkipCountedList, new_image_batch, pixels_in
from fastload.sampling.epoch_sampler import SampleKey
from fastload.sampling.mixing import MixPlan, source_counts


class MixedDataset(torch.utils.data.Dataset):
    """Packed datasets (local or in a store) read as one, each with its share of every epoch.

    Its index space is the sources laid end to end (``mixed[i]`` is record ``i - sum(sizes[:k])``
    of source ``k``; ``len(mixed)`` their records summed). The mix lives in the order:
    ``fastload.DataLoader(mixed, shuffle=True, seed=...)`` draws ``epoch_length`` samples an
    epoch, each source its count, from ``(seed, epoch)``, as :mod:`fastload.sampling.mixing`
    says: within a source every record is drawn once before any is drawn again (across
    epochs), and no record twice in one epoch while its count is at most its size. The loader
    shards, batches, counts ``len(loader)`` and resumes (``state_dict``) as for a PackedDataset.

    Size the shares one way (none: every record once an epoch):

    Args:
        sources: PackedDatasets giving batches of one shape: the same ``image_size``, ``fields``
            (of the same types), ``sample_as``, ``pad_fields``, ``decode`` and ``on_error``.
            Labels are each source's own. ``ds.subset(...)`` selects part of a source.
        weights: relative shares of an epoch of ``epoch_length`` draws (Streaming's
            ``proportion``, LitData's ``weights``); counts within 1 of ``epoch_length * weight /
            sum(weights)`` and summing to it, exactly it when that is whole.
        samples_per_epoch: each source's count (Streaming's ``choose``).
        repeat: each source's count as ``round(repeat * len(source))`` (Streaming's ``repeat``;
            2.0 draws every record twice an epoch).
        epoch_length: with ``weights``: draws an epoch (default: every source's records summed).

    A batch holds its samples grouped by source (each group in the sampler's order). A record's
    crop and ``sample_transform`` draws are keyed by ``(seed, source, pass, record)``: a record
    drawn twice in one epoch gets two different crops.
    """

    def __init__(self, sources: Sequence[PackedDataset], *, weights: Sequence[float] | None = None,
                 samples_per_epoch: Sequence[int] | None = None, repeat: Sequence[float] | None = None,
                 epoch_length: int | None = None) -> None:
        self.sources = list(sources)
        for k, source in enumerate(self.sources):
            if not isinstance(source, PackedDataset):
                raise TypeError(f"MixedDataset: source {k} is a {type(source).__name__}; give "
                                "fastload.PackedDataset sources (ds.subset(indices) for part of one)")
        _check_alike(self.sources)
        sizes = [len(source) for source in self.sources]
        self.counts = source_counts(sizes, weights=weights, samples_per_epoch=samples_per_epoch,
                                    repeat=repeat, epoch_length=epoch_length)
        self.plan = MixPlan(sizes, self.counts)
        self.offsets = self.plan.offsets

    @property
    def epoch_length(self) -> int:
        """Samples a loader draws an epoch: every source's count summed."""
        return self.plan.epoch_length

    def __len__(self) -> int:
        return int(self.offsets[-1])

    # what the loader reads of a dataset: the sources agree on these (see _check_alike)
    pipeline = property(lambda self: self.sources[0].pipeline)
    fields = property(lambda self: self.sources[0].fields)
    sample_as = property(lambda self: self.sources[0].sample_as)
    on_error = property(lambda self: self.sources[0].on_error)
    transform = property(lambda self: next((s.transform for s in self.sources if s.transform), None))
    sample_transform = property(lambda self: next((s.sample_transform for s in self.sources
                                                   if s.sample_transform), None))

    @property
    def skipped(self) -> int:
        """Records ``on_error="skip"`` left out in this process, every source's."""
        return sum(source.skipped for source in self.sources)

    def collate(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        """Dict samples (``fields=``) into one batch, as each source's ``collate`` does."""
        return self.sources[0].collate(samples)

    @property
    def record_sizes(self) -> np.ndarray:
        """Each sample's stored payload bytes, the sources laid end to end."""
        return np.concatenate([source.record_sizes for source in self.sources])

    @property
    def targets(self) -> np.ndarray:
        """Every sample's label (each source's own), the sources laid end to end."""
        return np.concatenate([source.targets for source in self.sources])

    def fill_cache(self) -> None:
        """Fetch ahead into the node cache for every source in an object store."""
        for source in self.sources:
            source.fill_cache()

    def locate(self, index: int) -> tuple[int, int]:
        """``(source, its sample number)`` of sample ``index``."""
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} is out of range for a MixedDataset of {n} samples")
        index = int(index) + n if index < 0 else int(index)
        source = int(np.searchsorted(self.offsets, index, side="right")) - 1
        return source, index - int(self.offsets[source])

    def _source_key(self, key: int | SampleKey | tuple[int, int, int]) -> tuple[int, Any]:
        if not isinstance(key, tuple):
            return self.locate(key)
        index, epoch, seed = key
        source, local = self.locate(index)
        # each source its own streams of crops: seed < 2**63, so these keys stay apart
        return source, SampleKey(local, int(epoch), int(seed) ^ ((source + 1) << 64))

    def __getitem__(self, key: int | SampleKey) -> Any:
        source, local = self._source_key(key)
        return self.sources[source][local]

    def __getitems__(self, keys: list[int | SampleKey]) -> list[Any]:
        """A batch: each source's keys read as one batch of its own, the parts joined in source order."""
        groups: dict[int, list[Any]] = {}
        for key in keys:
            source, local = self._source_key(key)
            groups.setdefault(source, []).append(local)
        parts = [self.sources[s].__getitems__(groups[s]) for s in sorted(groups)]
        return parts[0] if len(parts) == 1 else self._join(parts)

    @property
    def pixel_cache(self) -> MixedPixelCaches | None:
        """The sources' pixel caches (for ``loader.stats()``), or None when none has one."""
        caches = [s.pixel_cache for s in self.sources if s.pixel_cache is not None]
        return MixedPixelCaches(caches) if caches else None

    def _join(self, parts: list[Any]) -> Any:
        counts = [getattr(p, "skipped", None) for p in parts]
        skipped = None if all(c is None for c in counts) else sum(c or 0 for c in counts)
        pixels = [c for c in map(pixels_in, parts) if c is not None]
        summed = tuple(int(sum(c)) for c in zip(*pixels)) if pixels else None
        if not all(isinstance(p, ImageBatch) for p in parts):
            joined = [sample for part in parts for sample in part]
            return joined if skipped is None and summed is None else SkipCountedList(joined, skipped or 0, summed)
        sizes = [len(p) for p in parts]
        height, width = parts[0].images.shape[-2:]
        images = new_image_batch(sum(sizes), height, width)
        torch.cat([p.images for p in parts], out=images)
        batch = ImageBatch(images, torch.cat([p.labels for p in parts]))
        batch.skipped, batch.pixel_counts = skipped, summed
        if parts[0].fields is not None:
            fields = self.sources[0]._fields
            if fields is not None:  # the sources' fields agree: one collates them all
                fields.into_batch(batch, [s for p in parts for s in (p.samples or [])])
        return batch

    def __repr__(self) -> str:
        shares = ", ".join(f"{str(s.root).rstrip('/').rsplit('/', 1)[-1]}: {c}/{len(s)}" for s, c in zip(self.sources, self.counts))
        return f"MixedDataset([{shares}], epoch_length={self.epoch_length})"


class MixedPixelCaches:
    """A MixedDataset's sources' pixel caches, as ``loader.stats()`` asks of one."""

    def __init__(self, caches: list[Any]) -> None:
        self.caches = caches

    def bytes(self) -> int:
        return sum(cache.bytes() for cache in self.caches)


def _check_alike(sources: list[PackedDataset]) -> None:
    """Refuse sources whose batches would not collate together, naming the two and what differs."""
    if not sources:
        raise ValueError("MixedDataset: give at least one source")
    first = _batch_shape(sources[0])
    for k, source in enumerate(sources[1:], start=1):
        for name, value in _batch_shape(source).items():
            if value != first[name]:
                raise ValueError(f"MixedDataset: source 0 ({sources[0].root}) has {name}={first[name]!r} "
                                 f"but source {k} ({source.root}) has {name}={value!r}; their batches would "
                                 "not collate together: open both with the same settings")


def _batch_shape(source: PackedDataset) -> dict[str, Any]:
    """What decides a batch's shape and types."""
    fields = source._fields
    return {
        "image_size": None if source.pipeline is None else source.pipeline.out_size,
        "kind": source.manifest.kind, "decode": source.decode, "on_error": source.on_error,
        "fields": source.fields, "sample_as": source.sample_as,
        "field types": None if fields is None else {n: fields.types[n] for n in fields.names},
        "pad_fields": None if fields is None else dict(fields.pad),
        "target_transform": source.target_transform is not None,
    }
