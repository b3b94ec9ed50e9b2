"""Your own augmentation in the pipeline: fastload's ``sample_transform`` against torch's best-tuned
loader running the same transform, side by side, on the benchmark photos.

    python bench/transform_bench.py bench/data/photos bench/data/photos.rm.fl \\
        --duration 6 --repeats 3 --json bench/results/transform.json

Issue 17: "with a 200 µs/sample ``sample_transform`` the loader stays ≥ 1.8× torch's best-tuned
loader running the same transform". The transform is real tensor work, not a sleep: a random
brightness change written as torch ops on the uint8 ``3×224×224`` crop, repeated until one call
takes ``--cost-us`` (200) µs on this machine (calibrated on one thread before the rows, and
reported). Rows, each interleaved ``--repeats`` times (``fastload.benchmark.runs.run_all``):

* ``torch ImageFolder + transform, w{cores} pf4``: the ImageFolder baseline (Pillow decode,
  RandomResizedCrop 224 + flip) then the transform, in torch's DataLoader with one worker per
  core, prefetch 4, persistent workers (its best-tuned setting on 2 cores, ``bench/HISTORY.md``);
* ``fastload + sample_transform``: ``fastload.DataLoader(PackedDataset(packed, image_size=224,
  train=True, sample_transform=...), batch_size=64, shuffle=True)``, auto settings;
* the same two without the transform, for what it costs each.

Nothing asserts on time; the ratio is printed and written to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


class CostlyJitter:
    """A random brightness change as torch ops on a uint8 CHW image (in 16-bit fixed point),
    ``rounds`` times (picklable, for worker processes)."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds

    def image(self, image: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        out = image
        for _ in range(self.rounds):
            factor = int(256 * (0.8 + 0.4 * float(torch.rand((), generator=generator))))
            out = (out.to(torch.int16) * factor >> 8).clamp_(0, 255).to(torch.uint8)
        return out

    def __call__(self, sample: dict[str, Any], generator: torch.Generator) -> dict[str, Any]:
        sample["image"] = self.image(sample["image"], generator)
        return sample


def calibrate(cost_s: float) -> tuple[int, float]:
    """Rounds of CostlyJitter that take about ``cost_s`` on one thread, and the seconds they take."""
    image = torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8)
    one = CostlyJitter(1)
    for _ in range(20):
        one.image(image, None)
    started, n = time.perf_counter(), 200
    for _ in range(n):
        one.image(image, None)
    per_round = (time.perf_counter() - started) / n
    rounds = max(1, round(cost_s / per_round))
    return rounds, rounds * per_round


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos", help="the photo folder (ImageFolder tree)")
    p.add_argument("packed", help="a packed dataset of the same photos")
    p.add_argument("--cost-us", type=float, default=200.0, help="the transform's cost per sample (200 µs)")
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    import fastload
    from fastload.benchmark.baseline import ImageFolderBaseline
    from fastload.benchmark.runs import Limits, RunSpec, run_all
    from fastload.config import available_cpus

    torch.set_num_threads(1)  # the transform is timed on one thread; each loader runs it on its own
    rounds, cost = calibrate(args.cost_us / 1e6)
    jitter = CostlyJitter(rounds)
    cores = available_cpus()

    class WithTransform(ImageFolderBaseline):
        def transform(self, img: Any) -> torch.Tensor:
            return jitter.image(super().transform(img), None)

    folder = ImageFolderBaseline.from_folder(args.photos, 224)
    transformed = WithTransform(folder.samples, 224, root=folder.root)

    def torch_loader(dataset: Any) -> Any:
        return torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=cores,
                                           prefetch_factor=4, persistent_workers=True)

    def fastload_loader(transform: Any, **extra: Any) -> Any:
        ds = fastload.PackedDataset(args.packed, image_size=224, train=True, sample_transform=transform)
        return fastload.DataLoader(ds, batch_size=64, shuffle=True, **extra)

    specs = [
        RunSpec(f"torch ImageFolder + transform, w{cores} pf4", "baseline", "folder",
                lambda: torch_loader(transformed), f"num_workers={cores}, prefetch_factor=4"),
        RunSpec("fastload + sample_transform", "fastload", "lmdb", lambda: fastload_loader(jitter),
                lambda loader: str(loader.settings.mode)),
        RunSpec(f"fastload + sample_transform, {cores} workers", "fastload", "lmdb",
                lambda: fastload_loader(jitter, num_workers=cores, persistent_workers=True),
                lambda loader: str(loader.settings.mode)),
        RunSpec(f"torch ImageFolder, w{cores} pf4", "baseline", "folder", lambda: torch_loader(folder),
                f"num_workers={cores}, prefetch_factor=4"),
        RunSpec("fastload", "fastload", "lmdb", lambda: fastload_loader(None),
                lambda loader: str(loader.settings.mode)),
    ]
    runs, _ = run_all(specs, Limits(args.duration), repeats=args.repeats)
    rates = {r.name: r for r in runs}
    for r in runs:
        print(f"{r.name:<42} {r.samples_per_s:8.0f} samples/s  (min {r.min or 0:.0f}, max {r.max or 0:.0f})  "
              f"{r.settings}")
    from fastload.benchmark.repeats import paired_ratio

    ratio = paired_ratio(rates["fastload + sample_transform"], rates[specs[0].name], "samples_per_s")
    workers = paired_ratio(rates[specs[2].name], rates[specs[0].name], "samples_per_s")
    plain = paired_ratio(rates["fastload"], rates[specs[3].name], "samples_per_s")
    print(f"transform: {rounds} rounds, {cost * 1e6:.0f} µs a sample on one thread")
    print(f"fastload / torch, with the transform: {ratio:.2f}x auto, {workers:.2f}x with {cores} workers "
          f"(without the transform: {plain:.2f}x)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "schema": "fastload-transform-bench/1", "cost_us": cost * 1e6, "rounds": rounds,
            "machine": {"cpus": cores, "python": platform.python_version(), "platform": platform.platform()},
            "runs": [r.as_dict() for r in runs],
            "ratio_with_transform": ratio, "ratio_with_transform_workers": workers, "ratio_without": plain}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
