"""Restart markers: train-crop decode of a plain pack vs a `--restart-markers` pack, paired.

    python bench/restart_bench.py bench/data/photos.fl bench/data/photos.rm.fl \\
        --json bench/results/restarts.json

Both packs hold the same photos. The same records (a seeded shuffled sample) get the same
RandomResizedCrop 224 plans; one decode thread (as in the loader: torch's resize on one core)
runs ``decode_crop`` over a slice of them from one pack, then the same slice from the other, for
``--rounds`` rounds. Each round gives a time ratio of the two; the median ratio is the result.
Pairing matters here: this VM's per-core speed drifts by 20 % within minutes, far more than the
difference measured. Also reported: the size of each pack's payload.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import fastload
from fastload.decode.crops import decode_crop
from fastload.decode.images import image_size
from fastload.decode.pipeline import ImagePipeline


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("plain", type=Path, help="fastload pack IMAGES")
    p.add_argument("restarts", type=Path, help="fastload pack IMAGES --restart-markers")
    p.add_argument("--samples", type=int, default=600, help="records sampled (default 600)")
    p.add_argument("--slice", type=int, default=150, help="records per timed slice (default 150)")
    p.add_argument("--rounds", type=int, default=30, help="paired rounds (default 30)")
    p.add_argument("--json", type=Path, help="write the results here")
    return p.parse_args(argv)


def crops(ds: fastload.PackedDataset, indices: list[int],
          pipeline: ImagePipeline) -> list[tuple[bytes, object]]:
    payloads = ds.reader.read_many(indices)
    return [(data, pipeline.plan(i, 0, 0, *image_size(data))) for i, data in zip(indices, payloads)]


def decode_seconds(cases: list[tuple[bytes, object]]) -> float:
    out = np.empty((224, 224, 3), np.uint8)
    started = time.perf_counter()
    for data, plan in cases:
        decode_crop(data, plan, out=out)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plain_ds, restart_ds = fastload.PackedDataset(args.plain), fastload.PackedDataset(args.restarts)
    if len(plain_ds) != len(restart_ds):
        raise SystemExit(f"{args.plain} has {len(plain_ds)} records, {args.restarts} "
                         f"{len(restart_ds)}: pack the same folder twice")
    if not restart_ds.manifest.packed.get("restart_markers"):
        raise SystemExit(f"{args.restarts}: not packed with --restart-markers")
    rng = np.random.default_rng(0)
    indices = [int(i) for i in rng.permutation(len(plain_ds))[:args.samples]]
    pipeline = ImagePipeline(224, train=True)
    plain, restarts = crops(plain_ds, indices, pipeline), crops(restart_ds, indices, pipeline)
    ratios, per_sample = [], {"plain": [], "restarts": []}
    with ThreadPoolExecutor(1, thread_name_prefix="fastload-decode") as thread:
        thread.submit(decode_seconds, plain[:50]).result()  # warm-up: pools, torch set-up
        thread.submit(decode_seconds, restarts[:50]).result()
        for r in range(args.rounds):
            start = r * args.slice % max(1, len(indices) - args.slice + 1)
            part = slice(start, start + args.slice)
            a = thread.submit(decode_seconds, plain[part]).result()
            b = thread.submit(decode_seconds, restarts[part]).result()
            ratios.append(a / b)
            per_sample["plain"].append(a / len(plain[part]))
            per_sample["restarts"].append(b / len(restarts[part]))
    result = {
        "samples": len(indices), "rounds": args.rounds, "slice": args.slice,
        "speedup_median": statistics.median(ratios),
        "speedup_quartiles": statistics.quantiles(ratios, n=4),
        "ms_per_sample_median": {k: 1e3 * statistics.median(v) for k, v in per_sample.items()},
        "payload_mb": {"plain": plain_ds.manifest.total_bytes / 1e6,
                       "restarts": restart_ds.manifest.total_bytes / 1e6},
    }
    print(f"train crop decode, one thread, {args.rounds} paired rounds of {args.slice}: "
          f"plain {result['ms_per_sample_median']['plain']:.3f} ms, restart markers "
          f"{result['ms_per_sample_median']['restarts']:.3f} ms per sample (medians); speed-up "
          f"{result['speedup_median']:.3f}x (quartiles "
          f"{', '.join(f'{q:.3f}' for q in result['speedup_quartiles'])})")
    print(f"payload: plain {result['payload_mb']['plain']:.1f} MB, restart markers "
          f"{result['payload_mb']['restarts']:.1f} MB")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
