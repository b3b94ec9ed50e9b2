"""Keeping a real GPU fed: torch's tuned DataLoader against fastload's device delivery, with a model.

Needs a CUDA device (run it on a lent GPU machine). The same photos, the same train crop
(RandomResizedCrop 224 + flip), the same batch size and the same model step on the GPU, rows
interleaved run by run:

- ``torch``: ``torch.utils.data.DataLoader`` over the ImageFolder baseline (Pillow per file),
  ``num_workers`` = one per core, ``pin_memory=True``, ``persistent_workers``, then
  ``.to("cuda", non_blocking=True)`` and normalisation on the GPU: what a careful user writes.
- ``fastload``: ``fastload.DataLoader(PackedDataset(...), device="cuda", mean=..., std=...)`` with
  its auto settings: the pinned copy on a side stream, normalised on the GPU.
- ``nvimgcodec``: the same with ``backend="nvimgcodec", num_workers=0``: JPEG crops decoded on the
  GPU; ``nvimgcodec-split``: with one worker process per core decoding a share of each batch.
- ``ray``: ``mode="ray"`` with ``--ray-workers`` decode actors on the Ray cluster at
  ``--ray-address`` (issue 40: the training process on 2 cores, a Ray node on the rest).
- ``headspace`` (under a model only): the step alone on one batch already on the GPU, the rate no
  loader can beat; a loader that reaches it leaves the model bounding training.

Each row runs twice: data alone (``data``: each batch summed on the GPU) and with a ResNet-18-shaped
model's forward + backward + SGD step in bf16 autocast (``model``). The wait column is the share of the wall
time the loop spent in ``next(iterator)``: what a faster loader can win back. GPU memory is each row's
peak (``gpu_memory.py``: torch's counters reset before it, and the process as NVML sees it). With
``--json``, the file is rewritten after every row: a run cut short keeps what it measured.

    python bench/gpu_bench.py IMAGES --packed IMAGES.fl --seconds 8 --repeats 2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from gpu_memory import PeakMemory
from torch import nn

import fastload
from fastload.benchmark.baseline import ImageFolderBaseline

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("images", type=Path, help="the ImageFolder tree the dataset was packed from")
    p.add_argument("--packed", type=Path, required=True, help="fastload pack IMAGES -o PACKED")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--seconds", type=float, default=8.0, help="timed seconds per run, after 5 batches")
    p.add_argument("--repeats", type=int, default=2, help="runs of each row, interleaved")
    p.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="num_workers of torch and of fastload's processes row (default: one per core)")
    p.add_argument("--rows", nargs="+", default=["torch", "auto"],
                   choices=["torch", "auto", "threads", "processes", "nvimgcodec", "nvimgcodec-split", "ray",
                            "pixel-cache"],
                   help="torch's loader, and fastload with its auto settings, an explicit mode, GPU decode, "
                        "or auto settings on a pixel cache filled by an untimed epoch first (epoch >= 2)")
    p.add_argument("--pixel-cache", type=Path, default=Path(__file__).parent / "data" / "pixel-cache-gpu",
                   help="the pixel-cache row's folder")
    p.add_argument("--model", default="small",
                   help="the model step: 'small' (a ResNet-18-shaped stack written here) or a torchvision "
                        "model name (resnet50, resnet18, ...), bf16 autocast and channels-last")
    p.add_argument("--steps", nargs="+", default=["data", "model"], choices=["data", "model"],
                   help="data alone, and under the model's step")
    p.add_argument("--ray-address", default="auto", help="the ray row's cluster (default: the running one)")
    p.add_argument("--ray-workers", type=int, default=14, help="the ray row's decode actors (default 14)")
    p.add_argument("--json", type=Path, help="write the rows here")
    return p.parse_args(argv)


class SmallResNet(nn.Module):
    """A ResNet-18-shaped stack (stem, 4 stages of 2 blocks) written here: no torchvision."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers, width = [], 64
        for out, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [_Block(width, out, stride), _Block(out, out, 1)]
            width = out
        self.stages = nn.Sequential(*layers)
        self.head = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(self.stages(self.stem(x)), 1), 1))


class _Block(nn.Module):
    def __init__(self, inp: int, out: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(inp, out, 3, stride, 1, bias=False), nn.BatchNorm2d(out), nn.ReLU(),
                                  nn.Conv2d(out, out, 3, 1, 1, bias=False), nn.BatchNorm2d(out))
        self.skip = (nn.Identity() if stride == 1 and inp == out else
                     nn.Sequential(nn.Conv2d(inp, out, 1, stride, bias=False), nn.BatchNorm2d(out)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.relu(self.body(x) + self.skip(x))


def torch_batches(images: Path, args: argparse.Namespace) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """The careful torch loop: workers per core, pinned batches, async copy, normalised on the GPU."""
    dataset = ImageFolderBaseline.from_folder(images, args.image_size)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
                                         num_workers=args.workers, pin_memory=True, persistent_workers=True,
                                         prefetch_factor=2)
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1) * 255
    while True:
        for x, y in loader:
            x = x.to("cuda", non_blocking=True).float().sub_(mean).div_(std)
            yield x, y.to("cuda", non_blocking=True)


def fastload_batches(packed: Path, args: argparse.Namespace, mode: str) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """fastload's loop: auto settings (or ``mode``), delivered on the GPU and normalised there."""
    cache = args.pixel_cache if mode == "pixel-cache" else None
    dataset = fastload.PackedDataset(packed, image_size=args.image_size, train=True, pixel_cache=cache)
    if cache is not None and not dataset.pixel_cache.store.entries(range(len(dataset))).present.all():
        for _ in fastload.DataLoader(dataset, batch_size=args.batch_size):  # epoch 1 fills it, untimed
            pass
    if mode == "nvimgcodec":  # the GPU decodes every sample
        explicit: dict[str, Any] = {"backend": "nvimgcodec", "num_workers": 0}
    elif mode == "nvimgcodec-split":  # worker processes (one per core) decode a share of each batch
        explicit = {"backend": "nvimgcodec", "num_workers": args.workers}
    elif mode == "ray":  # decode actors on the cluster
        explicit = {"mode": "ray", "num_workers": args.ray_workers, "ray_address": args.ray_address}
    else:
        explicit = {} if mode in ("auto", "pixel-cache") else {
            "mode": mode, "num_workers": args.workers if mode == "processes" else 0}
    # Persistent workers, as torch's row has: 6,000 photos are 23 batches, and a loader that forked
    # 16 workers again each epoch would time their start, not their decode.
    def make(**more: Any) -> fastload.DataLoader:
        return fastload.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True,
                                   device="cuda", mean=list(MEAN), std=list(STD), **explicit, **more)

    loader = make()
    if loader.num_workers > 0 and mode != "ray":  # torch refuses persistent_workers without workers
        loader = make(persistent_workers=True)
    print(f"  fastload {loader.settings.as_kwargs()}", flush=True)
    try:
        while True:
            yield from loader
    finally:
        share = getattr(getattr(loader, "_tail", None), "cpu_share", None)
        if share:
            print(f"  the CPU decoded {share:.0%} of each batch at the end", flush=True)


def headspace_batches(args: argparse.Namespace) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """One normalised batch already on the GPU, over and over: the step's own ceiling."""
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device="cuda")
    y = torch.randint(0, 1000, (args.batch_size,), device="cuda")
    while True:
        yield x, y


def run(batches: Iterable[tuple[torch.Tensor, torch.Tensor]], step: Callable[[torch.Tensor, torch.Tensor], None],
        seconds: float, batch_size: int) -> dict[str, Any]:
    """Samples/s, the share of wall time spent waiting for the next batch, the mean step time, and
    the row's peak GPU memory (torch's and the process's)."""
    memory = PeakMemory()
    memory.start()
    it = iter(batches)
    for _ in range(5):  # workers started, cuDNN tuned
        step(*next(it))
    torch.cuda.synchronize()
    waited, stepped, done, start = 0.0, 0.0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        x, y = next(it)
        waited += time.perf_counter() - t
        t = time.perf_counter()
        step(x, y)
        torch.cuda.synchronize()  # the step's time is the GPU's, not the launch's
        stepped += time.perf_counter() - t
        done += 1
        memory.sample()
    wall = time.perf_counter() - start
    figures = memory.figures()
    close = getattr(it, "close", None)
    if close is not None:
        close()  # a generator: its loader's workers and threads go
    return {"samples_per_s": done * batch_size / wall, "wait_share": waited / wall,
            "step_ms": 1000 * stepped / max(done, 1), **figures}


def write_rows(path: Path, args: argparse.Namespace, results: dict[str, Any], complete: bool) -> None:
    """The rows measured so far, written whole (a temporary file renamed over the last one)."""
    summary = {step: {name: {key: statistics.median(r[key] for r in runs) if runs[0][key] is not None else None
                             for key in runs[0]} for name, runs in by_row.items()}
               for step, by_row in results.items()}
    temporary = path.with_suffix(".partial")
    temporary.write_text(json.dumps({"device": torch.cuda.get_device_name(0), "cores": len(os.sched_getaffinity(0)),
                                     "torch": torch.__version__, "complete": complete,
                                     "args": {k: str(v) for k, v in vars(args).items()},
                                     "runs": results, "medians": summary}, indent=1))
    os.replace(temporary, path)


def model_for(name: str) -> nn.Module:
    if name == "small":
        return SmallResNet()
    import torchvision  # on the lent GPU machine: named models

    return getattr(torchvision.models, name)(weights=None)


def steps(model_name: str) -> dict[str, Callable[[torch.Tensor, torch.Tensor], None]]:
    model = model_for(model_name).cuda().to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def train(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x.contiguous(memory_format=torch.channels_last)), y % 1000)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def data_only(x: torch.Tensor, y: torch.Tensor) -> None:
        x.sum()

    return {"data": data_only, "model": train}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_bench.py needs a CUDA device: run it on a GPU machine")
    torch.backends.cudnn.benchmark = True
    rows: dict[str, Callable[[], Iterable[Any]]] = {}
    for row in args.rows:
        if row.startswith("nvimgcodec"):
            label = "GPU decode" if row == "nvimgcodec" else f"GPU + {args.workers} workers"
            rows[f"fastload, nvimgcodec, {label}"] = lambda row=row: fastload_batches(args.packed, args, row)
        elif row == "ray":
            rows[f"fastload, device='cuda', ray, {args.ray_workers} actors"] = lambda: fastload_batches(args.packed, args, "ray")
        elif row == "torch":
            rows[f"torch, {args.workers} workers, pin_memory"] = lambda: torch_batches(args.images, args)
        else:
            rows[f"fastload, device='cuda', {row}"] = lambda row=row: fastload_batches(args.packed, args, row)
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for step_name, step in steps(args.model).items():
        if step_name not in args.steps:
            continue
        for repeat in range(args.repeats):
            chosen = {**rows, "headspace: the step on a batch on the GPU": lambda: headspace_batches(args)} \
                if step_name == "model" else rows
            for name, make in chosen.items():
                got = run(make(), step, args.seconds, args.batch_size)
                results.setdefault(step_name, {}).setdefault(name, []).append(got)
                peak = got["gpu_process_peak_mb"] or got["gpu_peak_reserved_mb"]
                print(f"{step_name:6s} {name:40s} run {repeat + 1}: {got['samples_per_s']:8.0f} samples/s, "
                      f"waiting {got['wait_share']:.0%}, step {got['step_ms']:.1f} ms, "
                      f"GPU memory peak {peak:.0f} MB", flush=True)
                if args.json:
                    write_rows(args.json, args, results, complete=False)
    print(f"\n{torch.cuda.get_device_name(0)}, {args.workers} cores, batch {args.batch_size}, "
          f"model {args.model}, medians:")
    for step_name, by_row in results.items():
        base = statistics.median(r["samples_per_s"] for r in next(iter(by_row.values())))
        for name, runs in by_row.items():
            rate = statistics.median(r["samples_per_s"] for r in runs)
            print(f"  {step_name:6s} {name:40s} {rate:8.0f} samples/s ({rate / base:.2f}x the first row's), "
                  f"waiting {statistics.median(r['wait_share'] for r in runs):.0%}")
    if args.json:
        write_rows(args.json, args, results, complete=True)


if __name__ == "__main__":
    main()
