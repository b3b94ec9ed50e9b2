"""``bench`` and ``doctor``: the two measurements, from SRC to a report.

bench:  SRC → inputs (unreadable files left out) → contenders side by side, repeated and
        interleaved (runs) → each stage alone of the loader the user will run → ceilings
        → verdict → report
doctor: SRC → the loader it would use, run with a stand-in training step → each stage alone
        → ceilings → verdict → report
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from fastload.benchmark.baseline import ImageFolderBaseline
from fastload.benchmark.contenders import fastload_rows, raw_rows, settings_text, torch_rows
from fastload.benchmark.far import (
    StoreObjects, StoreSpeed, cache_room, objects_store_speed, packed_store_speed, store_raw_rows, store_rows,
)
from fastload.benchmark.inputs import Inputs, skipped_note
from fastload.benchmark.report import BenchReport
from fastload.benchmark.resolve import resolve
from fastload.benchmark.ceilings import ceilings
from fastload.benchmark.monitor import Progress
from fastload.benchmark.runs import Limits, ModelStep, RunKind, RunResult, RunSpec, run_all
from fastload.benchmark.stages import (
    ImageFolderProbe, PackedProbe, Probe, Stage, make_cold, measure_stages, sample_records, shard_files,
)
from fastload.benchmark.verdict import Evidence, diagnose
from fastload.config import available_cpus


def bench(src: str | os.PathLike[str], packed: Sequence[str | os.PathLike[str]] = (), *,
          batch_size: int = 64, image_size: int = 224, duration: float = 5.0,
          samples: int | None = None, cold: bool = False, stages: bool = False,
          model_step: ModelStep = None, torch_grid: Sequence[tuple[int, int]] | None = None,
          dali: bool = True, include: Collection[RunKind] = ("baseline", "raw", "fastload"),
          fastload_variants: Sequence[dict[str, Any]] = (), only: Collection[str] | None = None,
          temp_pack: int = 2000, work: str | os.PathLike[str] | None = None,
          stage_budget: float = 0.5, measure_ceilings: bool = True, repeats: int = 1,
          progress: bool | None = None, storage_options: dict[str, Any] | None = None) -> BenchReport:
    """Every contender on the same records, side by side; see :mod:`fastload.benchmark`.

    Args:
        src: an image folder, a packed dataset, or a folder whose packed copies are in ``packed``.
        duration, samples: bound each row: timed seconds, and samples after the warm-up.
        cold: drop every file from the page cache before each run (one pass at most per run).
        stages: keep the stage timings behind the verdict in the report (the table shows them).
        model_step: a training step (seconds, or a callable): the loader the verdict is about
            runs once more with it, as ``doctor`` does, for the data-wait fraction.
        torch_grid: ``(num_workers, prefetch_factor)`` pairs for the tuned torch rows
            (default: one worker per core, prefetch 4).
        dali: add the DALI backend row after each fastload row (skipped with a note without DALI).
        include: which kinds of rows to run: ``baseline`` (torch), ``raw`` reads, ``fastload``.
        fastload_variants: extra fastload rows, each with these DataLoader arguments.
        only: run just the rows of these names (e.g. one loader in a fresh process, for its memory).
        temp_pack, work: a folder with no packed copy gets at most this many files packed into
            a temporary dataset under ``work`` (default: the system's temp folder).
        measure_ceilings: also measure the machine's ceilings and each stage of the loader the
            user will run, and give the verdict (a few seconds); False when a caller already has
            them (a row rerun for its memory).
        repeats: run each row this many times, interleaved (A, B, C, A, B, C, ...); a row shows
            the median and the range, ratios are paired repeat by repeat.
        storage_options: the object store's options when SRC or ``packed`` are URLs
            (``s3://bucket/images/``: small objects, one GET each; a dataset in a store: ranged
            reads with no cache, epoch 1 into an empty cache, epoch 2 from it).

    The verdict is about fastload on the packed dataset when there is one the user made
    (``packed``, ``SRC.fl``, or SRC itself), else about the folder's torch loader.
    """
    _check(batch_size, duration, samples)
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: must be at least 1")
    cores = available_cpus()
    config = _config(src, packed, batch_size, image_size, duration, samples, cold, model_step)
    config["repeats"] = repeats
    shown = Progress(progress)
    with resolve(src, packed, image_size=image_size, temp_pack=temp_pack, work=work,
                 storage_options=storage_options) as inputs:
        config["packed"] = [str(p) for p in inputs.packed]
        specs = _specs(inputs, include, batch_size, image_size, cold, torch_grid or [(cores, 4)], dali,
                       fastload_variants)
        if only is not None:
            specs = [spec for spec in specs if spec.name in only]
        runs, interrupted = run_all(specs, Limits(duration, samples, one_epoch=cold), progress=shown,
                                    repeats=repeats)
        report = BenchReport("bench", config, runs, notes=list(inputs.notes), interrupted=interrupted,
                             skipped=list(inputs.skipped))
        if inputs.baseline is None:
            report.notes.append("no image folder to compare with: pass the folder as SRC and the "
                                "dataset with --packed")
        report.compute_speedups()
        try:
            if not interrupted and (model_step or measure_ceilings):
                target = _target(inputs, specs, report, image_size)
                if target is None:  # that loader's row was not run, or delivered nothing
                    shown.note("measuring the machine's ceilings")
                    probe = _probe_of(inputs.baseline if inputs.baseline is not None
                                      else _packed_dataset(inputs.packed[0], image_size, inputs))
                    report.ceilings = ceilings(probe, sample_records(probe), cores=cores, cold=cold,
                                               budget=stage_budget, image_size=image_size,
                                               batch_size=batch_size,
                                               sequential_files=_sequential(inputs, cold))
                elif model_step:
                    _diagnose_into(report, inputs, batch_size, image_size, duration, samples, cold,
                                   model_step, None, stage_budget, shown, dataset=target[0],
                                   show_stages=stages)
                else:
                    dataset, spec, row = target
                    _judge(report, inputs, _probe_of(dataset), spec.make(), row, batch_size, image_size,
                           cold, None, stage_budget, shown, show_stages=stages)
        except KeyboardInterrupt:
            report.interrupted = True
        finally:
            shown.finish()
    return report


def _specs(inputs: Inputs, include: Collection[RunKind], batch_size: int, image_size: int, cold: bool,
           grid: Sequence[tuple[int, int]], dali: bool,
           variants: Sequence[dict[str, Any]]) -> list[RunSpec]:
    """Every row, in the table's order: torch, raw reads, fastload; local and in a store."""
    local = [p for p in inputs.packed if isinstance(p, Path)]
    stored = [p for p in inputs.packed if not isinstance(p, Path)]
    objects = inputs.baseline if isinstance(inputs.baseline, StoreObjects) else None
    folder = None if objects is not None else inputs.baseline
    specs: list[RunSpec] = []
    if inputs.baseline is not None and "baseline" in include:
        specs += torch_rows(inputs.baseline, batch_size, grid, cold)
    if "raw" in include:
        specs += raw_rows(folder, local, batch_size, cold) + store_raw_rows(objects, batch_size)
        for url in stored:
            specs += store_rows(url, inputs.storage_options, _cache_dir(inputs), batch_size, image_size,
                                train=False)
    if "fastload" in include:
        specs += fastload_rows(local, batch_size, image_size, cold, dali=dali, variants=variants)
        for url in stored:
            specs += store_rows(url, inputs.storage_options, _cache_dir(inputs), batch_size, image_size,
                                raw=False)
    return specs


def _cache_dir(inputs: Inputs) -> str:
    assert inputs.cache_dir is not None, "resolve() makes a temporary cache for datasets in a store"
    return inputs.cache_dir


def doctor(src: str | os.PathLike[str] | torch.utils.data.Dataset, *, batch_size: int = 64,
           image_size: int = 224, num_workers: int | None = None, duration: float = 5.0,
           samples: int | None = None, cold: bool = False, model_step: ModelStep = None,
           stage_budget: float = 0.5, progress: bool | None = None,
           storage_options: dict[str, Any] | None = None) -> BenchReport:
    """Time each stage of SRC's loader alone, run it with a stand-in training step, name the bottleneck.

    Args:
        src: an image folder (diagnosed as ImageFolder + torch's DataLoader), a packed dataset
            (fastload's pipeline), or a Dataset: a PackedDataset, or any Dataset with
            ``read(i)``, ``decode(data)`` and ``transform(decoded)`` methods, as
            :class:`~fastload.benchmark.ImageFolderBaseline` has.
        num_workers: the folder loader's workers (default: one per core); for a packed dataset,
            None keeps fastload's auto settings.
        model_step: seconds of a training step (slept: a GPU step leaves the CPU free), or a
            callable run on each batch; the report then shows how long the loop waits for data.
        storage_options: the object store's options when ``src`` is a URL (small objects, or a
            dataset in a store, read through an empty temporary node cache: a first epoch).
    """
    _check(batch_size, duration, samples)
    config = _config(src if not isinstance(src, torch.utils.data.Dataset) else type(src).__name__, (),
                     batch_size, image_size, duration, samples, cold, model_step)
    config["num_workers"] = num_workers
    shown = Progress(progress)
    report = BenchReport("doctor", config, [])
    try:
        if isinstance(src, torch.utils.data.Dataset):
            inputs = Inputs(Path("."), "dataset", None, [])
            _diagnose_into(report, inputs, batch_size, image_size, duration, samples, cold, model_step,
                           num_workers, stage_budget, shown, dataset=src)
        else:
            with resolve(src, image_size=image_size, pack_missing=False,
                         storage_options=storage_options) as inputs:
                if inputs.skipped:  # the files the loader was spared, named
                    report.skipped = list(inputs.skipped)
                    report.notes.append(skipped_note(inputs.skipped))
                _diagnose_into(report, inputs, batch_size, image_size, duration, samples, cold,
                               model_step, num_workers, stage_budget, shown)
    except KeyboardInterrupt:
        report.interrupted = True
    finally:
        shown.finish()
    return report


def _target(inputs: Inputs, specs: Sequence[RunSpec], report: BenchReport,
            image_size: int) -> tuple[Any, RunSpec, RunResult] | None:
    """What the verdict is about: fastload on the first packed dataset the user made, else the
    folder with torch's DataLoader (its best row); with its spec and its measured row."""
    mine = inputs.packed[:1] if inputs.packed and not inputs.temporary else []
    if mine:
        dataset = _packed_dataset(mine[0], image_size, inputs)
        name = _row_name(dataset)
    elif inputs.baseline is not None:
        dataset, name = inputs.baseline, report.reference["pipeline"]
    else:
        dataset = _packed_dataset(inputs.packed[0], image_size, inputs)
        name = _row_name(dataset)
    row = next((r for r in report.measured() if r.name == name), None)
    spec = next((s for s in specs if s.name == name), None)
    return (dataset, spec, row) if row is not None and spec is not None else None


def _diagnose_into(report: BenchReport, inputs: Inputs, batch_size: int, image_size: int,
                   duration: float, samples: int | None, cold: bool, model_step: ModelStep,
                   num_workers: int | None, budget: float, shown: Progress,
                   dataset: torch.utils.data.Dataset | None = None, show_stages: bool = True) -> None:
    """Run SRC's loader with the model step, then each stage alone; add the verdict to ``report``."""
    cores = available_cpus()
    if dataset is None:
        dataset = (inputs.baseline if inputs.src_kind == "folder" else
                   _packed_dataset(inputs.packed[0], image_size, inputs))
    spec, probe = _loader_spec(dataset, batch_size, num_workers, cores)
    if cold:
        def prepare() -> None:
            make_cold(probe, range(len(probe)))
        spec.prepare = prepare
    runs, interrupted = run_all([spec], Limits(duration, samples, one_epoch=cold),
                                model_step=model_step, progress=shown, keep_loaders=True)
    run = runs[0]
    report.runs.append(run)
    report.interrupted |= interrupted
    if interrupted or run.status in ("skipped", "failed"):
        return
    loader, run.loader = run.loader, None
    _judge(report, inputs, probe, loader, run, batch_size, image_size, cold, model_step, budget, shown,
           show_stages)


def _judge(report: BenchReport, inputs: Inputs, probe: Probe, loader: Any, run: RunResult,
           batch_size: int, image_size: int, cold: bool, model_step: ModelStep, budget: float,
           shown: Progress, show_stages: bool) -> None:
    """Each stage of ``loader`` alone and the machine's ceilings → the verdict about ``run``'s
    loader (its stages stay in the report when ``show_stages``)."""
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
                               batch_size=batch_size, sequential_files=_sequential(inputs, cold))
    if store is not None:
        report.ceilings.update(store.as_dict())
    rate = report.ceilings["h2d_pinned_mb_s" if pinned else "h2d_pageable_mb_s"]
    if rate:
        stages.append(Stage("transfer", "transfer", 3 * image_size**2 / (rate * 1e6)))
    if show_stages:
        report.stages = stages
    verdict = diagnose(Evidence(
        stages, cores, batch_size, "packed" if isinstance(probe, PackedProbe) else "folder",
        loader_rate=run.samples_per_s or None,
        wait_fraction=run.wait_fraction if model_step else None,
        model_step_s=_step_seconds(model_step, run),
        reduced_decode=isinstance(probe, PackedProbe) and probe.pipeline is not None,
        reduced_decode_s=1.0 / reduced if (reduced := report.ceilings["decode_reduced_per_core"]) else None,
        pinned=pinned if rate else None, dali_installed=_dali_installed(),
        store_bound=store.bound if store else None, store_latency_s=store.latency_s if store else None,
        store_mb_s=store.mb_s if store else None, cached=_cached(probe),
        dataset_bytes=_dataset_bytes(probe), cache_limit=_cache_limit(probe), cuda=torch.cuda.is_available()))
    report.verdict = replace(verdict, loader=run.name.removeprefix("doctor: "))


@functools.cache
def _dali_installed() -> bool:
    """Whether ``import nvidia.dali`` works here (the install advice is only for when it fails)."""
    try:
        importlib.import_module("nvidia.dali")
    except Exception:  # not installed, or installed but broken (CUDA libraries missing, ...)
        return False
    return True


def _step_seconds(model_step: ModelStep, run: RunResult) -> float | None:
    """The stand-in step's length: as given, or for a callable, the loop's time not spent waiting."""
    if not model_step:
        return None
    if not callable(model_step):
        return float(model_step)
    busy = run.seconds * (1.0 - (run.wait_fraction or 0.0))
    return busy / run.batches if run.batches else None


def _loader_spec(dataset: Any, batch_size: int, num_workers: int | None,
                 cores: int) -> tuple[RunSpec, Probe]:
    from fastload.dataset import PackedDataset
    from fastload.loading.loader import DataLoader

    if isinstance(dataset, PackedDataset):
        kwargs: dict[str, Any] = {} if num_workers is None else {"num_workers": num_workers}
        spec = RunSpec(f"doctor: {_row_name(dataset)}", "fastload", dataset.manifest.storage,
                       lambda: DataLoader(dataset, batch_size=batch_size, shuffle=True, **kwargs),
                       settings_text,
                       dataset.manifest.total_bytes / max(1, len(dataset)))
        return spec, PackedProbe(dataset)
    for method in ("read", "decode", "transform"):
        if not callable(getattr(dataset, method, None)):
            raise TypeError(f"doctor: {type(dataset).__name__} has no {method}() method; pass a "
                            "PackedDataset, a path, or a Dataset with read/decode/transform methods "
                            "(subclass fastload.benchmark.ImageFolderBaseline)")
    workers = cores if num_workers is None else num_workers
    extra: dict[str, Any] = {"persistent_workers": True} if workers else {}
    size = dataset.mean_size() if isinstance(dataset, ImageFolderBaseline) else 0.0
    what = ("ImageFolder (folder, Pillow)" if type(dataset) is ImageFolderBaseline else
            "small objects in a store (one GET each, Pillow)" if type(dataset) is StoreObjects
            else f"{type(dataset).__name__} (your Dataset)")
    spec = RunSpec(f"doctor: torch {what}", "baseline", "folder",
                   lambda: torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                                       num_workers=workers, **extra),
                   f"num_workers={workers}", size)
    return spec, ImageFolderProbe(dataset)


def _parallelism(loader: Any, cores: int) -> dict[str, int]:
    """How many of each stage the loader runs at once (a worker runs a sample's stages in turn)."""
    settings = getattr(loader, "settings", None)
    if settings is not None and settings.mode == "threads":
        threads = getattr(loader.dataset, "decode_threads", None) or cores
        return {"read": 1, "decode": threads, "transform": threads, "collate": 1}
    workers = max(1, int(getattr(loader, "num_workers", 0)))
    return {"read": workers, "decode": workers, "transform": workers, "collate": workers}


def _packed_dataset(path: Path | str, image_size: int, inputs: Inputs) -> Any:
    """The packed dataset at ``path`` with the train pipeline (one in a store through the run's
    temporary node cache, empty at first: what a first epoch on a new node reads)."""
    from fastload.dataset import PackedDataset

    if isinstance(path, Path):
        return PackedDataset(path, image_size=image_size, train=True)
    return PackedDataset(path, image_size=image_size, train=True, storage_options=inputs.storage_options,
                         cache_dir=_cache_dir(inputs), cache_limit=_room_for(path, inputs))


def _room_for(url: str, inputs: Inputs) -> int:
    from fastload.storage.packed import locate_packed

    return cache_room(locate_packed(url, inputs.storage_options).manifest())


def _row_name(dataset: Any) -> str:
    """The name of fastload's train row on this dataset (see contenders / far)."""
    where = ", store" if dataset.reader.remote is not None else ""
    return f"fastload {dataset.manifest.storage}{where}"


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


def _probe_of(dataset: Any) -> Probe:
    from fastload.dataset import PackedDataset

    return PackedProbe(dataset) if isinstance(dataset, PackedDataset) else ImageFolderProbe(dataset)


def _sequential(inputs: Inputs, cold: bool) -> list[str]:
    first = inputs.packed[0] if inputs.packed else None
    return shard_files(first) if cold and isinstance(first, Path) else []


def _check(batch_size: int, duration: float, samples: int | None) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: must be at least 1")
    if duration <= 0:
        raise ValueError(f"duration={duration}: must be a positive number of seconds")
    if samples is not None and samples < 1:
        raise ValueError(f"samples={samples}: must be at least 1, or None for no limit")


def _config(src: Any, packed: Sequence[Any], batch_size: int, image_size: int, duration: float,
            samples: int | None, cold: bool, model_step: ModelStep) -> dict[str, Any]:
    step_ms = model_step * 1e3 if isinstance(model_step, (int, float)) and model_step else None
    return {"source": str(src), "packed": [str(p) for p in packed], "batch_size": batch_size,
            "image_size": image_size, "duration_s": duration, "samples": samples, "cold": cold,
            "model_step_ms": step_ms, "model_step_callable": callable(model_step)}


__all__ = ["RunResult", "bench", "doctor"]
