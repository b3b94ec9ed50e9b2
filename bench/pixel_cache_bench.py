"""Decode once: the pixel cache against the JPEG path, side by side in one run (issue 45).

    python bench/make_photos.py bench/data/photos --count 2560 --classes 100 --seed 0
    fastload pack bench/data/photos -o bench/data/photos.fl
    python bench/pixel_cache_bench.py bench/data/photos.fl --photos bench/data/photos \\
        --ffcv-python /work/ffcv-venv/bin/python --json bench/results/pixel-cache-DATE-COMMIT.json

Train crop 224 + flip, batch 256, the loader's own settings (fastload.DataLoader's "auto"). Rows,
run in turn for ``--repeats`` rounds (interleaved, so drift and other load hit each alike):

- ``jpeg``: an epoch of the JPEG path (region decode; the same whatever the epoch);
- ``fill``: epoch 1 with the cache filling (a fresh cache folder each round);
- ``cache``: an epoch >= 2 (every image stored).

Each gives samples/s and samples per CPU-second (this process and its children). Then: where one
fill's time goes, crop differences (validation; train by crop scale at several stored sides), disk
per image, each loader's peak memory in a process of its own over 3 epochs, and with
``--ffcv-python`` FFCV's RAW fields at the same stored size (bench/ffcv_raw_row.py). Nothing here
asserts on time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from pixel_cache_quality import fill_parts, train_difference, val_difference  # noqa: E402
from rss_peak import PeakMemory  # noqa: E402

STEP_RATE = 12_000  # samples/s of the ResNet-18-shaped step on the lent H200 (bench/README.md)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dataset", type=Path, help="a fastload pack of the photos")
    p.add_argument("--photos", type=Path, help="the photos' folder (for the FFCV row's .beton)")
    p.add_argument("--work", type=Path, default=BENCH / "data" / "pixel-cache-work", help="cache folders go here")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--quality-records", type=int, default=512, help="records compared for crop differences")
    p.add_argument("--ffcv-python", type=Path, help="python of an environment with ffcv 1.0.2")
    p.add_argument("--ffcv-rounds", type=int, default=4, help="rounds of the cache's and FFCV's rows in turn")
    p.add_argument("--no-memory", action="store_true", help="leave out the peak memory rows (a process each)")
    p.add_argument("--json", type=Path)
    p.add_argument("--child", choices=("jpeg", "cache"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def loader(args: argparse.Namespace, cache: Path | None):
    import fastload

    ds = fastload.PackedDataset(args.dataset, image_size=224, train=True, pixel_cache=cache)
    return fastload.DataLoader(ds, batch_size=args.batch_size, shuffle=True, seed=0)


def epoch(batches) -> dict[str, float]:
    """One pass: samples/s and samples per CPU-second."""
    started, used, n = time.perf_counter(), cpu_seconds(), 0
    for _images, labels in batches:
        n += len(labels)
    return {"samples": n, "samples_per_s": n / (time.perf_counter() - started),
            "samples_per_cpu_s": n / (cpu_seconds() - used)}


def interleaved(args: argparse.Namespace) -> dict[str, list[dict[str, float]]]:
    """The three rows, ``--repeats`` rounds of each in turn (after one warm-up pass of each)."""
    jpeg, full = loader(args, None), loader(args, args.work / "full")
    epoch(jpeg), epoch(full)  # warm-up; fills the "cache" row's folder
    runs: dict[str, list[dict[str, float]]] = {"jpeg": [], "fill": [], "cache": []}
    for r in range(args.repeats):
        runs["jpeg"].append(epoch(jpeg))
        fresh = args.work / f"fill-{r}"
        shutil.rmtree(fresh, ignore_errors=True)
        runs["fill"].append(epoch(loader(args, fresh)))
        shutil.rmtree(fresh, ignore_errors=True)
        runs["cache"].append(epoch(full))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]['samples_per_s']:,.0f}/s" for k, v in runs.items()),
              file=sys.stderr)
    return runs


def child(args: argparse.Namespace) -> int:
    """In a process of its own: three epochs of one loader, its rates and peak memory (one JSON line)."""
    batches = loader(args, args.work / "full" if args.child == "cache" else None)
    with PeakMemory() as peak:
        rates = [epoch(batches) for _ in range(3)]
    print(json.dumps({key: [r[key] for r in rates] for key in ("samples_per_s", "samples_per_cpu_s")}
                     | {"memory": peak.figures()}))
    return 0


def in_process(args: argparse.Namespace, *extra: str, python: str = sys.executable) -> dict:
    done = subprocess.run([python, *extra], capture_output=True, text=True, check=False, timeout=3600)
    if done.returncode:
        raise SystemExit(f"{' '.join(extra[:2])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def disk(args: argparse.Namespace, records: int) -> dict[str, float]:
    import fastload

    cache = fastload.PackedDataset(args.dataset, image_size=224, train=True, pixel_cache=args.work / "full").pixel_cache
    blocks = sum(f.stat().st_blocks * 512 for f in (args.work / "full").rglob("*") if f.is_file())
    jpeg = fastload.PackedDataset(args.dataset).manifest.total_bytes
    return {"cache_bytes_per_image": cache.bytes() / records, "cache_blocks_per_image": blocks / records,
            "jpeg_bytes_per_image": jpeg / records}


def median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def summary(runs: dict[str, list[dict[str, float]]]) -> dict[str, float]:
    """The ratios issue 45 sets targets for, paired round by round, medians."""
    def paired(a: str, b: str, key: str) -> float:
        return statistics.median(x[key] / y[key] for x, y in zip(runs[a], runs[b]))

    per_cpu = {row: median(v, "samples_per_cpu_s") for row, v in runs.items()}
    return {"cache_over_jpeg_samples_per_s": paired("cache", "jpeg", "samples_per_s"),
            "cache_over_jpeg_samples_per_cpu_s": paired("cache", "jpeg", "samples_per_cpu_s"),
            "fill_cpu_over_jpeg_epoch_cpu": paired("jpeg", "fill", "samples_per_cpu_s"),
            "projection_16_cores": {row: 16 * rate for row, rate in per_cpu.items()},
            "projection_16_cores_over_step": {row: 16 * rate / STEP_RATE for row, rate in per_cpu.items()}}


def against_ffcv(rounds: list[dict]) -> dict:
    """FFCV's RAW fields against the pixel cache, epochs >= 2 of each round, paired round by round."""
    def paired(key: str) -> float:
        return statistics.median(statistics.median(r["cache"][key][1:]) / statistics.median(r["ffcv"][key][1:])
                                 for r in rounds)

    return {"rounds": rounds, "ffcv": rounds[0]["ffcv"]["ffcv"], "beton_bytes": rounds[0]["ffcv"]["beton_bytes"],
            "cache_over_ffcv_samples_per_s": paired("samples_per_s"),
            "cache_over_ffcv_samples_per_cpu_s": paired("samples_per_cpu_s"),
            "ffcv_samples_per_s": statistics.median(statistics.median(r["ffcv"]["samples_per_s"][1:]) for r in rounds),
            "peak_rss_mb": {who: max(r[who]["memory"]["rss_mb"] for r in rounds) for who in ("cache", "ffcv")},
            "peak_anon_mb": {who: max(r[who]["memory"]["anon_mb"] for r in rounds) for who in ("cache", "ffcv")}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    if args.child:
        return child(args)
    load_before = os.getloadavg()
    runs = interleaved(args)
    records = runs["jpeg"][0]["samples"]
    result = {
        "bench": "pixel-cache", "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 check=False, cwd=BENCH).stdout.strip(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "loadavg_before": load_before},
        "runs": runs, "summary": summary(runs),
        "fill_ms_per_image": fill_parts(str(args.dataset), min(200, records)),
        "val_difference": val_difference(str(args.dataset), str(args.work / "val"), min(args.quality_records, records)),
        "train_difference_by_scale": train_difference(str(args.dataset), min(args.quality_records, records),
                                                      (256, 320, 384)),
        "disk": disk(args, records),
    }
    me = [str(Path(__file__).resolve()), str(args.dataset), "--work", str(args.work),
          "--batch-size", str(args.batch_size)]
    if not args.no_memory:
        result["memory"] = {"jpeg": in_process(args, *me, "--child", "jpeg")}
        ffcv = [str(BENCH / "ffcv_raw_row.py"), str(args.photos), str(args.work / "photos-raw256.beton"),
                "--batch-size", str(args.batch_size)]
        rounds = []
        for _ in range(args.ffcv_rounds if args.ffcv_python else 1):  # ours and FFCV's in turn, a process each
            rounds.append({"cache": in_process(args, *me, "--child", "cache")})
            if args.ffcv_python:
                rounds[-1]["ffcv"] = in_process(args, *ffcv, python=str(args.ffcv_python))
        result["memory"]["cache"] = rounds[0]["cache"]
        if args.ffcv_python:
            result["ffcv"] = against_ffcv(rounds)
    result["machine"]["loadavg_after"] = os.getloadavg()
    print(json.dumps(result["summary"], indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
