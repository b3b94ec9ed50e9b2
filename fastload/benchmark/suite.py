"""``bench`` and ``doctor``: the two measurements, from SRC to a report.

bench:  SRC → inputs (unreadable files left out) → [the model step alone: its headspace] →
        contenders side by side, repeated and interleaved (runs; decoded rows under the step)
        → each stage alone of the loader the user will run → ceilings → verdict → report
doctor: SRC → [the step's headspace] → the loader it would use, run under the training step
        → each stage alone → ceilings → verdict → report
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import torch

from fastload.benchmark.ceilings import ceilings
from fastload.benchmark.connector import connector_notes, connector_rows
from fastload.benchmark.contenders import fastload_rows, raw_rows, torch_rows
from fastload.benchmark.far import StoreObjects, store_raw_rows, store_rows
from fastload.benchmark.inputs import Inputs, skipped_note
from fastload.benchmark.judge import diagnose_into, judge
from fastload.benchmark.loader_under_test import (
    cache_dir,
    packed_dataset,
    probe_of,
    row_name,
    sequential,
)
from fastload.benchmark.machine_load import LoadWatch
from fastload.benchmark.monitor import Progress
from fastload.benchmark.report import BenchReport
from fastload.benchmark.resolve import resolve
from fastload.benchmark.runs import Limits, ModelStep, RunKind, RunResult, RunSpec, run_all
from fastload.benchmark.stages import sample_records
from fastload.benchmark.training import StepFn, headspace_of, step_device, training_step
from fastload.config import available_cpus


def bench(src: str | os.PathLike[str], packed: Sequence[str | os.PathLike[str]] = (), *,
          batch_size: int = 64, image_size: int = 224, duration: float = 5.0,
          samples: int | None = None, cold: bool = False, stages: bool = False,
          model_step: ModelStep = None, torch_grid: Sequence[tuple[int, int]] | None = None,
          dali: bool = True, include: Collection[RunKind] = ("baseline", "raw", "fastload"),
          fastload_variants: Sequence[dict[str, Any]] = (), only: Collection[str] | None = None,
          temp_pack: int = 2000, work: str | os.PathLike[str] | None = None,
          stage_budget: float = 0.5, measure_ceilings: bool = True, repeats: int = 3,
          progress: bool | None = None, storage_options: dict[str, Any] | None = None,
          model: str | None = None, step: StepFn | None = None) -> BenchReport:
    """Every contender on the same records, side by side; see :mod:`fastload.benchmark`.

    Args:
        src: an image folder, a packed dataset, or a folder whose packed copies are in ``packed``.
        duration, samples: bound each row: timed seconds, and samples after the warm-up.
        cold: drop every file from the page cache before each run (one pass at most per run).
        stages: keep the stage timings behind the verdict in the report (the table shows them).
        model: a torchvision model name (``"resnet50"``): its training step (bf16 autocast and
            channels-last on CUDA, float32 on the CPU) runs after every decoded batch; its
            headspace, the step alone on a batch already on the device, is measured first, and
            the verdict says whether the loader or the model bounds training. Needs torchvision.
        step: your ``fn(images, labels)`` running one training step, instead of ``model``.
        model_step: a stand-in step instead: seconds slept after each batch (a GPU step leaves
            the CPU free), or a callable given the batch.
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
    train = training_step(model, step, model_step)
    config = _config(src, packed, batch_size, image_size, duration, samples, cold, train, model)
    config["repeats"] = repeats
    shown, watch = Progress(progress), LoadWatch()
    with resolve(src, packed, image_size=image_size, temp_pack=temp_pack, work=work,
                 storage_options=storage_options) as inputs:
        config["packed"] = [str(p) for p in inputs.packed]
        specs = _specs(inputs, include, batch_size, image_size, cold, torch_grid or [(cores, 4)], dali,
                       fastload_variants, step_device(train))
        if only is not None:
            specs = [spec for spec in specs if spec.name in only]
        if train:
            shown.note("timing the model step alone (its headspace)")
        headspace = headspace_of(train, batch_size, image_size, min(duration, 2.0))
        runs, interrupted = run_all(specs, Limits(duration, samples, one_epoch=cold), model_step=train,
                                    progress=shown, repeats=repeats)
        report = BenchReport("bench", config, runs, notes=list(inputs.notes), interrupted=interrupted,
                             skipped=list(inputs.skipped), headspace=headspace)
        if inputs.baseline is None:
            report.notes.append("no image folder to compare with: pass the folder as SRC and the "
                                "dataset with --packed")
        report.compute_speedups()
        report.notes += connector_notes(report.runs)
        if not train and measure_ceilings:
            report.notes.append(NO_STEP_NOTE)
        try:
            if not interrupted and (train or measure_ceilings):
                target = _target(inputs, specs, report, image_size)
                if target is None:  # that loader's row was not run, or delivered nothing
                    shown.note("measuring the machine's ceilings")
                    probe = probe_of(inputs.baseline if inputs.baseline is not None
                                      else packed_dataset(inputs.packed[0], image_size, inputs))
                    report.ceilings = ceilings(probe, sample_records(probe), cores=cores, cold=cold,
                                               budget=stage_budget, image_size=image_size,
                                               batch_size=batch_size,
                                               sequential_files=sequential(inputs, cold))
                else:  # its row ran under the step, if any
                    dataset, spec, row = target
                    judge(report, inputs, probe_of(dataset), spec.make(), row, batch_size, image_size,
                          cold, train, stage_budget, shown, show_stages=stages, headspace=headspace,
                          watch=watch)
        except KeyboardInterrupt:
            report.interrupted = True
        finally:
            shown.finish()
            report.load = watch.stop()
    return report


def _specs(inputs: Inputs, include: Collection[RunKind], batch_size: int, image_size: int, cold: bool,
           grid: Sequence[tuple[int, int]], dali: bool,
           variants: Sequence[dict[str, Any]], device: str | None) -> list[RunSpec]:
    """Every row, in the table's order: torch, raw reads, fastload; local and in a store."""
    local = [p for p in inputs.packed if isinstance(p, Path)]
    stored = [p for p in inputs.packed if not isinstance(p, Path)]
    objects = inputs.baseline if isinstance(inputs.baseline, StoreObjects) else None
    folder = None if objects is not None else inputs.baseline
    specs: list[RunSpec] = []
    if inputs.baseline is not None and "baseline" in include:
        specs += torch_rows(inputs.baseline, batch_size, grid, cold, pin_memory=device == "cuda")
    if "raw" in include:
        specs += raw_rows(folder, local, batch_size, cold) + store_raw_rows(objects, batch_size)
        for url in stored:
            specs += store_rows(url, inputs.storage_options, cache_dir(inputs), batch_size, image_size,
                                train=False)
        connector, notes = connector_rows(objects, stored, inputs.storage_options, batch_size)
        specs += connector  # AWS's connector on the same store, when it is installed
        inputs.notes += notes
    if "fastload" in include:
        specs += fastload_rows(local, batch_size, image_size, cold, dali=dali, variants=variants,
                               device=device)
        for url in stored:
            specs += store_rows(url, inputs.storage_options, cache_dir(inputs), batch_size, image_size,
                                raw=False)
    return specs



def doctor(src: str | os.PathLike[str] | torch.utils.data.Dataset, *, batch_size: int = 64,
           image_size: int = 224, num_workers: int | None = None, duration: float = 2.0,
           samples: int | None = None, cold: bool = False, model_step: ModelStep = None,
           stage_budget: float = 0.5, progress: bool | None = None,
           storage_options: dict[str, Any] | None = None, model: str | None = None,
           step: StepFn | None = None, repeats: int = 3) -> BenchReport:
    """Time each stage of SRC's loader alone, run it under a training step, name the bottleneck.

    Args:
        src: an image folder (diagnosed as ImageFolder + torch's DataLoader), a packed dataset
            (fastload's pipeline), or a Dataset: a PackedDataset, or any Dataset with
            ``read(i)``, ``decode(data)`` and ``transform(decoded)`` methods, as
            :class:`~fastload.benchmark.ImageFolderBaseline` has.
        num_workers: the folder loader's workers (default: one per core); for a packed dataset,
            None keeps fastload's auto settings.
        model, step: the training step the loader runs under, as in :func:`bench`: a torchvision
            model name, or your ``fn(images, labels)``; its headspace is measured first, and the
            verdict says whether the loader or the model bounds training, and by how much.
        model_step: a stand-in step instead: seconds slept (a GPU step leaves the CPU free), or a
            callable run on each batch; the report then shows how long the loop waits for data.
            Without any step the verdict is about the data alone, and a note says so.
        storage_options: the object store's options when ``src`` is a URL (small objects, or a
            dataset in a store, read through an empty temporary node cache: a first epoch).
        repeats: runs of the loader (each ``duration`` long): the row shows their median and
            range. Each stage is timed in 5 rounds; the verdict names a bottleneck only where
            those spreads allow, and the report says how busy the machine was meanwhile.
    """
    _check(batch_size, duration, samples)
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: must be at least 1")
    train = training_step(model, step, model_step)
    config = _config(src if not isinstance(src, torch.utils.data.Dataset) else type(src).__name__, (),
                     batch_size, image_size, duration, samples, cold, train, model)
    config["num_workers"], config["repeats"] = num_workers, repeats
    shown, watch = Progress(progress), LoadWatch()
    report = BenchReport("doctor", config, [], notes=[] if train else [NO_STEP_NOTE])
    try:
        if train:
            shown.note("timing the model step alone (its headspace)")
        report.headspace = headspace_of(train, batch_size, image_size, min(duration, 2.0))
        if isinstance(src, torch.utils.data.Dataset):
            inputs = Inputs(Path("."), "dataset", None, [])
            diagnose_into(report, inputs, batch_size, image_size, duration, samples, cold, train,
                          num_workers, stage_budget, shown, dataset=src, headspace=report.headspace,
                          repeats=repeats, watch=watch)
        else:
            with resolve(src, image_size=image_size, pack_missing=False,
                         storage_options=storage_options) as inputs:
                if inputs.skipped:  # the files the loader was spared, named
                    report.skipped = list(inputs.skipped)
                    report.notes.append(skipped_note(inputs.skipped))
                diagnose_into(report, inputs, batch_size, image_size, duration, samples, cold,
                              train, num_workers, stage_budget, shown, headspace=report.headspace,
                              repeats=repeats, watch=watch)
    except KeyboardInterrupt:
        report.interrupted = True
    finally:
        shown.finish()
        report.load = watch.stop()
    return report


def _target(inputs: Inputs, specs: Sequence[RunSpec], report: BenchReport,
            image_size: int) -> tuple[Any, RunSpec, RunResult] | None:
    """What the verdict is about: fastload on the first packed dataset the user made, else the
    folder with torch's DataLoader (its best row); with its spec and its measured row."""
    mine = inputs.packed[:1] if inputs.packed and not inputs.temporary else []
    if mine:
        dataset = packed_dataset(mine[0], image_size, inputs)
        name = row_name(dataset)
    elif inputs.baseline is not None:
        dataset, name = inputs.baseline, report.reference["pipeline"]
    else:
        dataset = packed_dataset(inputs.packed[0], image_size, inputs)
        name = row_name(dataset)
    row = next((r for r in report.measured() if r.name == name), None)
    spec = next((s for s in specs if s.name == name), None)
    return (dataset, spec, row) if row is not None and spec is not None else None


def _check(batch_size: int, duration: float, samples: int | None) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: must be at least 1")
    if duration <= 0:
        raise ValueError(f"duration={duration}: must be a positive number of seconds")
    if samples is not None and samples < 1:
        raise ValueError(f"samples={samples}: must be at least 1, or None for no limit")


def _config(src: Any, packed: Sequence[Any], batch_size: int, image_size: int, duration: float,
            samples: int | None, cold: bool, model_step: ModelStep, model: str | None) -> dict[str, Any]:
    step_ms = model_step * 1e3 if isinstance(model_step, (int, float)) and model_step else None
    return {"source": str(src), "packed": [str(p) for p in packed], "batch_size": batch_size,
            "image_size": image_size, "duration_s": duration, "samples": samples, "cold": cold,
            "model_step_ms": step_ms, "model_step_callable": callable(model_step), "model": model}


NO_STEP_NOTE = ("data alone: no training step was given, so whether the loader or the model bounds "
                "training was not measured; pass --model NAME (a torchvision model) or, from Python, "
                "step=fn(images, labels) (--model-step-ms stands in with a sleep)")


__all__ = ["RunResult", "bench", "doctor"]
