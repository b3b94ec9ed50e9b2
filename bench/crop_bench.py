"""One train crop's cost, paired: fastload's native crop vs the torch-resize crop vs a full decode.

    python bench/crop_bench.py bench/data/photos.rm.fl --json bench/results/crops.json

The same records and RandomResizedCrop 224 plans, one decode thread, each sample written into
its slot of a CHW batch tensor (as the loader does), timed round by round in rotating order:

- ``native``: ``decode_crop`` as fastload runs it (region decode, Pillow's resize in C);
- ``torch resize``: the region decoded by ``decode_region``, then torch's antialiased uint8
  bilinear ``interpolate`` and a copy into the slot (fastload's path up to session 5);
- ``full decode``: Pillow decodes the whole image, nothing else (what the decode ceiling counts).

Each round gives ratios of the three; the medians are the result. Pairing matters: this VM's
per-core speed drifts by 20 % within minutes, more than the differences measured.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

import fastload
from fastload.decode._jpeg_region import decode_region
from fastload.decode.crops import _scaled_box, decode_crop, draft_scale
from fastload.decode.images import decode_rgb, image_size
from fastload.decode.pipeline import ImagePipeline


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("packed", type=Path, help="a packed photo dataset")
    p.add_argument("--samples", type=int, default=400, help="records sampled (default 400)")
    p.add_argument("--rounds", type=int, default=12, help="paired rounds (default 12)")
    p.add_argument("--json", type=Path, help="write the results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    ds = fastload.PackedDataset(args.packed)
    indices = [int(i) for i in np.random.default_rng(0).permutation(len(ds))[:args.samples]]
    pipeline = ImagePipeline(224, train=True)
    payloads = ds.reader.read_many(indices)
    plans = [pipeline.plan(i, 0, 0, *image_size(d)) for i, d in zip(indices, payloads)]
    batch = torch.empty((len(payloads), 3, 224, 224), dtype=torch.uint8)

    def native(k: int) -> None:
        decode_crop(payloads[k], plans[k], out=batch[k].permute(1, 2, 0).numpy())

    def torch_resize(k: int) -> None:
        plan = plans[k]
        scale = draft_scale(plan.box, plan.out_size)
        x0, y0, x1, y1 = _scaled_box(plan, scale, math.inf, math.inf)
        box = (math.floor(x0), math.floor(y0), math.ceil(x1), math.ceil(y1))
        pixels, _, _, width, height = decode_region(payloads[k], scale, *box, 10**9, True)
        region = torch.frombuffer(pixels, dtype=torch.uint8).view(height, width, 3).permute(2, 0, 1)
        out = torch.nn.functional.interpolate(region.unsqueeze(0), size=(224, 224), mode="bilinear",
                                              antialias=True, align_corners=False)[0]
        batch[k].copy_(out.flip(-1) if plan.flip else out)

    def full(k: int) -> None:
        decode_rgb(payloads[k])

    contenders = {"native": native, "torch resize": torch_resize, "full decode": full}

    def run() -> dict[str, list[float]]:
        torch.set_num_threads(1)  # this thread only: a loader's decode thread or worker
        for fn in contenders.values():
            for k in range(min(50, len(payloads))):
                fn(k)
        ms: dict[str, list[float]] = {name: [] for name in contenders}
        names = list(contenders)
        for r in range(args.rounds):
            for name in names[r % 3:] + names[:r % 3]:
                started = time.perf_counter()
                for k in range(len(payloads)):
                    contenders[name](k)
                ms[name].append((time.perf_counter() - started) / len(payloads) * 1e3)
        return ms

    with ThreadPoolExecutor(1, thread_name_prefix="fastload-decode") as thread:
        ms = thread.submit(run).result()

    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(ms[a], ms[b]))

    result = {
        "packed": str(args.packed), "samples": len(payloads), "rounds": args.rounds,
        "ms_per_sample": ms,
        "native_over_full": ratio("native", "full decode"),
        "torch_resize_over_full": ratio("torch resize", "full decode"),
        "torch_resize_over_native": ratio("torch resize", "native"),
    }
    for name, times in ms.items():
        print(f"{name:>13}: {statistics.median(times):.3f} ms per sample "
              f"(median of {len(times)} rounds)")
    print(f"native / full decode: {result['native_over_full']:.3f}; torch resize / full decode: "
          f"{result['torch_resize_over_full']:.3f}; torch resize / native: "
          f"{result['torch_resize_over_native']:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
