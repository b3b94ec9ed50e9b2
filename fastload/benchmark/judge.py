"""The verdict about one loader: run it (with the model step), time each stage alone, measure the ceilings."""

from __future__ import annotations

import functools
import importlib
from dataclasses import replace
from typing import Any

import torch

from fastload.benchmark.ceilings import ceilings
from fastload.benchmark.far import StoreObjects, StoreSpeed, objects_store_speed, packed_store_speed
from fastload.benchmark.inputs import Inputs
from fastload.benchmark.loader_under_test import loader_spec, packed_dataset, sequential
from fastload.benchmark.machine_load import LoadWatch
from fastload.benchmark.monitor import Progress
from fastload.benchmark.pixel_row import pixel_cache_need
from fastload.benchmark.report import BenchReport
from fastload.benchmark.runs import Limits, ModelStep, RunResult, run_all
from fastload.benchmark.stages import PackedProbe, Probe, Stage, make_cold, measure_stages
from fastload.benchmark.training import Headspace, step_device
from fastload.benchmark.verdict import Evidence, diagnose
from fastload.config import available_cpus


def diagnose_into(report: BenchReport, inputs: Inputs, batch_size: int, image_size: int,
                  duration: float, samples: int | None, cold: bool, model_step: ModelStep,
                  num_workers: int | None, budget: float, shown: Progress,
                  dataset: torch.utils.data.Dataset | None = None, show_stages: bool = True,
                  headspace: Headspace | None = None, repeats: int = 1, watch: LoadWatch | None = None) -> None:
    """Run SRC's loader with the model step (``repeats`` times), then each stage alone; add the
    verdict to ``report``."""
    cores = available_cpus()
    if dataset is None:
        dataset = (inputs.baseline if inputs.src_kind == "folder" else
                   packed_dataset(inputs.packed[0], image_size, inputs))
    spec, probe = loader_spec(dataset, batch_size, num_workers, cores, step_device(model_step))
    if cold:
        def prepare() -> None:
            make_cold(probe, range(len(probe)))
        spec.prepare = prepare
    runs, interrupted = run_all([spec], Limits(duration, samples, one_epoch=cold),
                                model_step=model_step, progress=shown, keep_loaders=True, repeats=repeats)
    run = runs[0]
    report.runs.append(run)
    report.interrupted |= interrupted
    if interrupted or run.status in ("skipped", "failed"):
        return
    loader, run.loader = run.loader, None
    judge(report, inputs, probe, loader, run, batch_size, image_size, cold, model_step, budget, shown,
          show_stages, headspace, watch)


def judge(report: BenchReport, inputs: Inputs, probe: Probe, loader: Any, run: RunResult,
          batch_size: int, image_size: int, cold: bool, model_step: ModelStep, budget: float,
          shown: Progress, show_stages: bool, headspace: Headspace | None = None,
          watch: LoadWatch | None = None) -> None:
    """Each stage of ``loader`` alone and the machine's ceilings → the verdict about ``run``'s
    loader (its stages stay in the report when ``show_stages``); with a model step, ``run`` ran
    under it, and ``headspace`` (when measured) is what the step takes alone. ``watch``: the
    machine's load since the measuring began (a busy machine makes the verdict a hint)."""
    cores = available_cpus()
    parallel = _parallelism(loader, cores)
    pinned = bool(getattr(loader, "pin_memory", False))
    del loader  # built, never iterated: only its settings were needed
    shown.note("timing each stage alone")
    stages, sample = measure_stages(probe, batch_size=batch_size, cold=cold, budget=budget)
    for stage in stages:
        stage.parallel = parallel.get(stage.name, parallel["decode"])
    store = _store_speed(probe, parallel["read"])
    if store is not None:  # the read stage is the store's: its round trips and bandwidth
        shown.note("measuring the object store")
        stages[0] = store.stage("as this loader fetches")
    shown.note("measuring the machine's ceilings")
    report.ceilings = ceilings(probe, sample, cores=cores, cold=cold, budget=budget, image_size=image_size,
                               batch_size=batch_size, sequential_files=sequential(inputs, cold))
    if store is not None:
        report.ceilings.update(store.as_dict())
    rate = report.ceilings["h2d_pinned_mb_s" if pinned else "h2d_pageable_mb_s"]
    if rate:
        stages.append(Stage("transfer", "transfer", 3 * image_size**2 / (rate * 1e6)))
    if show_stages:
        report.stages = stages
    report.load = watch.stop() if watch is not None else None
    verdict = diagnose(Evidence(
        stages, cores, batch_size, "packed" if isinstance(probe, PackedProbe) else "folder",
        loader_rate=run.samples_per_s or None,
        wait_fraction=run.wait_fraction if model_step else None,
        model_step_s=_step_seconds(model_step, run),
        headspace_rate=headspace.samples_per_s if headspace is not None and headspace.steps else None,
        reduced_decode=isinstance(probe, PackedProbe) and probe.pipeline is not None,
        reduced_decode_s=1.0 / reduced if (reduced := report.ceilings["decode_reduced_per_core"]) else None,
        pinned=pinned if rate else None, dali_installed=_dali_installed(),
        store_bound=store.bound if store else None, store_latency_s=store.latency_s if store else None,
        store_mb_s=store.mb_s if store else None, cached=_cached(probe),
        dataset_bytes=_dataset_bytes(probe), cache_limit=_cache_limit(probe), cuda=torch.cuda.is_available(),
        nvimgcodec_installed=torch.cuda.is_available() and _importable("nvidia.nvimgcodec"),
        machine_busy=report.load is not None and report.load.busy,
        pixel_cache=pixel_cache_need(probe.dataset, image_size) if isinstance(probe, PackedProbe) else None))
    report.verdict = replace(verdict, loader=run.name.removeprefix("doctor: "))


@functools.cache
def _dali_installed() -> bool:
    """Whether ``import nvidia.dali`` works here (the install advice is only for when it fails)."""
    return _importable("nvidia.dali")


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:  # not installed, or installed but broken (CUDA libraries missing, ...)
        return False
    return True


def _step_seconds(model_step: ModelStep, run: RunResult) -> float | None:
    """The stand-in step's length: as given, or for a callable, the loop's time not spent waiting."""
    if not model_step:
        return None
    if not callable(model_step):
        return float(model_step)
    if run.step_ms is not None:
        return run.step_ms / 1e3
    busy = run.seconds * (1.0 - (run.wait_fraction or 0.0))
    return busy / run.batches if run.batches else None


def _parallelism(loader: Any, cores: int) -> dict[str, int]:
    """How many of each stage the loader runs at once (a worker runs a sample's stages in turn)."""
    settings = getattr(loader, "settings", None)
    if settings is not None and settings.mode == "threads":
        threads = getattr(loader.dataset, "decode_threads", None) or cores
        return {"read": 1, "decode": threads, "transform": threads, "collate": 1}
    workers = max(1, int(getattr(loader, "num_workers", 0)))
    return {"read": workers, "decode": workers, "transform": workers, "collate": workers}


def _store_speed(probe: Probe, reads_at_once: int) -> StoreSpeed | None:
    """What the object store behind ``probe`` allows, as its loader fetches (None: not in a store)."""
    dataset = getattr(probe, "dataset", None)
    if isinstance(dataset, StoreObjects):
        return objects_store_speed(dataset, reads_at_once)
    if isinstance(probe, PackedProbe) and dataset.reader.remote is not None:
        return packed_store_speed(dataset)
    return None


def _cached(probe: Probe) -> bool:
    """Whether a dataset in a store is read through a node cache."""
    reader = getattr(getattr(probe, "dataset", None), "reader", None)
    remote = getattr(reader, "remote", None)
    return remote is None or remote.cache is not None


def _cache_limit(probe: Probe) -> int | None:
    """The bytes the node cache of a dataset in a store may hold (None: none)."""
    remote = getattr(getattr(getattr(probe, "dataset", None), "reader", None), "remote", None)
    cache = getattr(remote, "cache", None)
    return cache.limit if cache is not None else None


def _dataset_bytes(probe: Probe) -> int | None:
    dataset = getattr(probe, "dataset", None)
    if isinstance(dataset, StoreObjects):
        return sum(dataset.sizes)
    manifest = getattr(dataset, "manifest", None)
    return manifest.total_bytes if manifest is not None else None

