"""Repeats of one contender → one row: the median rate, its range, and ratios paired repeat by repeat.

``run_all`` runs the contenders interleaved (A, B, C, A, B, C, ...), so repeat ``k`` of every row
saw the same moment of the machine; a ratio is therefore taken within each repeat and the median
of those is reported, as ``bench/load_bench.py`` does.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from fastload.benchmark.result import RunResult

_WORST_FIRST = ("failed", "skipped", "partial", "ok")


def combine(results: Sequence[RunResult]) -> RunResult:
    """One row from a contender's repeats: median rates, min and max, summed counts; the status
    (and its note) of the worst repeat, so a failure in any repeat shows."""
    if len(results) == 1:
        return results[0]
    worst = min(results, key=lambda r: _WORST_FIRST.index(r.status))
    measured = [r for r in results if r.status in ("ok", "partial") and r.samples and r.seconds > 0]
    rates = [r.samples_per_s for r in measured]
    waits = [r.wait_fraction for r in measured if r.wait_fraction is not None]
    steps = [r.step_ms for r in measured if r.step_ms is not None]
    peaks = [r.peak_rss_mb for r in results if r.peak_rss_mb is not None]
    row = replace(results[0], status=worst.status, note=worst.note,
                  samples=sum(r.samples for r in results), batches=sum(r.batches for r in results),
                  seconds=sum(r.seconds for r in results), loader=results[-1].loader,
                  samples_per_s=statistics.median(rates) if rates else 0.0,
                  mb_per_s=statistics.median(r.mb_per_s for r in measured) if measured else 0.0,
                  wait_fraction=statistics.median(waits) if waits else None,
                  step_ms=statistics.median(steps) if steps else None,
                  peak_rss_mb=max(peaks) if peaks else None,
                  median=statistics.median(rates) if rates else None,
                  min=min(rates) if rates else None, max=max(rates) if rates else None,
                  per_repeat=rates, per_repeat_mb_s=[r.mb_per_s for r in measured])
    return row


def paired_ratio(row: RunResult, ref: RunResult, attr: str = "samples_per_s") -> float | None:
    """``row`` over ``ref`` on ``attr`` (``samples_per_s`` or ``mb_per_s``): the median over
    repeats of each repeat's own ratio; rows without per-repeat rates compare their medians."""
    mine = row.per_repeat if attr == "samples_per_s" else row.per_repeat_mb_s
    theirs = ref.per_repeat if attr == "samples_per_s" else ref.per_repeat_mb_s
    pairs = [a / b for a, b in zip(mine, theirs) if b > 0]  # only a last, cut-short repeat is missing
    if pairs:
        return statistics.median(pairs)
    base = getattr(ref, attr)
    return getattr(row, attr) / base if base else None
