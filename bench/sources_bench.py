"""Packing the same photos from each way in, side by side: a folder, WebDataset tars, Parquet, a torch Dataset.

The sources are made once from one ImageFolder tree (``--work`` keeps them between runs): tars of
``--per-tar`` samples in WebDataset's layout (``<key>.jpg`` + ``<key>.cls``), and one Parquet file
with the JPEG bytes in a binary column and the label beside it (row groups of ``--row-group``
rows); the "dataset" row is the folder as an in-memory torch Dataset (``PhotoFiles``) whose items
read each file's bytes, packed with its default worker processes. Every row then packs to LMDB in a fresh Python process, as a user's ``fastload pack``
does, timed around the ``fastload.pack(...)`` call; a warm page cache for every source (each is
read once before the timed runs), the repeats in rotated order, medians reported. The target
(issue 27): every source packs at >= 0.9x the folder's records/s.

    python bench/sources_bench.py bench/data/photos --work bench/data/sources-work --repeats 3 \\
        --json bench/results/sources-$(date +%F)-$(git rev-parse --short HEAD).json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import torch.utils.data

REPO = Path(__file__).resolve().parent.parent
TARGET = 0.9  # each source's records/s over the folder's

PACK_CHILD = """
import json, sys, time
import fastload
src, out, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
as_dataset = options.pop("as_dataset", False)
if as_dataset:  # torch imported before the clock starts, as a training script has it
    sys.path.insert(0, sys.argv[4])
    from sources_bench import PhotoFiles
start = time.perf_counter()
report = fastload.pack(PhotoFiles(src) if as_dataset else src, out, overwrite=True, progress=False, **options)
print(json.dumps({"seconds": time.perf_counter() - start, "num_records": report.num_records,
                  "total_bytes": report.total_bytes, "skipped": report.skipped}))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="an ImageFolder tree of JPEGs (bench/make_photos.py makes one)")
    p.add_argument("--work", type=Path, default=Path("bench/data/sources-work"),
                   help="where the tars, the Parquet file and the packs go (kept: sources are reused)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed rounds of every row first (default 1: the first pack of a run is slower "
                        "for all, as the allocator and the disk's writeback settle)")
    p.add_argument("--per-tar", type=int, default=1000, help="samples per tar (default 1000, ~110 MB)")
    p.add_argument("--row-group", type=int, default=256, help="Parquet rows per row group (default 256)")
    p.add_argument("--rows", default="folder,tars,parquet,dataset", help="which sources (default: all)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    if not args.src.is_dir():
        p.error(f"{args.src}: not a folder; make one with bench/make_photos.py")
    return args


def listing(src: Path) -> list[tuple[Path, int]]:
    """(file, label) in the folder pack's record order: classes sorted, files sorted in each."""
    classes = sorted(d.name for d in src.iterdir() if d.is_dir())
    return [(src / c / name, label) for label, c in enumerate(classes) for name in sorted(os.listdir(src / c))]


class PhotoFiles(torch.utils.data.Dataset):
    """The folder's photos in its pack's order: ``(JPEG bytes, label)``, each file read when asked for."""

    def __init__(self, src: str) -> None:
        self.files = listing(Path(src))

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        path, label = self.files[i]
        return path.read_bytes(), label


def make_tars(files: list[tuple[Path, int]], folder: Path, per_tar: int) -> Path:
    if (folder / "done").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for t in range(0, len(files), per_tar):
        with tarfile.open(folder / f"data-{t // per_tar:06d}.tar", "w") as archive:
            for k, (path, label) in enumerate(files[t:t + per_tar], start=t):
                for ext, data in (("jpg", path.read_bytes()), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{k:08d}.{ext}")
                    info.size = len(data)
                    archive.addfile(info, io.BytesIO(data))
    (folder / "done").touch()
    return folder


def make_parquet(files: list[tuple[Path, int]], path: Path, row_group: int) -> Path | None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return None
    if path.exists():
        return path
    table = pa.table({"jpg": pa.array([f.read_bytes() for f, _ in files], pa.binary()),
                      "label": pa.array([label for _, label in files], pa.int64())})
    pq.write_table(table, str(path) + ".tmp", row_group_size=row_group, compression="none")
    os.replace(str(path) + ".tmp", path)
    return path


def warm(path: Path) -> None:
    for root, _, names in os.walk(path) if path.is_dir() else [(str(path.parent), [], [path.name])]:
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                while f.read(1 << 22):
                    pass


def pack_once(src: str, out: Path, options: dict) -> dict:
    """One pack in a fresh process, its source read into the page cache just before and the last
    pack's writes on disk; the report gains the child's user and system CPU-seconds."""
    shutil.rmtree(out, ignore_errors=True)
    warm(Path(src))  # a row's source may have been pushed out of the cache by the other rows' packs
    os.sync()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run([sys.executable, "-c", PACK_CHILD, src, str(out), json.dumps(options), str(REPO / "bench")],
                          check=False, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"pack of {src} failed (rc {done.returncode}):\n{done.stderr.strip()[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "user_s": after.ru_utime - before.ru_utime,
            "system_s": after.ru_stime - before.ru_stime}


def main(args: argparse.Namespace) -> int:
    args.work.mkdir(parents=True, exist_ok=True)
    files = listing(args.src)
    tars = make_tars(files, args.work / "tars", args.per_tar)
    parquet = make_parquet(files, args.work / "photos.parquet", args.row_group)
    rows: dict[str, tuple[str, dict]] = {"folder": (str(args.src), {}), "tars": (str(tars), {}),
                                         "dataset": (str(args.src), {"as_dataset": True})}
    if parquet is not None:
        rows["parquet"] = (str(parquet), {"image_column": "jpg", "label_column": "label"})
    rows = {name: row for name, row in rows.items() if name in args.rows.split(",")}
    for src, _ in rows.values():
        warm(Path(src))
    times: dict[str, list[float]] = {name: [] for name in rows}
    cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
    reports: dict[str, dict] = {}
    names = list(rows)
    for repeat in range(-args.warmup, args.repeats):
        for name in names[repeat % len(names):] + names[:repeat % len(names)]:
            src, options = rows[name]
            report = pack_once(src, args.work / f"{name}.fl", options)
            if repeat < 0:
                continue
            times[name].append(report["seconds"])
            cpu[name].append((report["user_s"], report["system_s"]))
            reports[name] = report
            print(f"{name:8s} repeat {repeat}: {report['seconds']:.2f} s, CPU user {report['user_s']:.2f} s "
                  f"system {report['system_s']:.2f} s", file=sys.stderr)
    folder_rate = len(files) / statistics.median(times["folder"])
    results = {}
    for name in rows:
        seconds = statistics.median(times[name])
        rate = reports[name]["num_records"] / seconds
        results[name] = {"seconds": seconds, "all_seconds": times[name], "records": reports[name]["num_records"],
                         "records_per_s": rate, "vs_folder": rate / folder_rate,
                         "user_s": statistics.median(u for u, _ in cpu[name]),
                         "system_s": statistics.median(s for _, s in cpu[name]),
                         "meets_target": rate / folder_rate >= TARGET}
        print(f"| {name:8s} | {reports[name]['num_records']:6d} | {seconds:6.2f} s | {rate:7.0f} rec/s | "
              f"{rate / folder_rate:4.2f}x | CPU user {results[name]['user_s']:.2f} s, "
              f"system {results[name]['system_s']:.2f} s |")
    if args.json:
        args.json.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(),
                                         "repeats": args.repeats, "warmup": args.warmup, "results": results}, indent=1))
    return 0 if all(r["meets_target"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(parse_args()))
