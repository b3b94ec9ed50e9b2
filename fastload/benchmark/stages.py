"""Doctor's stage timings: each step of a loader alone, on one thread.

A probe exposes a loader's steps one by one: ``read(i)`` → bytes, ``decode(i, data)``,
``transform(i, decoded)`` → sample, ``collate(samples)`` → batch. Each is timed over a fixed
random sample of records (seconds per sample); :mod:`fastload.benchmark.ceilings` says what the
machine can do at all.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch

from fastload.benchmark.spread import Spread
from fastload.decode.crops import decode_crop
from fastload.samples.collate import ImageBatch, collate_images, new_image_batch

StageKind = Literal["io", "cpu", "transfer"]
READS_IN_FLIGHT = 16  # cold reads: a disk serves many random reads at once


@dataclass
class Stage:
    """One step timed alone: seconds per sample on one thread, and how many run at once in the
    loader being diagnosed (``parallel``)."""

    name: str
    kind: StageKind
    seconds_per_sample: float
    parallel: int = 1
    note: str | None = None
    low: float | None = None  # the fastest and slowest of its timing rounds (None: timed once)
    high: float | None = None

    @property
    def samples_per_s(self) -> float:
        return 1.0 / self.seconds_per_sample if self.seconds_per_sample > 0 else float("inf")

    def as_dict(self) -> dict[str, Any]:
        rate = self.samples_per_s
        return {"name": self.name, "kind": self.kind, "seconds_per_sample": self.seconds_per_sample,
                "samples_per_s": None if rate == float("inf") else rate, "parallel": self.parallel,
                "note": self.note, "low": self.low, "high": self.high}


class Probe(Protocol):
    """A loader's steps, callable one at a time (see :class:`ImageFolderProbe`, :class:`PackedProbe`)."""

    decode_name: str

    def __len__(self) -> int: ...
    def files_of(self, indices: Sequence[int]) -> list[str]: ...
    def read(self, i: int) -> bytes: ...
    def decode(self, i: int, data: bytes) -> Any: ...
    def transform(self, i: int, decoded: Any) -> Any: ...
    def collate(self, samples: list[Any]) -> Any: ...
    def release(self) -> None: ...


class ImageFolderProbe:
    """Any Dataset with ``read``/``decode``/``transform`` methods (the ImageFolder baseline)."""

    decode_name = "decode"

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def files_of(self, indices: Sequence[int]) -> list[str]:
        """The files holding these records (what a cold read drops from the page cache)."""
        files = getattr(self.dataset, "files", None)
        return [files[i] for i in indices] if files else []

    def read(self, i: int) -> bytes:
        return self.dataset.read(i)

    def decode(self, i: int, data: bytes) -> Any:
        return self.dataset.decode(data)

    def transform(self, i: int, decoded: Any) -> Any:
        return self.dataset.transform(decoded), 0

    def collate(self, samples: list[Any]) -> Any:
        collate = getattr(self.dataset, "collate", None)
        return collate(samples) if collate else torch.utils.data.default_collate(samples)

    def release(self) -> None:
        pass


class PackedProbe:
    """A PackedDataset's steps: checked record read, then decode; with the built-in pipeline the
    crop and flip happen inside the reduced-scale decode, and collate is the preallocated batch."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.pipeline = dataset.pipeline
        self.decode_name = "decode+crop (reduced-scale)" if self.pipeline else "decode"

    def __len__(self) -> int:
        return len(self.dataset)

    def files_of(self, indices: Sequence[int]) -> list[str]:
        shards = self.dataset.manifest.shards
        return [str(self.dataset.root / shards[s].file)
                for s in sorted({int(self.dataset.index.shard[i]) for i in indices})]

    def read(self, i: int) -> bytes:
        return self.dataset.reader.read_many([i])[0]

    def decode(self, i: int, data: bytes) -> Any:
        ds = self.dataset
        if self.pipeline is None:
            return ds.payload(i, data)
        plan = self.pipeline.plan(i, 0, 0, int(ds.index.width[i]), int(ds.index.height[i]))
        # into its own array, as the pipeline decodes into its slot of the batch
        return decode_crop(data, plan, out=np.empty((*self.pipeline.out_size, 3), dtype=np.uint8))

    def transform(self, i: int, decoded: Any) -> Any:
        if self.pipeline is None:
            return (self.dataset.transform(decoded) if self.dataset.transform else decoded), 0
        return torch.from_numpy(decoded).permute(2, 0, 1), 0

    def collate(self, samples: list[Any]) -> Any:
        if self.pipeline is None:
            return torch.utils.data.default_collate(samples)
        # The decoder writes each sample into one preallocated batch: forming it costs this.
        h, w = self.pipeline.out_size
        return collate_images(ImageBatch(new_image_batch(len(samples), h, w),
                                         torch.zeros(len(samples), dtype=torch.int64)))

    def release(self) -> None:
        # Pages a process maps survive posix_fadvise: readers map none, but close the shards.
        self.dataset.reader.close()
        gc.collect()


def make_cold(probe: Probe, indices: Sequence[int]) -> None:
    """Drop the files of records ``indices`` from the page cache, once the probe has let go of
    what it maps (mapped pages survive the drop)."""
    probe.release()
    drop_cache(probe.files_of(indices))


def drop_cache(paths: Sequence[str | os.PathLike[str]]) -> None:
    """Ask the kernel to forget each file's cached pages (``posix_fadvise(DONTNEED)``).

    Pages that are dirty or mapped by a running process stay; on tmpfs nothing is dropped.
    """
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def per_call(fn: Callable[[Any], Any], items: Sequence[Any], budget: float, rounds: int = 5) -> float:
    """Seconds per ``fn(item)``: the median of :func:`timed_rounds`."""
    return timed_rounds(fn, items, budget, rounds).median


def timed_rounds(fn: Callable[[Any], Any], items: Sequence[Any], budget: float, rounds: int = 5) -> Spread:
    """Seconds per ``fn(item)`` over ``items`` (cycled), after one untimed call, in ``rounds``
    rounds of ``budget / rounds`` seconds each: their median (a burst of load from other
    processes moves one round, not the result) and their spread (how much it moved them)."""
    fn(items[0])
    times, k = [], 0
    for _ in range(rounds):
        n, started = 0, time.perf_counter()
        while n < 1 or (time.perf_counter() - started < budget / rounds and n < 20 * len(items)):
            fn(items[k % len(items)])
            n, k = n + 1, k + 1
        times.append((time.perf_counter() - started) / n)
    return Spread.of(times)


def _bounded(fn: Callable[[Any], Any], items: Sequence[Any], budget: float, least: int = 4) -> list[Any]:
    """``[fn(x) for x in items]``, stopping after ``budget`` seconds once ``least`` are done."""
    out, started = [], time.perf_counter()
    for x in items:
        out.append(fn(x))
        if len(out) >= least and time.perf_counter() - started > budget:
            break
    return out


def _choose(probe: Probe, records: int, seed: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(seed).permutation(len(probe))[:records]]


def sample_records(probe: Probe, records: int = 64, seed: int = 0, budget: float = 0.5,
                   chosen: list[int] | None = None) -> dict[str, Any]:
    """A fixed random sample of records and their bytes (read in at most about ``budget`` s);
    ``chosen``: the records :func:`_choose` picked already."""
    chosen = _choose(probe, records, seed) if chosen is None else chosen
    blobs = _bounded(probe.read, chosen, budget)
    return {"indices": chosen[: len(blobs)], "blobs": blobs}


def measure_stages(probe: Probe, *, batch_size: int, cold: bool, budget: float = 0.5,
                   records: int = 64, seed: int = 0) -> tuple[list[Stage], dict[str, Any]]:
    """Time read, decode, transform and collate alone on ``records`` random records.

    Returns the stages (``parallel`` left at 1: the caller knows the loader) and the data the
    ceilings reuse: the sampled indices and their bytes (see :func:`sample_records`).
    """
    chosen = _choose(probe, records, seed)
    if cold:
        make_cold(probe, chosen)
        cold_part = chosen[: max(4, len(chosen) // 4)]
        started = time.perf_counter()
        done = _bounded(probe.read, cold_part, budget)
        once = (time.perf_counter() - started) / len(done)
        read, read_note = Spread(once, once, once), f"cold page cache, one read at a time ({len(done)} records)"
    sample = sample_records(probe, budget=budget, chosen=chosen)
    pairs = list(zip(sample["indices"], sample["blobs"]))
    if not cold:
        read, read_note = timed_rounds(probe.read, sample["indices"], budget), "warm page cache, one read at a time"
    decoded = _bounded(lambda p: probe.decode(*p), pairs, budget)
    decode = on_decode_thread(lambda: timed_rounds(lambda p: probe.decode(*p), pairs[: len(decoded)], budget))
    items = list(zip(chosen, decoded))
    samples = _bounded(lambda p: probe.transform(*p), items, budget)
    transform = on_decode_thread(lambda: timed_rounds(lambda p: probe.transform(*p), items[: len(samples)],
                                                      budget))
    batch = [samples[k % len(samples)] for k in range(batch_size)]
    per_batch = timed_rounds(probe.collate, [batch], budget)
    collate = Spread(per_batch.median / batch_size, per_batch.low / batch_size, per_batch.high / batch_size)
    stages = [_stage("read", "io", read, read_note),
              _stage(probe.decode_name, "cpu", decode),
              _stage("transform", "cpu", transform, "inside the decode" if "crop" in probe.decode_name else None),
              _stage("collate", "cpu", collate)]
    return stages, sample


def _stage(name: str, kind: StageKind, took: Spread, note: str | None = None) -> Stage:
    return Stage(name, kind, took.median, note=note, low=took.low, high=took.high)


def on_decode_thread(measure: Callable[[], Any]) -> Any:
    """``measure()`` run where a loader decodes: on a thread of its own."""
    with ThreadPoolExecutor(1, thread_name_prefix="fastload-decode") as pool:
        return pool.submit(measure).result()


def shard_files(root: str | os.PathLike[str]) -> list[str]:
    """The shard files of a packed dataset (for a sequential disk read)."""
    from fastload.format import read_manifest

    return [str(Path(root) / s.file) for s in read_manifest(root).shards]
