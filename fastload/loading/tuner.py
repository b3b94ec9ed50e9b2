"""``fastload.tune``: a short grid of loader settings measured on the real data and machine.

Timing lives here, called on purpose; what "auto" resolves to (``fastload.loading.settings``) never times.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from torch.utils.data import Dataset

from fastload.config import available_cpus
from fastload.loading.loader import DataLoader
from fastload.loading.stats import batch_size_of
from fastload.loading.settings import THREAD_DECODE_CORES, LoaderSettings, uses_builtin_pipeline


def tune(dataset: Dataset, *, batch_size: int, batches: int = 6, candidates: list[dict[str, Any]] | None = None,
         **loader_kwargs: Any) -> LoaderSettings:
    """Measure a short grid of settings on the real data and machine; return the fastest.

    Each candidate runs ``batches`` batches after one warm-up batch and the batches its loader
    holds ready by then; the result's reasons record every candidate's measured samples/s.
    """
    if candidates is None:
        candidates = default_candidates(dataset, available_cpus())
    results: list[tuple[float, LoaderSettings]] = []
    for candidate in candidates:
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, **loader_kwargs, **candidate)
        settings = loader.settings
        ahead = settings.num_workers * (settings.prefetch_factor or 0) + settings.prefetch_batches
        results.append((_measure(loader, batches, ahead), settings))
    rate, best = max(results, key=lambda r: r[0])
    table = "; ".join(f"{s.mode}/{s.num_workers}w/pf{s.prefetch_factor}: {r:.0f}/s" for r, s in results)
    return replace(best, reasons={**best.reasons, "tune": f"best of {len(results)}: {table}"})


def default_candidates(dataset: Dataset, cores: int) -> list[dict[str, Any]]:
    """tune's grid: main, auto, the decode threads when auto is not them, then 1 and ``cores``
    worker processes with prefetch 2 and 4."""
    candidates: list[dict[str, Any]] = [{"num_workers": 0}, {"num_workers": "auto"}]
    if uses_builtin_pipeline(dataset) and cores > THREAD_DECODE_CORES:  # auto is processes there
        candidates.append({"mode": "threads", "num_workers": 0})
    return candidates + [{"num_workers": w, "prefetch_factor": p} for w in sorted({1, cores}) for p in (2, 4)]


def _measure(loader: Any, batches: int, ahead: int = 0) -> float:
    """Samples/s over ``batches`` batches after one warm-up batch and ``ahead`` more, the most
    the loader can have ready by then (workers × prefetch_factor, or the prefetch thread's);
    counting those would credit a deep queue with batches made during the warm-up (a short
    grid then picked 2 workers × 4 at "1623/s" that ran at 1328/s against auto's 1606/s).
    Epochs repeat when the dataset is shorter (0.0 only for a loader that yields nothing)."""

    def endless() -> Iterator[Any]:
        while True:
            empty = True
            for batch in loader:
                empty = False
                yield batch
            if empty:
                return

    it = endless()
    try:
        next(it)  # warm-up: worker start, page cache, thread pools
        for _ in range(ahead):
            next(it)  # made while the warm-up ran: the queue is now down to what is made from here
        count, started = 0, time.perf_counter()
        for _ in range(batches):
            batch = next(it)
            count += len(batch[1]) if isinstance(batch, (tuple, list)) else batch_size_of(batch)
        return count / (time.perf_counter() - started)
    except StopIteration:
        return 0.0
    finally:
        it.close()
