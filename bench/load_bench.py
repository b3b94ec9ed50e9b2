"""Loading benchmark: ImageFolder + torch DataLoader vs fastload, side by side in one run.

    python bench/load_bench.py bench/data/photos --packed-lmdb bench/data/photos.fl \
        --packed-hdf5 bench/data/photos.h5.fl --json bench/results/load.json

Rows (same images, same batch size, train pipeline RandomResizedCrop 224 + flip, uint8 batches):
baseline ImageFolder-style Dataset with torch's DataLoader at its defaults and at hand-tuned
settings; fastload on LMDB and HDF5 with auto settings; the machine's JPEG decode ceiling;
shuffled raw record reads with a cold page cache vs small files and vs sequential disk reads.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import fastload
from fastload.config import available_cpus
from fastload.transforms import TrainCrop

IMAGE_SIZE = 224


class ImageFolderBaseline(torch.utils.data.Dataset):
    """What users have today: torchvision-style ImageFolder + RandomResizedCrop + flip + to uint8 tensor."""

    def __init__(self, root: Path) -> None:
        classes = sorted(d.name for d in root.iterdir() if d.is_dir())
        self.samples = [(str(p), label) for label, c in enumerate(classes)
                        for p in sorted((root / c).iterdir())]
        self.crop = TrainCrop(IMAGE_SIZE)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        plan = self.crop.sample(img.width, img.height, np.random.default_rng())
        left, top, w, h = plan.box
        img = img.resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR, box=(left, top, left + w, top + h))
        if plan.flip:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1), label


def run_loader(loader, max_batches: int, warmup: int = 2) -> dict:
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    n, started = 0, time.perf_counter()
    for k, (images, _) in enumerate(it):
        n += len(images)
        if k + 1 >= max_batches:
            break
    elapsed = time.perf_counter() - started
    del it
    return {"samples_per_s": n / elapsed, "samples": n, "seconds": elapsed}


def median_rate(make, repeats: int, batches: int) -> dict:
    runs = [run_loader(make(), batches) for _ in range(repeats)]
    rates = [r["samples_per_s"] for r in runs]
    return {"samples_per_s": statistics.median(rates), "runs": rates}


def decode_ceiling(files: list[str], seconds: float = 3.0) -> float:
    """Full-size decode-only rate on one core (images/s)."""
    blobs = [open(f, "rb").read() for f in files[:200]]
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        Image.open(io.BytesIO(blobs[n % len(blobs)])).convert("RGB")
        n += 1
    return n / (time.perf_counter() - started)


def drop_cache(paths) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def cold_reads(files: list[str], packed: Path, count: int, threads: int) -> dict:
    """Shuffled raw reads with a cold page cache: small files vs packed records vs sequential disk."""
    from concurrent.futures import ThreadPoolExecutor

    rng = random.Random(0)
    chosen = rng.sample(range(len(files)), min(count, len(files)))
    drop_cache(files)
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        nbytes = sum(pool.map(lambda i: len(open(files[i], "rb").read()), chosen))
    small = nbytes / 1e6 / (time.perf_counter() - started)

    ds = fastload.PackedDataset(packed)
    shards = [packed / s.file for s in ds.manifest.shards]
    drop_cache(shards)
    batches = [chosen[k:k + 64] for k in range(0, len(chosen), 64)]
    started = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        nbytes = sum(sum(map(len, b)) for b in pool.map(ds.reader.read_many, batches))
    packed_rate = nbytes / 1e6 / (time.perf_counter() - started)

    drop_cache(shards)
    started, nbytes = time.perf_counter(), 0
    for shard in shards:
        with open(shard, "rb", buffering=0) as f:
            while chunk := f.read(8 << 20):
                nbytes += len(chunk)
    sequential = nbytes / 1e6 / (time.perf_counter() - started)
    return {"small_files_mb_s": small, "packed_mb_s": packed_rate, "sequential_mb_s": sequential,
            "records": len(chosen), "threads": threads}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("images", type=Path)
    p.add_argument("--packed-lmdb", type=Path, required=True)
    p.add_argument("--packed-hdf5", type=Path)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=25)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cold-records", type=int, default=3000)
    p.add_argument("--json", type=Path)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    cores = available_cpus()
    torch.set_num_threads(1)
    base = ImageFolderBaseline(args.images)
    files = [p for p, _ in base.samples]
    rows: dict[str, dict] = {}
    bs = args.batch_size
    rows["torch default (num_workers=0)"] = median_rate(
        lambda: torch.utils.data.DataLoader(base, batch_size=bs, shuffle=True), 1, max(4, args.batches // 4))
    best = None
    for workers in (cores, cores + 1, 2 * cores):
        for pf in (2, 4):
            key = f"torch tuned (num_workers={workers}, prefetch_factor={pf}, persistent)"
            rows[key] = median_rate(lambda: torch.utils.data.DataLoader(
                base, batch_size=bs, shuffle=True, num_workers=workers, prefetch_factor=pf,
                persistent_workers=True), args.repeats, args.batches)
            if best is None or rows[key]["samples_per_s"] > rows[best]["samples_per_s"]:
                best = key
    for name, path in (("lmdb", args.packed_lmdb), ("hdf5", args.packed_hdf5)):
        if path is None:
            continue
        ds = fastload.PackedDataset(path, image_size=IMAGE_SIZE, train=True)
        loader_settings = fastload.DataLoader(ds, batch_size=bs, shuffle=True).settings
        rows[f"fastload {name} (auto: {loader_settings.mode}, {loader_settings.num_workers} workers)"] = median_rate(
            lambda: fastload.DataLoader(ds, batch_size=bs, shuffle=True), args.repeats, args.batches)
        for workers in (cores,):
            rows[f"fastload {name} (num_workers={workers}, processes)"] = median_rate(
                lambda: fastload.DataLoader(ds, batch_size=bs, shuffle=True, num_workers=workers,
                                            persistent_workers=True), args.repeats, args.batches)
    ceiling_one = decode_ceiling(files)
    baseline_best = rows[best]["samples_per_s"]
    report = {"machine": {"cores": cores, "python": sys.version.split()[0], "torch": torch.__version__},
              "batch_size": bs, "rows": rows, "best_torch": best,
              "decode_ceiling": {"per_core": ceiling_one, "cores": cores, "total": ceiling_one * cores},
              "cold_reads": cold_reads(files, args.packed_lmdb, args.cold_records, 16),
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    print(f"| loader | samples/s | vs best torch | vs decode ceiling ({ceiling_one * cores:.0f}/s) |")
    print("|---|---:|---:|---:|")
    for name, r in rows.items():
        rate = r["samples_per_s"]
        print(f"| {name} | {rate:.0f} | {rate / baseline_best:.2f}x | {rate / (ceiling_one * cores):.0%} |")
    c = report["cold_reads"]
    print(f"\ncold shuffled raw reads ({c['records']} records, {c['threads']} in flight): small files "
          f"{c['small_files_mb_s']:.0f} MB/s, packed LMDB {c['packed_mb_s']:.0f} MB/s "
          f"({c['packed_mb_s'] / c['small_files_mb_s']:.1f}x), sequential disk {c['sequential_mb_s']:.0f} MB/s "
          f"({c['packed_mb_s'] / c['sequential_mb_s']:.0%})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
