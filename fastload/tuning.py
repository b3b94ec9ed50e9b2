"""Loader settings: "auto" num_workers / prefetch_factor / pin_memory resolved once, with reasons."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from fastload.config import available_cpus

Mode = Literal["main", "threads", "processes"]
# Below this per-sample cost, worker processes cost more in pickling and IPC than they save.
CHEAP_SAMPLE_S = 100e-6


@dataclass(frozen=True)
class LoaderSettings:
    """What the loader runs with. ``mode``: decode in the main process (``main``), in a background
    thread with a decode thread pool (``threads``), or in ``num_workers`` worker processes."""

    num_workers: int
    prefetch_factor: int | None
    pin_memory: bool
    mode: Mode
    prefetch_batches: int  # threads mode: batches decoded ahead by the background thread
    reasons: dict[str, str] = field(default_factory=dict, compare=False)

    def __str__(self) -> str:
        lines = [f"LoaderSettings(mode={self.mode}, num_workers={self.num_workers}, "
                 f"prefetch_factor={self.prefetch_factor}, pin_memory={self.pin_memory}"
                 + (f", prefetch_batches={self.prefetch_batches})" if self.mode == "threads" else ")")]
        lines += [f"  {name}: {why}" for name, why in self.reasons.items()]
        return "\n".join(lines)


def uses_builtin_pipeline(dataset: Dataset) -> bool:
    from fastload.dataset import PackedDataset

    return isinstance(dataset, PackedDataset) and dataset.pipeline is not None


def sample_cost(dataset: Dataset, batch_size: int, budget_s: float = 0.2) -> float | None:
    """Seconds per sample for a few samples read in this process (None: cannot be measured)."""
    try:
        n = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return None
    if n == 0:
        return None
    count, started = 0, time.perf_counter()
    try:
        if uses_builtin_pipeline(dataset):
            # One decode thread, a handful of records spread over the dataset.
            from fastload.epoch_sampler import SampleKey

            decoder = dataset.decode_threads
            dataset.decode_threads, dataset._decoder = 1, None
            try:
                keys = [SampleKey(int(i * n // 8), 0, 0) for i in range(min(8, n))]
                dataset.__getitems__(keys)
                count = len(keys)
            finally:
                dataset.decode_threads, dataset._decoder = decoder, None
        else:
            # The probe's random draws (augmentations) must not shift what the loop will see.
            states = random.getstate(), np.random.get_state()
            try:
                with torch.random.fork_rng(devices=[]):
                    dataset[0]  # warm-up: first-call costs (imports, file opens) are not per sample
                    started = time.perf_counter()
                    for i in range(min(n, batch_size, 16)):
                        dataset[i]
                        count += 1
                        if time.perf_counter() - started > budget_s:
                            break
            finally:
                random.setstate(states[0])
                np.random.set_state(states[1])
    except Exception:
        return None  # the loader will raise it, with torch's own message, when it reads the sample
    return (time.perf_counter() - started) / max(count, 1)


def resolve_settings(dataset: Dataset, *, batch_size: int | None, num_workers: int | str,
                     prefetch_factor: int | None | str, pin_memory: bool | str,
                     device: torch.device | None, timeout: float = 0) -> LoaderSettings:
    """Every "auto" argument resolved here and nowhere else; explicit values are kept as given."""
    reasons: dict[str, str] = {}
    cores = available_cpus()
    cuda = torch.cuda.is_available()
    mode: Mode
    if num_workers != "auto":
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0:
            raise ValueError(f"num_workers={num_workers!r}: must be a non-negative integer or 'auto'")
        workers = num_workers
        mode = "processes" if workers else "main"
        reasons["num_workers"] = "given"
    elif isinstance(dataset, IterableDataset):
        if timeout > 0:
            raise ValueError(f"timeout={timeout} needs worker processes, and num_workers='auto' keeps an "
                             "IterableDataset in the main process (workers would duplicate it unless it "
                             "splits itself by get_worker_info()); pass num_workers yourself, or timeout=0")
        workers, mode = 0, "main"
        reasons["num_workers"] = ("0: an IterableDataset that does not split itself by "
                                  "get_worker_info() would be duplicated by workers; set it yourself")
    elif timeout > 0:
        workers, mode = min(cores, 8), "processes"
        reasons["num_workers"] = (f"{workers}: one per available core ({cores}); timeout={timeout} "
                                  "was given, and only worker processes can time out")
    elif uses_builtin_pipeline(dataset):
        workers, mode = 0, "threads"
        reasons["num_workers"] = (f"0 worker processes: {cores} cores decode each batch in threads "
                                  "(Pillow releases the GIL), with no pickling or shared-memory copies, "
                                  "in a background thread that stays ahead of the loop")
    else:
        cost = sample_cost(dataset, batch_size or 1)
        if cost is not None and cost < CHEAP_SAMPLE_S:
            workers, mode = 0, "main"
            reasons["num_workers"] = f"0: a sample costs {cost * 1e6:.0f} us, less than a worker's IPC"
        else:
            workers, mode = min(cores, 8), "processes"
            measured = f"a sample costs {cost * 1e3:.2f} ms" if cost is not None else "cost not measurable"
            reasons["num_workers"] = f"{workers}: one per available core ({cores}); {measured}"
    if prefetch_factor == "auto":
        prefetch = 2 if workers else None
        reasons["prefetch_factor"] = ("2 batches per worker (enough to hide per-batch jitter)"
                                      if workers else "None: no worker processes")
    else:
        prefetch = prefetch_factor  # type: ignore[assignment]
        reasons["prefetch_factor"] = "given"
    if pin_memory == "auto":
        wants_cuda = device is None or device.type == "cuda"
        pin = cuda and wants_cuda
        reasons["pin_memory"] = ("True: CUDA is available; pinned pages copy to the GPU asynchronously"
                                 if pin else "False: no CUDA device to copy to")
    else:
        pin = bool(pin_memory)
        reasons["pin_memory"] = "given"
    return LoaderSettings(num_workers=workers, prefetch_factor=prefetch, pin_memory=pin, mode=mode,
                          prefetch_batches=2 if mode == "threads" else 0, reasons=reasons)


def tune(dataset: Dataset, *, batch_size: int, batches: int = 6, candidates: list[dict[str, Any]] | None = None,
         **loader_kwargs: Any) -> LoaderSettings:
    """Measure a short grid of settings on the real data and machine; return the fastest.

    Each candidate runs ``batches`` batches after one warm-up batch and the batches its loader
    holds ready by then; the result's reasons record every candidate's measured samples/s.
    """
    from fastload.loader import DataLoader

    cores = available_cpus()
    if candidates is None:
        candidates = [{"num_workers": 0}, {"num_workers": "auto"}]
        candidates += [{"num_workers": w, "prefetch_factor": p}
                       for w in sorted({1, cores}) for p in (2, 4)]
    results: list[tuple[float, LoaderSettings]] = []
    for candidate in candidates:
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, **loader_kwargs, **candidate)
        settings = loader.settings
        ahead = settings.num_workers * (settings.prefetch_factor or 0) + settings.prefetch_batches
        results.append((_measure(loader, batches, ahead), settings))
    rate, best = max(results, key=lambda r: r[0])
    table = "; ".join(f"{s.mode}/{s.num_workers}w/pf{s.prefetch_factor}: {r:.0f}/s" for r, s in results)
    return replace(best, reasons={**best.reasons, "tune": f"best of {len(results)}: {table}"})


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


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, (tuple, list)) and batch:
        return batch_size_of(batch[0])
    if isinstance(batch, dict) and batch:
        return batch_size_of(next(iter(batch.values())))
    return 1
