"""The verdict's model of a loader: what each stage group (I/O, CPU, transfer) can deliver.

A stage that takes ``s`` seconds per sample and runs ``p`` at once can deliver ``p / s``
samples/s (CPU stages at most one per core); a group's load is the sum of its stages' ``s / p``.
With each stage's spread over its timing rounds, a group's load has a spread too: the verdict
names a bottleneck only where that spread allows (:func:`fastload.benchmark.spread.differs`).
"""

from __future__ import annotations

from typing import Protocol

from fastload.benchmark.spread import Spread

GROUPS = ("io", "cpu", "transfer")


class StageLike(Protocol):
    name: str
    kind: str  # "io", "cpu" or "transfer"
    seconds_per_sample: float
    parallel: int


def parallel_of(stage: StageLike, cores: int) -> int:
    """How many of ``stage`` run at once: as the loader runs them, CPU stages at most one per core."""
    p = max(1, int(stage.parallel))
    return min(p, max(1, cores)) if stage.kind == "cpu" else p


def group_load(stages: list[StageLike], cores: int, group: str) -> float:
    """Seconds per sample the stages of ``group`` cost the loader (the median timings)."""
    return sum(s.seconds_per_sample / parallel_of(s, cores) for s in stages if s.kind == group)


def group_spread(stages: list[StageLike], cores: int, group: str) -> Spread:
    """A group's load as its stages' timing rounds allow: the sums of their lows, medians and highs
    (a stage timed without rounds, as the transfer estimate is, adds its one value to each)."""
    low = mid = high = 0.0
    for s in stages:
        if s.kind != group:
            continue
        p = parallel_of(s, cores)
        lo, hi = getattr(s, "low", None), getattr(s, "high", None)
        low += (s.seconds_per_sample if lo is None else lo) / p
        mid += s.seconds_per_sample / p
        high += (s.seconds_per_sample if hi is None else hi) / p
    return Spread(mid, low, high)
