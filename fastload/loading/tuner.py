"""``fastload.tune``: a short grid of loader settings measured on the real data and machine.

Timing lives here, called on purpose; what "auto" resolves to (``fastload.loading.settings``) never times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch
from torch.utils.data import Dataset

from fastload.config import available_cpus
from fastload.loading.loader import DataLoader
from fastload.loading.settings import THREAD_DECODE_CORES, LoaderSettings, uses_builtin_pipeline
from fastload.loading.stats import batch_size_of

Step = Callable[[Any, Any], Any] | float | None
"""A training step tune weighs: your ``fn(images, labels)``, or seconds slept after each batch."""


def tune(dataset: Dataset, *, batch_size: int, batches: int = 6, candidates: list[dict[str, Any]] | None = None,
         step: Step = None, **loader_kwargs: Any) -> LoaderSettings:
    """Measure a short grid of settings on the real data and machine; return the fastest.

    Each candidate runs ``batches`` batches after one warm-up batch and the batches its loader
    holds ready by then; the result's reasons record every candidate's measured samples/s.

    Args:
        step: the training step, run after each batch: ``fn(images, labels)`` (CUDA is synchronised
            after it), or seconds to sleep (a GPU step leaves the CPU free). Rates are then the
            training loop's, so decode that overlaps the step counts. Without one the grid is
            timed on data alone, and ``mode='main'`` (which decodes between steps, never during
            them) is not chosen while a candidate that decodes in the background delivered.
    """
    after = _step(step)
    if candidates is None:
        candidates = default_candidates(dataset, available_cpus())
    results: list[tuple[float, LoaderSettings, dict[str, Any]]] = []
    for candidate in candidates:
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, **loader_kwargs, **candidate)
        settings = loader.settings
        ahead = settings.num_workers * (settings.prefetch_factor or 0) + settings.prefetch_batches
        results.append((_measure(loader, batches, ahead, after), settings, candidate))
    eligible = results if after is not None else [r for r in results if r[1].mode != "main" and r[0] > 0] or results
    _, best, chosen = max(eligible, key=lambda r: r[0])
    table = "; ".join(f"{s.mode}/{s.num_workers}w/pf{s.prefetch_factor}: {r:.0f}/s" for r, s, _ in results)
    how = (f"under a {step * 1e3:g} ms stand-in step (slept)" if isinstance(step, (int, float)) and step else
           "under your training step" if after is not None else
           "on data alone, no training step given: mode='main' decodes between steps, not during them, so "
           "it is not chosen on data alone; pass step= (the CLI: --model or --model-step-ms) to weigh it")
    reasons = {**best.reasons, **_chosen(best, chosen),
               "tune": f"best of {len(results)}: {table}",
               "training step": f"{batches} timed batches per candidate, {how}"}
    return replace(best, reasons=reasons)


def _chosen(best: LoaderSettings, candidate: dict[str, Any]) -> dict[str, str]:
    """The reasons of what the grid set: chosen by tune, not given by the caller."""
    out = {}
    if "num_workers" in candidate or "mode" in candidate:
        mode = f", mode={best.mode!r}" if "mode" in candidate else ""
        auto = f" (auto: {best.reasons.get('num_workers', '')})" if candidate.get("num_workers") == "auto" else ""
        out["num_workers"] = f"{best.num_workers}: chosen by tune{mode}{auto}"
    if "prefetch_factor" in candidate:
        out["prefetch_factor"] = f"{best.prefetch_factor}: chosen by tune"
    return out


def _step(step: Step) -> Callable[[Any], None] | None:
    """``step`` as a call on one batch, CUDA synchronised after it (None: no step)."""
    if step is None:
        return None
    if isinstance(step, (int, float)) and not isinstance(step, bool):
        if step <= 0:
            raise ValueError(f"step={step!r}: seconds must be positive, or pass None for no step")
        return lambda batch: time.sleep(step)
    if not callable(step):
        raise TypeError(f"step={step!r}: pass fn(images, labels) running one training step, or seconds")

    def run(batch: Any) -> None:
        step(*images_and_labels(batch))
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    return run


def default_candidates(dataset: Dataset, cores: int) -> list[dict[str, Any]]:
    """tune's grid: main, auto, the decode threads when auto is not them, then 1 and ``cores``
    worker processes with prefetch 2 and 4."""
    candidates: list[dict[str, Any]] = [{"num_workers": 0}, {"num_workers": "auto"}]
    if uses_builtin_pipeline(dataset) and cores > THREAD_DECODE_CORES:  # auto is processes there
        candidates.append({"mode": "threads", "num_workers": 0})
    return candidates + [{"num_workers": w, "prefetch_factor": p} for w in sorted({1, cores}) for p in (2, 4)]


def _measure(loader: Any, batches: int, ahead: int = 0, step: Callable[[Any], None] | None = None) -> float:
    """Samples/s over ``batches`` batches after one warm-up batch and ``ahead`` more, the most
    the loader can have ready by then (workers × prefetch_factor, or the prefetch thread's);
    counting those would credit a deep queue with batches made during the warm-up (a short
    grid then picked 2 workers × 4 at "1623/s" that ran at 1328/s against auto's 1606/s).
    Epochs repeat when the dataset is shorter (0.0 only for a loader that yields nothing).
    With ``step``, it runs after each batch, warm-up included, and its time counts."""

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
        first = next(it)  # warm-up: worker start, page cache, thread pools
        if step is not None:
            step(first)
        for _ in range(ahead):
            next(it)  # made while the warm-up ran: the queue is now down to what is made from here
        count, started = 0, time.perf_counter()
        for _ in range(batches):
            batch = next(it)
            count += len(batch[1]) if isinstance(batch, (tuple, list)) else batch_size_of(batch)
            if step is not None:
                step(batch)
        return count / (time.perf_counter() - started)
    except StopIteration:
        return 0.0
    finally:
        it.close()


def images_and_labels(batch: Any) -> tuple[Any, Any]:
    """A loader's batch as a training step takes it: ``(images, labels)`` of a tuple batch, or a
    dict batch's ``"image"`` and ``"label"``."""
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    return batch["image"], batch["label"]
