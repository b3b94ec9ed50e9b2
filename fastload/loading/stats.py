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
