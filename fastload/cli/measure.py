"""``fastload tune``, ``bench`` and ``doctor``: loader settings and loaders measured on this machine."""

from __future__ import annotations

import argparse
import json
from typing import Any

from fastload.cli.storage_options import storage_options


def tune_command(args: argparse.Namespace) -> int:
    from fastload.dataset import PackedDataset
    from fastload.loading.tuner import tune

    dataset = PackedDataset(args.path, image_size=args.image_size, train=not args.eval,
                            storage_options=storage_options(args))
    settings = tune(dataset, batch_size=args.batch_size, batches=args.batches, step=_tune_step(args),
                    repeats=args.repeats, progress=False if args.quiet else None)
    if args.json:
        print(json.dumps({"num_workers": settings.num_workers, "prefetch_factor": settings.prefetch_factor,
                          "pin_memory": settings.pin_memory, "mode": settings.mode,
                          "prefetch_batches": settings.prefetch_batches, "reasons": settings.reasons},
                         indent=2))
    else:
        print(settings)
    return 0


def bench_command(args: argparse.Namespace) -> int:
    from fastload.benchmark import bench

    _check_plot(args)
    from fastload.config import available_cpus

    # --prefetch-factor applies with or without --torch-workers (default: one worker per core)
    grid = [(w, args.prefetch_factor) for w in args.torch_workers or [available_cpus()]]
    report = bench(args.src, args.packed, batch_size=args.batch_size, image_size=args.image_size,
                   duration=args.duration, samples=args.samples, cold=args.cold, stages=args.stages,
                   model_step=_model_step(args), model=args.model, torch_grid=grid, dali=not args.no_dali,
                   temp_pack=args.temp_pack, work=args.work, repeats=args.repeats,
                   progress=False if args.quiet else None, storage_options=storage_options(args))
    return _report(report, args)


def doctor_command(args: argparse.Namespace) -> int:
    from fastload.benchmark import doctor

    _check_plot(args)
    report = doctor(args.src, batch_size=args.batch_size, image_size=args.image_size,
                    num_workers=args.num_workers, duration=args.duration, samples=args.samples,
                    cold=args.cold, model_step=_model_step(args), model=args.model, repeats=args.repeats,
                    progress=False if args.quiet else None, storage_options=storage_options(args))
    return _report(report, args)


def _model_step(args: argparse.Namespace) -> float | None:
    return args.model_step_ms / 1000 if args.model_step_ms else None


def _tune_step(args: argparse.Namespace) -> Any:
    """tune's training step: --model's (fn(images, labels)), or --model-step-ms slept."""
    if args.model and args.model_step_ms:
        raise ValueError(f"--model {args.model} and --model-step-ms {args.model_step_ms:g}: pass one training step")
    if not args.model:
        return _model_step(args)
    from fastload.benchmark.training import named_step

    train = named_step(args.model)
    return lambda images, labels: train((images, labels))


def _check_plot(args: argparse.Namespace) -> None:
    if args.plot:  # before a minute of measuring, not after
        from fastload.optional import require

        require("matplotlib", "the benchmark chart (--plot)")


def _report(report: Any, args: argparse.Namespace) -> int:
    """Print the table; write JSON and PNG; 130 when Ctrl-C cut it short, 1 when a row failed."""
    print(report.table())
    if args.json:
        print(f"json: {report.write_json(args.json)}")
    if args.plot:
        from fastload.benchmark.plot import write_plot

        print(f"plot: {write_plot(report, args.plot)}")
    if report.interrupted:
        return 130
    return 1 if any(r.status == "failed" for r in report.runs) else 0


