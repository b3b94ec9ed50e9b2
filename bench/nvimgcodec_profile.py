"""Where a GPU-decoded batch's time goes: read + plan, parse, nvImageCodec's decode, the resample.

Needs a CUDA device. Runs the stages of ``backend="nvimgcodec"`` one after another on batches of a
packed dataset (each stage synchronised, so each time is its own), for several decoder set-ups:
region decode or whole images, nvImageCodec's backends (the hardware JPEG engines, CUDA, hybrid),
its options. Prints the median milliseconds per batch of each stage, and the rate the decode
stage alone would allow.

    python bench/nvimgcodec_profile.py PACKED --batches 12 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

import fastload
from fastload.backends.crop_resample import resample_into
from fastload.backends.nvimgcodec import NvImageCodecBackend
from fastload.backends.nvimgcodec_decoder import RegionDecoder
from fastload.backends.planned import read_and_plan

VARIANTS = {
    "default, regions": ({}, True),
    "default, whole images": ({}, False),
    "roi fancy upsampling on, regions": ({"options": "nvjpeg_cuda_decoder:enable_roi_fancy_upsampling=1"}, True),
    "hardware engines only, whole images": ({"backends": ["HW_GPU_ONLY"]}, False),
    "hardware engines only, regions": ({"backends": ["HW_GPU_ONLY"]}, True),
    "CUDA only, regions": ({"backends": ["GPU_ONLY"]}, True),
    "hybrid only, regions": ({"backends": ["HYBRID_CPU_GPU"]}, True),
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


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    ds = fastload.PackedDataset(args.packed, image_size=args.image_size, train=True)
    tail = NvImageCodecBackend(ds, batch_size=args.batch_size, device=device, mean=None, std=None)
    out_h, out_w = ds.pipeline.out_size
    keys = [[(i, 0, 0) for i in range(b * args.batch_size, (b + 1) * args.batch_size)]
            for b in range((args.batches + 2))]
    stream = torch.cuda.Stream() if device.type == "cuda" else None
    results = {}
    for name in args.variants:
        settings, regions_only = VARIANTS[name]
        try:
            decoder = RegionDecoder(device, len(os.sched_getaffinity(0)), **settings)
        except RuntimeError as exc:
            print(f"{name}: no decoder ({exc})")
            continue
        times: dict[str, list[float]] = {"read+plan": [], "parse": [], "decode": [], "resample": []}
        failed = 0
        for b, batch_keys in enumerate(keys):
            clock = time.perf_counter()
            batch = read_and_plan(ds, batch_keys)
            t_read = time.perf_counter() - clock
            clock = time.perf_counter()
            parsed = [decoder.parse(p) for p in batch.payloads]
            ks = [k for k, c in enumerate(parsed) if c is not None]
            tail.whole_images = not regions_only
            regions, crops = tail._crops(batch, ks)
            t_parse = time.perf_counter() - clock
            clock = time.perf_counter()
            with torch.cuda.stream(stream):
                decoded = decoder.decode([parsed[k] for k in ks], regions, stream)
            _synchronize(stream)
            t_decode = time.perf_counter() - clock
            kept = [j for j, d in enumerate(decoded) if d is not None]
            failed += len(ks) - len(kept)
            clock = time.perf_counter()
            with torch.cuda.stream(stream):
                images = torch.empty((len(ks), 3, out_h, out_w), dtype=torch.uint8, device=device)
                resample_into(images, kept, [decoded[j] for j in kept], [crops[j] for j in kept])
            _synchronize(stream)
            t_resample = time.perf_counter() - clock
            if b >= 2:
                for key, value in zip(times, (t_read, t_parse, t_decode, t_resample)):
                    times[key].append(1000 * value)
        row = {key: statistics.median(v) for key, v in times.items()}
        row["decode_alone_samples_per_s"] = args.batch_size / (row["decode"] / 1000)
        row["failed"] = failed
        results[name] = row
        print(f"{name:38s} " + "  ".join(f"{k} {v:6.1f} ms" for k, v in row.items() if k in times)
              + f"  → decode alone {row['decode_alone_samples_per_s']:6.0f}/s, failed {failed}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(0) if stream else "cpu", "cores": len(os.sched_getaffinity(0)),
                                         "args": {k: str(v) for k, v in vars(args).items()}, "variants": results},
                                        indent=1))


def _synchronize(stream: torch.cuda.Stream | None) -> None:
    if stream is not None:
        stream.synchronize()


if __name__ == "__main__":
    main()
