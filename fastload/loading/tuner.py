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
         step: Step = None, repeats: int = 3, progress: bool | None = None, **loader_kwargs: Any) -> LoaderSettings:
    """Measure a short grid of settings on the real data and machine; return the fastest, or
    auto's settings when nothing is known faster.

    Each candidate runs ``repeats`` times, interleaved with the others (A, B, C, A, B, C, ...), each
    time ``batches`` batches after one warm-up batch and the batches its loader holds ready by
    then. One is chosen over auto's settings only when every run of it beat every run of the rest,
    on a machine others did not keep busy meanwhile (:mod:`fastload.loading.tune_choice`); else the
    result is auto's, and its reasons say why ("too noisy to choose"). The reasons record every
    candidate's median and range and the machine's load.

    Args:
        step: the training step, run after each batch: ``fn(images, labels)`` (CUDA is synchronised
            after it), or seconds to sleep (a GPU step leaves the CPU free). Rates are then the
            training loop's, so decode that overlaps the step counts. Without one the grid is
            timed on data alone, and ``mode='main'`` (which decodes between steps, never during
            them) is not chosen while a candidate that decodes in the background delivered.
        repeats: runs of each candidate (at least 1; with one, no spread is known).
        progress: a progress line on stderr (None: when stderr is a terminal).
    """
    # Measuring tools load when measuring, never with `import fastload`.
    from fastload.benchmark.machine_load import LoadWatch
    from fastload.benchmark.monitor import Progress
    from fastload.loading.tune_choice import Measured, choose, label

    if repeats < 1:
        raise ValueError(f"repeats={repeats}: must be at least 1")
    after = _step(step)
    if candidates is None:
        candidates = default_candidates(dataset, available_cpus())
    auto = DataLoader(dataset, batch_size=batch_size, shuffle=True, **loader_kwargs).settings
    measured: list[Measured] = []
    shown, watch = Progress(progress), LoadWatch()
    try:
        for rep in range(repeats):
            for k, candidate in enumerate(candidates):
                loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, **loader_kwargs, **candidate)
                settings = loader.settings
                if rep == 0:
                    measured.append(Measured(settings, candidate, []))
                shown.note(f"tune [{rep * len(candidates) + k + 1}/{repeats * len(candidates)}] {label(settings)}")
                ahead = settings.num_workers * (settings.prefetch_factor or 0) + settings.prefetch_batches
                measured[k].rates.append(_measure(loader, batches, ahead, after))
                del loader
    finally:
        shown.finish()
    load = watch.stop()
    choice = choose(measured, auto, main_allowed=after is not None,
                    busy=load.others() if load is not None and load.busy else None)
    best = choice.measured.settings if choice.measured is not None else auto
    table = "; ".join(f"{m.name}: {m.spread.text()}" for m in measured)
    how = (f"under a {step * 1e3:g} ms stand-in step (slept)" if isinstance(step, (int, float)) and step else
           "under your training step" if after is not None else
           "on data alone, no training step given: mode='main' decodes between steps, not during them, so "
           "it is not chosen on data alone; pass step= (the CLI: --model or --model-step-ms) to weigh it")
    reasons = {**best.reasons, **(_chosen(best, choice.measured.candidate) if choice.measured else {}),
               "tune": choice.why,
               "measured": f"samples/s, the median of {repeats} runs (slowest–fastest): {table}",
               "training step": f"{batches} timed batches per run, {how}",
               "machine load": load.text() if load is not None else "not measured (no /proc here)"}
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
