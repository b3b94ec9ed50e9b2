"""Loader statistics: samples/s, MB/s and how much of the loop's time went to waiting for data."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class LoaderStats:
    """Counters kept by the loader's iterators: every epoch since the loader was made, or since
    the last ``loader.stats(reset=True)``."""

    samples: int = 0
    batches: int = 0
    bytes: int = 0
    wait_s: float = 0.0  # time the loop spent inside next(), waiting for a batch
    started: float | None = None
    last: float | None = None
    skipped: int = 0  # records on_error="skip" left out of the delivered batches
    pixel_hits: int = 0  # the dataset's pixel cache: records cropped from stored pixels,
    pixel_misses: int = 0  # decoded from their bytes,
    pixel_stored: int = 0  # of which stored for the next epochs
    tail: Any = None  # a backend with counts of its own (``counts()``, ``reset_counts()``), kept across resets

    def reset(self) -> None:
        """Start counting again (in place: a running iterator records into this object)."""
        tail = self.tail
        self.__init__()  # type: ignore[misc]
        self.tail = tail
        if tail is not None:
            tail.reset_counts()

    def record(self, samples: int, nbytes: int, waited: float, skipped: int = 0) -> None:
        now = time.perf_counter()
        if self.started is None:
            self.started = now - waited
        self.samples += samples
        self.skipped += skipped
        self.batches += 1
        self.bytes += nbytes
        self.wait_s += waited
        self.last = now

    def record_pixels(self, counts: tuple[int, int, int]) -> None:
        """A batch's pixel cache counts: ``(hits, misses, stored)``."""
        self.pixel_hits += counts[0]
        self.pixel_misses += counts[1]
        self.pixel_stored += counts[2]

    def pixel_figures(self, held_bytes: int) -> dict[str, float]:
        """``loader.stats()["pixel_cache"]``: the counts, the share of hits, and ``held_bytes``
        (what the dataset's stored pixels take on disk)."""
        seen = self.pixel_hits + self.pixel_misses
        return {"hits": self.pixel_hits, "misses": self.pixel_misses, "stored": self.pixel_stored,
                "hit_rate": self.pixel_hits / seen if seen else 0.0, "bytes": held_bytes}

    def as_dict(self) -> dict[str, float]:
        wall = (self.last - self.started) if self.started is not None and self.last is not None else 0.0
        return {
            "samples": self.samples,
            "batches": self.batches,
            "seconds": wall,
            "samples_per_s": self.samples / wall if wall > 0 else 0.0,
            "mb_per_s": self.bytes / 1e6 / wall if wall > 0 else 0.0,
            "wait_fraction": min(1.0, self.wait_s / wall) if wall > 0 else 0.0,
            "skipped": self.skipped,
            **(self.tail.counts() if self.tail is not None else {}),
        }


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.size(0)) if batch.dim() else 1  # size(0), not shape: a nested tensor has no shape
    if isinstance(batch, (tuple, list)) and batch:
        return batch_size_of(batch[0])
    if isinstance(batch, dict) and batch:
        return batch_size_of(next(iter(batch.values())))
    return 1
