"""Where a GPU-decoded batch's time goes: read + plan, parse, decode, resample, alone and in the pipeline.

Needs a CUDA device (``--device cpu``: a dry run on nvImageCodec's CPU codecs). Two measurements on
batches of a packed dataset:

- ``stages``: each stage of ``backend="nvimgcodec"`` run alone, one after the other, synchronised
  (each time its own), for each engine set-up (hardware engines first, CUDA alone, hardware alone),
  and the rate the decode alone would allow.
- ``pipeline``: the loader itself, data alone, its stages traced (``StageTrace``) while they run
  at once: the median time of each stage per batch, how much of the wall time the stages
  overlapped, and the samples per second delivered.

    python bench/nvimgcodec_profile.py PACKED --batches 12 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

import fastload
from fastload.backends.crop_resample import resample_into
from fastload.backends.decode_stage import DecodeStage
from fastload.backends.nvimgcodec_decoder import EngineDecoders
from fastload.backends.planned import read_and_plan
from fastload.backends.stage_trace import StageTrace

VARIANTS = {
    "hardware engines first, CUDA for the rest": None,
    "CUDA alone": ("cuda",),
    "hardware engines alone": ("hardware",),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("packed", type=Path)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batches", type=int, default=12, help="timed batches per set-up, after 2")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--device", default="cuda", help="cpu: a dry run of the script on nvImageCodec's CPU codecs")
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def stages(args: argparse.Namespace, ds: Any, device: torch.device, only: tuple[str, ...] | None) -> dict[str, Any]:
    """Each stage alone, synchronised: median milliseconds per batch."""
    decoders = EngineDecoders(device, len(os.sched_getaffinity(0)))
    if only is not None:
        if not set(only) <= set(decoders.engines) and device.type == "cuda":
            return {"missing": f"this GPU has {decoders.engines}"}
        decoders.by_engine = {e: d for e, d in decoders.by_engine.items() if e in only} or decoders.by_engine
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None
    decode = DecodeStage(ds, decoders, stream, whole_images=device.type == "cuda")
    times: dict[str, list[float]] = {"read+plan": [], "decode": [], "resample": []}
    for b in range(args.batches + 2):
        keys = [(i % len(ds), 0, 0) for i in range(b * args.batch_size, (b + 1) * args.batch_size)]
        clock = time.perf_counter()
        batch = read_and_plan(ds, keys)
        t_read = time.perf_counter() - clock
        clock = time.perf_counter()
        decoded = decode(b, batch)  # parse, route, decode, and the resample's plan on the host
        _synchronize(stream)
        t_decode = time.perf_counter() - clock
        clock = time.perf_counter()
        with torch.cuda.stream(stream):  # None (the CPU): no stream
            out = torch.empty((len(batch.indices), 3, *ds.pipeline.out_size), dtype=torch.uint8, device=device)
            resample_into(out, [image.pixels for image in decoded.images], decoded.chunks)
        _synchronize(stream)
        t_resample = time.perf_counter() - clock
        if b >= 2:
            for key, value in zip(times, (t_read, t_decode, t_resample)):
                times[key].append(1000 * value)
    row: dict[str, Any] = {key: statistics.median(v) for key, v in times.items()}
    row["decode_alone_samples_per_s"] = args.batch_size / (row["decode"] / 1000)
    row["engines"] = list(decoders.engines)
    return row


def pipeline(args: argparse.Namespace, ds: Any, device: torch.device) -> dict[str, Any]:
    """The loader running its stages at once, traced."""
    loader = fastload.DataLoader(ds, batch_size=args.batch_size, shuffle=True, drop_last=True, backend="nvimgcodec",
                                 device=device, num_workers=0)
    trace = StageTrace()
    loader._tail.trace = trace
    it, done = iter(loader), 0
    next(it), next(it)  # started
    start = time.perf_counter()
    for images, _ in it:
        images.float().sum()  # the loop's own work on its stream
        done += 1
        if done >= args.batches:
            break
    _synchronize(torch.cuda.current_stream(device) if device.type == "cuda" else None)
    wall = time.perf_counter() - start
    del it
    busy = {stage: 1000 * statistics.median(seconds[2:] or seconds) for stage, seconds in trace.seconds().items()}
    return {"stage_ms": busy, "samples_per_s": done * args.batch_size / wall,
            "stages_busy_over_wall": sum(busy.values()) * done / 1000 / wall, "counts": loader.stats()}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    ds = fastload.PackedDataset(args.packed, image_size=args.image_size, train=True)
    variants = {}
    for name in args.variants:
        row = variants[name] = stages(args, ds, device, VARIANTS[name])
        if "missing" in row:
            print(f"{name:42s} not here: {row['missing']}")
            continue
        print(f"{name:42s} " + "  ".join(f"{k} {row[k]:6.1f} ms" for k in ("read+plan", "decode", "resample"))
              + f"  → decode alone {row['decode_alone_samples_per_s']:6.0f}/s ({', '.join(row['engines'])})", flush=True)
    piped = pipeline(args, ds, device)
    print("pipeline: " + ", ".join(f"{k} {v:.1f} ms" for k, v in piped["stage_ms"].items())
          + f"; {piped['samples_per_s']:.0f} samples/s, the stages busy {piped['stages_busy_over_wall']:.1f}× the wall time")
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                                         "cores": len(os.sched_getaffinity(0)),
                                         "args": {k: str(v) for k, v in vars(args).items()},
                                         "variants": {k: v for k, v in variants.items() if "missing" not in v},
                                         "pipeline": piped}, indent=1))


def _synchronize(stream: torch.cuda.Stream | None) -> None:
    if stream is not None:
        stream.synchronize()


if __name__ == "__main__":
    main()
