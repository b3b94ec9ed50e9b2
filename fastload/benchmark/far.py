"""Far storage in ``bench`` and ``doctor``: a dataset in an object store (``s3://...``).

- :class:`StoreObjects`: small objects in a store as the baseline users have today, one GET per
  sample (the ImageFolder baseline with ``read`` over the store);
- :func:`store_rows`: the raw-read and train rows of a packed dataset in a store: ranged reads
  with no cache, the first epoch into an empty cache and the second epoch from it (a temporary
  cache, never the user's node cache, so "cold" means cold);
- :func:`measure_store` → :class:`StoreSpeed`: what the store allows here (one request's latency,
  bandwidth with pieces in flight), the read stage of the verdict and whether it is latency- or
  bandwidth-bound.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from fastload.benchmark.baseline import ImageFolderBaseline
from fastload.benchmark.contenders import RawReads, raw_batch_bytes, settings_text
from fastload.benchmark.runs import RunSpec
from fastload.benchmark.stages import Stage
from fastload.config import MAX_FILE_SIZE, parse_size

LATENCY_PROBES = 8
"""Small ranged GETs timed one at a time for a request's latency (the median is kept)."""


class StoreObjects(ImageFolderBaseline):
    """Small image objects under a store prefix as ``(uint8 3×H×W tensor, label)`` samples: what a
    user reading S3 object by object has, one GET per sample (the store made again in each worker)."""

    label = "small objects"

    def __init__(self, store: Any, samples: Sequence[tuple[str, int]], sizes: Sequence[int],
                 image_size: int = 224, skipped: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(samples, image_size)
        self.store = store
        self.sizes = [int(s) for s in sizes]
        self.url = store.url
        self.skipped = list(skipped)  # (name, why): objects left out, as `fastload pack` would

    @classmethod
    def from_store(cls, url: str, storage_options: dict[str, Any] | None,
                   image_size: int = 224) -> StoreObjects:
        """Every image object under ``url`` in ``fastload pack``'s record order (ImageFolder or flat)."""
        from fastload.converters.sources.store import list_store_source
        from fastload.storage.remote import RemoteStore

        store = RemoteStore(url, storage_options)
        # an object over pack's --max-file-size is left out, never fetched whole into memory
        listing = list_store_source(store, max_file_size=parse_size(MAX_FILE_SIZE), on_error="skip")
        return cls(store, [(item.rel, item.label) for item in listing.items],
                   [item.size for item in listing.items], image_size,
                   [(skip.rel, skip.reason) for skip in listing.skipped])

    @property
    def files(self) -> list[str]:
        return []  # nothing in this machine's page cache to drop

    def mean_size(self, at_most: int = 1000) -> float:
        return float(np.mean(self.sizes)) if self.sizes else 0.0

    def read(self, i: int) -> bytes:
        """The object's bytes: one GET."""
        return self.read_many([i])[0]

    def read_many(self, indices: list[int]) -> list[bytes]:
        """The objects' bytes, one GET each, all in flight at once (up to the store's limit)."""
        return self.store.read_ranges([(self.samples[i][0], 0, self.sizes[i]) for i in indices])


def store_raw_rows(objects: StoreObjects | None, batch_size: int) -> list[RunSpec]:
    """Shuffled raw reads of the small objects, a batch's GETs in flight at once."""
    if objects is None:
        return []
    in_flight = objects.store.max_in_flight
    return [RunSpec("raw reads: small objects", "raw", "folder",
                    lambda: RawReads(objects.read_many, len(objects), batch_size, threads=1),
                    f"one GET per object, up to {in_flight} in flight, batches of {batch_size}",
                    batch_bytes=raw_batch_bytes)]


@dataclass
class _Epoch1:
    """What the first-epoch raw row read, for the second-epoch row to read again."""

    records: int = 0


def store_rows(url: str, storage_options: dict[str, Any] | None, cache_dir: str, batch_size: int,
               image_size: int, raw: bool = True, train: bool = True) -> list[RunSpec]:
    """The rows of the packed dataset at ``url``: raw reads with no cache, into an empty cache
    (epoch 1) and from it (epoch 2: the records epoch 1 fetched, reshuffled), then fastload's
    train pipeline from an empty cache. ``cache_dir`` is a temporary folder of the caller's."""
    from fastload.dataset import PackedDataset
    from fastload.loading.loader import DataLoader
    from fastload.storage.remote import MAX_IN_FLIGHT

    manifest = _manifest(url, storage_options)
    storage, size = manifest.storage, manifest.total_bytes / max(1, manifest.num_records)
    limit = cache_room(manifest)
    epoch1 = _Epoch1()

    def dataset(cached: bool, **kw: Any) -> PackedDataset:
        return PackedDataset(url, storage_options=storage_options, cache_dir=cache_dir,
                             cache_limit=limit if cached else 0, **kw)

    def empty_cache() -> None:
        from fastload.storage import node_cache

        node_cache(cache_dir, limit).clear()

    def cold_reads() -> RawReads:
        ds = dataset(True)
        return RawReads(_counting(ds.reader.read_many, epoch1), len(ds), batch_size, threads=1, epochs=1)

    def warm_reads() -> RawReads:
        ds = dataset(True)
        if not epoch1.records:
            raise RuntimeError("the first-epoch row read nothing, so the cache holds nothing to read")
        return RawReads(ds.reader.read_many, len(ds), batch_size, threads=1, subset=epoch1.records)

    reads = f"a batch's ranges in one round, up to {MAX_IN_FLIGHT} GETs in flight"
    rows = []
    if raw:
        rows += [
            RunSpec(f"raw reads: fastload {storage}, store, no cache", "raw", storage,
                    lambda: RawReads(dataset(False).reader.read_many, manifest.num_records, batch_size,
                                     threads=1),
                    f"{reads}, each record's own byte range, checksums verified", batch_bytes=raw_batch_bytes),
            RunSpec(f"raw reads: fastload {storage}, store, cache epoch 1", "raw", storage, cold_reads,
                    f"{reads}, 4 MiB pieces kept in an empty node cache, one pass", batch_bytes=raw_batch_bytes,
                    prepare=empty_cache),
            RunSpec(f"raw reads: fastload {storage}, store, cache epoch 2", "raw", storage, warm_reads,
                    "the records epoch 1 fetched, reshuffled, from the node cache", batch_bytes=raw_batch_bytes),
        ]
    if train:
        rows.append(RunSpec(f"fastload {storage}, store", "fastload", storage,
                            lambda: DataLoader(dataset(True, image_size=image_size, train=True),
                                               batch_size=batch_size, shuffle=True),
                            lambda loader: settings_text(loader) + ", empty node cache filled ahead",
                            size, prepare=empty_cache))
    return rows


def cache_room(manifest: Any) -> int:
    """A node cache limit that holds the whole dataset (one shard over, as admission needs)."""
    return manifest.total_bytes + max((s.bytes for s in manifest.shards), default=0)


def _counting(read_many: Callable[[list[int]], list[bytes]],
              epoch1: _Epoch1) -> Callable[[list[int]], list[bytes]]:
    """``read_many`` that counts what it read (RawReads runs two batches at once: under a lock).
    Every batch it starts is finished before the row ends, so the count is a prefix of the order."""
    lock = threading.Lock()

    def read(indices: list[int]) -> list[bytes]:
        out = read_many(indices)
        with lock:
            epoch1.records += len(indices)
        return out
    return read


def _manifest(url: str, storage_options: dict[str, Any] | None) -> Any:
    from fastload.storage.packed import locate_packed

    return locate_packed(url, storage_options).manifest()


@dataclass(frozen=True)
class StoreSpeed:
    """What a store allows this machine, measured as the loader fetches: one small request's
    latency alone, and one round of ``in_flight`` requests at once (``round_bytes`` in
    ``round_s``: a batch's records, a cache fill's pieces, or the objects the workers read)."""

    latency_s: float
    round_s: float
    round_bytes: int
    in_flight: int
    record_bytes: float

    @property
    def mb_s(self) -> float:
        return self.round_bytes / 1e6 / self.round_s if self.round_s > 0 else 0.0

    @property
    def records_per_s(self) -> float:
        """Records a second rounds like the measured one bring."""
        return self.round_bytes / self.record_bytes / self.round_s if self.round_s > 0 else float("inf")

    @property
    def bound(self) -> Literal["latency", "bandwidth"]:
        """Latency-bound when a round takes less than two round trips: the wait for the first
        byte, not the bytes, sets its time."""
        return "latency" if self.round_s < 2 * self.latency_s else "bandwidth"

    def stage(self, what: str) -> Stage:
        """The read stage of a loader reading this store: seconds per sample at the rate it allows."""
        note = (f"{what}: {self.latency_s * 1e3:.0f} ms a request; {self.in_flight} requests at once "
                f"take {self.round_s * 1e3:.0f} ms, {self.mb_s:.0f} MB/s: {self.bound}-bound")
        return Stage("read (object store)", "io", 1.0 / self.records_per_s, note=note)

    def as_dict(self) -> dict[str, Any]:
        return {"store_latency_ms": self.latency_s * 1e3, "store_round_ms": self.round_s * 1e3,
                "store_mb_s": self.mb_s, "store_in_flight": self.in_flight}


def measure_store(store: Any, small: Sequence[tuple[str, int, int]], round_: Sequence[tuple[str, int, int]],
                  record_bytes: float) -> StoreSpeed:
    """Time ``small`` ranges one at a time (latency: the median) and the ``round_`` of ranges all at
    once, from ``store`` (its own client and retries, no cache)."""
    times = []
    for name, start, length in small[:LATENCY_PROBES]:
        started = time.perf_counter()
        store.read_ranges([(name, start, length)])
        times.append(time.perf_counter() - started)
    started = time.perf_counter()
    got = sum(len(b) for b in store.read_ranges(list(round_)))
    return StoreSpeed(statistics.median(times), time.perf_counter() - started, got, len(round_), record_bytes)


def packed_store_speed(dataset: Any) -> StoreSpeed:
    """The store behind a PackedDataset in a store, as its reader fetches: with a node cache, a
    round of aligned 4 MiB pieces (as many as one read fetches), else a batch of records' own ranges."""
    from fastload.storage.remote_reads import FILL_BUDGET, FILL_PIECE

    remote, manifest = dataset.reader.remote, dataset.manifest
    record = manifest.total_bytes / max(1, manifest.num_records)
    shards = [s for s in manifest.shards if s.bytes]
    small = [(shards[k % len(shards)].file, 0, min(4096, shards[k % len(shards)].bytes))
             for k in range(LATENCY_PROBES)]
    rng = np.random.default_rng(0)
    if remote.cache is not None:
        pieces = [(s.file, start, min(FILL_PIECE, s.bytes - start))
                  for s in shards for start in range(0, s.bytes, FILL_PIECE)]
        round_ = [pieces[int(k)] for k in rng.permutation(len(pieces))[:FILL_BUDGET // FILL_PIECE]]
    else:
        places = [dataset.reader.locate(int(i)) for i in rng.permutation(len(dataset))[:remote.store.max_in_flight]]
        round_ = [(shard.name, offset, size) for shard, offset, size in places]
    return measure_store(remote.store, small, round_, record)


def objects_store_speed(objects: StoreObjects, in_flight: int) -> StoreSpeed:
    """The store behind small objects read one GET each, ``in_flight`` at once (the loader's workers)."""
    order = np.random.default_rng(0).permutation(len(objects))
    small = [(objects.samples[int(i)][0], 0, min(4096, objects.sizes[int(i)])) for i in order[:LATENCY_PROBES]]
    round_ = [(objects.samples[int(i)][0], 0, objects.sizes[int(i)]) for i in order[:max(1, in_flight)]]
    return measure_store(objects.store, small, round_, objects.mean_size())
