"""Loader settings: "auto" num_workers / prefetch_factor / pin_memory resolved once, with reasons.

What "auto" resolves to is a pure function of facts that do not change between two runs of a
script on one machine: the dataset's type, the cores this process may use, the arguments given,
CUDA, and ``FASTLOAD_NUM_WORKERS``. It never calls the dataset (a Dataset that opens its file
lazily in ``__getitem__`` would open it in the parent, before the fork) and never times anything;
``tune`` measures, when asked. For a Dataset of the user's own it is torch's default (0 worker
processes): workers would pickle it and its samples, which torch's default never asks of them.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.utils.data import Dataset

from fastload.config import available_cpus, env_int

Mode = Literal["main", "threads", "processes", "ray"]

THREAD_DECODE_CORES = 2
"""Up to this many cores the built-in pipeline decodes in threads; above it, in worker processes.

Measured (bench/HISTORY.md, "Keeping a real GPU fed"): on 2 cores threads lead (no pickling, no
shared-memory copies); from 4 cores up the decode threads' share of the GIL slows the training
loop's own thread (its kernel launches) and processes lead: under a ResNet-18-shaped step on a
GPU, 1.85× torch against threads' 1.72× at 4 cores, 1.32× against 1.10× at 8, 1.06× against
0.69× at 16."""


@dataclass(frozen=True)
class LoaderSettings:
    """What the loader runs with. ``mode``: decode in the main process (``main``), in a background
    thread with a decode thread pool (``threads``), in ``num_workers`` worker processes, or in
    ``num_workers`` decode actors on a Ray cluster (``ray``)."""

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
        lines.append(f"  to use them: fastload.DataLoader(..., {', '.join(f'{k}={v!r}' for k, v in self.as_kwargs().items())})")
        # each reason wrapped to a terminal's 100 columns, its continuation indented under it
        return "\n".join(textwrap.fill(line, 100, subsequent_indent="    ", break_long_words=False,
                                        break_on_hyphens=False) for line in lines)

    def as_kwargs(self) -> dict[str, Any]:
        """These settings as DataLoader arguments: ``DataLoader(ds, **settings.as_kwargs())`` runs with them."""
        return {"mode": self.mode, "num_workers": self.num_workers, "prefetch_factor": self.prefetch_factor,
                "pin_memory": self.pin_memory}


def uses_builtin_pipeline(dataset: Dataset) -> bool:
    from fastload.dataset import PackedDataset
    from fastload.samples.mixed import MixedDataset

    return isinstance(dataset, (PackedDataset, MixedDataset)) and dataset.pipeline is not None


def resolve_settings(dataset: Dataset, *, batch_size: int | None, num_workers: int | str,
                     prefetch_factor: int | None | str, pin_memory: bool | str,
                     device: torch.device | None, timeout: float = 0,
                     mode: Mode | Literal["auto"] = "auto") -> LoaderSettings:
    """Every "auto" argument resolved here and nowhere else; explicit values are kept as given."""
    reasons: dict[str, str] = {}
    cores = available_cpus()
    cuda = torch.cuda.is_available()
    override = env_int("FASTLOAD_NUM_WORKERS")
    if mode != "auto":
        workers = _workers_for(mode, num_workers, cores)
        reasons["num_workers"] = f"{workers}: mode={mode!r} was given"
    elif num_workers != "auto":
        workers = num_workers  # type: ignore[assignment]  (torch validates it, with its own messages)
        mode = "processes" if isinstance(workers, int) and workers > 0 else "main"
        reasons["num_workers"] = "given"
    elif override is not None:
        workers, mode = max(override, 0), "processes" if override > 0 else "main"
        reasons["num_workers"] = f"{workers}: FASTLOAD_NUM_WORKERS={override} in the environment"
    elif uses_builtin_pipeline(dataset) and timeout > 0:
        workers, mode = min(cores, 8), "processes"
        reasons["num_workers"] = (f"{workers}: one per available core ({cores}); timeout={timeout} "
                                  "was given, and only worker processes can time out")
    elif uses_builtin_pipeline(dataset) and cores > THREAD_DECODE_CORES:
        workers, mode = cores, "processes"
        reasons["num_workers"] = (f"{workers}: one worker process per available core ({cores}); above "
                                  f"{THREAD_DECODE_CORES} cores decode threads would hold the GIL the "
                                  "training loop needs (set FASTLOAD_NUM_WORKERS or mode= to choose)")
    elif uses_builtin_pipeline(dataset):
        workers, mode = 0, "threads"
        reasons["num_workers"] = (f"0 worker processes: {cores} cores (at most {THREAD_DECODE_CORES}) decode "
                                  "each batch in threads "
                                  "(Pillow releases the GIL), with no pickling or shared-memory copies, "
                                  "in a background thread that stays ahead of the loop")
    else:
        workers, mode = 0, "main"
        reasons["num_workers"] = ("0: torch's default for a Dataset of your own, whose samples may not "
                                  "pickle or may need its files opened per process; pass num_workers "
                                  "(or run fastload.tune) to use worker processes")
    if prefetch_factor == "auto":
        prefetch = 2 if workers else None
        reasons["prefetch_factor"] = ("2 batches per worker (enough to hide per-batch jitter)"
                                      if workers else "None: no worker processes")
    else:
        prefetch = prefetch_factor  # type: ignore[assignment]
        reasons["prefetch_factor"] = "given"
    if pin_memory == "auto":
        # Batches bound for the GPU: fastload's device=, or the built-in pipeline's images. A
        # Dataset of your own without device= gets torch's default, False, as torch's loader would.
        wants_cuda = device.type == "cuda" if device is not None else uses_builtin_pipeline(dataset)
        pin = cuda and wants_cuda
        if pin:
            reasons["pin_memory"] = "True: CUDA is available; pinned pages copy to the GPU asynchronously"
        elif cuda and device is None:
            reasons["pin_memory"] = ("False: torch's default for a Dataset of your own; pass pin_memory=True "
                                     "or device='cuda' to pin its batches")
        else:
            reasons["pin_memory"] = "False: no CUDA device to copy to"
    else:
        pin = bool(pin_memory)
        reasons["pin_memory"] = "given"
    return LoaderSettings(num_workers=workers, prefetch_factor=prefetch, pin_memory=pin, mode=mode,
                          prefetch_batches=2 if mode == "threads" else 0, reasons=reasons)


def _workers_for(mode: str, num_workers: int | str, cores: int) -> int:
    """The worker processes of an explicit ``mode``; a num_workers that contradicts it is refused."""
    if mode not in ("main", "threads", "processes", "ray"):
        raise ValueError(f"mode={mode!r}: choose 'auto', 'main', 'threads', 'processes' or 'ray'")
    if mode == "ray":  # the cluster's size is not a fact of this machine: the user says
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
            raise ValueError(f"mode='ray' needs num_workers >= 1 (the decode actors to start on the "
                             f"cluster), not {num_workers!r}")
        return num_workers
    if mode == "processes":
        if num_workers == "auto":
            return min(cores, 8)
        if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
            raise ValueError(f"mode='processes' needs num_workers >= 1 (or 'auto'), not {num_workers!r}")
        return num_workers
    if num_workers not in ("auto", 0) or isinstance(num_workers, bool):
        raise ValueError(f"mode={mode!r} decodes in this process: num_workers must be 0 or 'auto', "
                         f"not {num_workers!r} (or pass mode='processes')")
    return 0
