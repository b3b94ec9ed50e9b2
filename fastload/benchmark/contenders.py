"""The contenders of ``fastload bench``: how each row's loader is built, on the same records.

Rows: the ImageFolder baseline with torch's DataLoader at its defaults and at hand-tuned
settings; shuffled raw reads of the small files and of each packed dataset's records (the I/O
alone: ``READS_IN_FLIGHT`` reads at once, batch by batch); fastload's train pipeline on each
packed dataset with auto settings, and with a pixel cache (epoch >= 2); the DALI backend when
``fastload.DataLoader`` has one.
With a cold cache, each row first drops its files from the page cache.
"""

from __future__ import annotations

import gc
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastload.benchmark.baseline import ImageFolderBaseline
from fastload.benchmark.pixel_row import pixel_cache_row
from fastload.benchmark.runs import RunSpec
from fastload.benchmark.stages import READS_IN_FLIGHT, drop_cache, shard_files
from fastload.format import read_manifest


class RawReads:
    """Shuffled record reads, no decode: an iterable of batches, each a tensor of payload sizes.

    Each batch's reads are split into chunks read by ``threads`` threads at once, as a loader with
    many reads in flight would (``threads=1``: the whole batch to ``read_many``, for a reader that
    keeps its own requests in flight), the next batch's reads queued behind them; a new iteration
    is a new shuffle. ``subset``: read only the first ``subset`` records of the first iteration's
    order (what an earlier run of the same seed read), reshuffled each iteration. ``epochs``: at
    most this many iterations, later ones are empty (a cold first pass is never timed again warm).
    """

    def __init__(self, read_many: Callable[[list[int]], list[bytes]], count: int, batch_size: int,
                 threads: int = READS_IN_FLIGHT, seed: int = 0, subset: int | None = None,
                 epochs: int | None = None) -> None:
        self.read_many, self.batch_size, self.epochs = read_many, batch_size, epochs
        self.threads, self.seed, self.epoch = threads, seed, 0
        self.records = np.random.default_rng([seed, 0]).permutation(count)[:subset] if subset else None
        self.count = count if self.records is None else len(self.records)

    def __len__(self) -> int:
        return -(-self.count // self.batch_size)

    def __iter__(self) -> Iterator[torch.Tensor]:
        if self.epochs is not None and self.epoch >= self.epochs:
            return
        rng = np.random.default_rng([self.seed, self.epoch])
        order = rng.permutation(self.count) if self.records is None else rng.permutation(self.records)
        self.epoch += 1
        chunk = max(1, self.batch_size // self.threads)
        # two batches' reads queued at once, as a loader keeps the next one going: no contender's
        # disk or store idles while a batch's slowest read lands (threads=1: two read_many at once)
        with ThreadPoolExecutor(max(2, self.threads), thread_name_prefix="fastload-bench-read") as pool:
            queued: deque[list[Future[list[bytes]]]] = deque()
            for start in range(0, self.count, self.batch_size):
                batch = order[start:start + self.batch_size].tolist()
                queued.append([pool.submit(self.read_many, batch[k:k + chunk]) for k in range(0, len(batch), chunk)])
                if len(queued) > 1:
                    yield _sizes(queued.popleft())
            while queued:
                yield _sizes(queued.popleft())


def _sizes(parts: list[Future[list[bytes]]]) -> torch.Tensor:
    """The payload sizes of one batch's reads, once they have all landed."""
    return torch.tensor([len(b) for part in parts for b in part.result()], dtype=torch.int64)


def raw_batch_bytes(batch: torch.Tensor) -> int:
    """The bytes a RawReads batch read (it holds each payload's size)."""
    return int(batch.sum())


def _read_files(files: list[str]) -> Callable[[list[int]], list[bytes]]:
    def read_many(indices: list[int]) -> list[bytes]:
        out = []
        for i in indices:
            with open(files[i], "rb") as f:
                out.append(f.read())
        return out
    return read_many


def _drop_files(files: Sequence[str]) -> Callable[[], None]:
    def prepare() -> None:
        gc.collect()  # readers of the previous row close their shards (mapped pages stay cached)
        drop_cache(files)
    return prepare


def torch_rows(baseline: ImageFolderBaseline, batch_size: int, grid: Sequence[tuple[int, int]],
               cold: bool, pin_memory: bool = False) -> list[RunSpec]:
    """torch's DataLoader on the baseline: its defaults, then each ``(num_workers, prefetch_factor)``
    (with ``pin_memory``, as a careful user feeding a GPU step sets it)."""
    pinned = ", pin_memory" if pin_memory else ""
    prepare = _drop_files(baseline.files) if cold else None
    size = baseline.mean_size()
    rows = [RunSpec(f"torch {baseline.label}, defaults", "baseline", "folder",
                    lambda: torch.utils.data.DataLoader(baseline, batch_size=batch_size, shuffle=True),
                    "num_workers=0", size, prepare=prepare)]
    for workers, prefetch in grid:
        def make(workers: int = workers, prefetch: int = prefetch) -> Any:
            return torch.utils.data.DataLoader(baseline, batch_size=batch_size, shuffle=True,
                                               num_workers=workers, prefetch_factor=prefetch,
                                               persistent_workers=True, pin_memory=pin_memory)
        rows.append(RunSpec(f"torch {baseline.label}, tuned w{workers} pf{prefetch}", "baseline", "folder",
                            make, f"num_workers={workers}, prefetch_factor={prefetch}, persistent_workers{pinned}",
                            size, prepare=prepare))
    return rows


def raw_rows(baseline: ImageFolderBaseline | None, packed: Sequence[Path], batch_size: int,
             cold: bool) -> list[RunSpec]:
    """Shuffled raw reads: the small files, then each packed dataset's records."""
    settings = f"{READS_IN_FLIGHT} reads in flight, batches of {batch_size}"
    rows = []
    if baseline is not None:
        files = baseline.files
        rows.append(RunSpec("raw reads: small files", "raw", "folder",
                            lambda: RawReads(_read_files(files), len(files), batch_size), settings,
                            batch_bytes=raw_batch_bytes, prepare=_drop_files(files) if cold else None))
    for path in packed:
        storage = read_manifest(path).storage

        def make(path: Path = path) -> Any:
            from fastload.dataset import PackedDataset

            ds = PackedDataset(path)
            return RawReads(ds.reader.read_many, len(ds), batch_size)
        rows.append(RunSpec(f"raw reads: fastload {storage}", "raw", storage, make,
                            settings + ", checksums verified", batch_bytes=raw_batch_bytes,
                            prepare=_drop_files(shard_files(path)) if cold else None))
    return rows


def settings_text(loader: Any) -> str:
    """A fastload loader's resolved settings, in one line."""
    s = loader.settings
    if s.mode == "threads":
        threads = loader.dataset.decode_threads or "all-core"
        return f"{s.mode}: decode in {threads} threads, {s.prefetch_batches} batches ahead"
    return f"{s.mode}: num_workers={s.num_workers}, prefetch_factor={s.prefetch_factor}"


def fastload_rows(packed: Sequence[Path], batch_size: int, image_size: int, cold: bool,
                  dali: bool = True, variants: Sequence[dict[str, Any]] = (),
                  device: str | None = None) -> list[RunSpec]:
    """fastload's train pipeline (RandomResizedCrop + flip, uint8 batches) on each packed dataset:
    auto settings, then each of ``variants`` (explicit DataLoader arguments), then DALI; with
    ``device``, batches delivered there (a model step on the GPU)."""
    placed: dict[str, Any] = {"device": device} if device else {}
    from fastload.dataset import PackedDataset
    from fastload.loading.loader import DataLoader

    rows = []
    for path in packed:
        manifest = read_manifest(path)
        size = manifest.total_bytes / max(1, manifest.num_records)
        prepare = _drop_files(shard_files(path)) if cold else None

        def make(path: Path = path, **extra: Any) -> Any:
            ds = PackedDataset(path, image_size=image_size, train=True)
            return DataLoader(ds, batch_size=batch_size, shuffle=True, **{**placed, **extra})
        rows.append(RunSpec(f"fastload {manifest.storage}", "fastload", manifest.storage, make,
                            settings_text, size, prepare=prepare))
        rows.append(pixel_cache_row(path, manifest.storage, batch_size, image_size, size, cold, placed,
                                    settings_text))
        for kwargs in variants:
            label = " ".join(f"{k}={v}" for k, v in kwargs.items())
            rows.append(RunSpec(f"fastload {manifest.storage}, {label}", "fastload", manifest.storage,
                                lambda make=make, kwargs=kwargs: make(**kwargs),
                                settings_text,
                                size, prepare=prepare))
        if dali:
            where = "" if torch.cuda.is_available() else ", CPU operators (no CUDA device here)"
            rows.append(RunSpec(f"fastload {manifest.storage}, DALI backend", "dali", manifest.storage,
                                lambda make=make: make(backend="dali"), f"backend='dali'{where}", size,
                                prepare=prepare))
    return rows

