"""Where a `pack --ray`'s time goes, in one process: the same photos packed by ``fastload.pack``,
by the Ray task function on a fork pool of 2 processes, and by the same function on 2 warm Ray
workers, interleaved, each repeat in rotated order (issue 28).

The task rows run ``converters.cluster.ray_tasks.write_parts`` on the slices ``pack --ray`` would
deal (4 for 2 CPUs) and nothing else: no listing, plan or finalize on the driver (those are timed
apart, as ``driver``). Every row deletes its last output just before it packs (bench/ray_pack_bench.py
says why). The machine's user (with nice), system and idle CPU-seconds are reported beside each.

    python bench/ray_task_cost.py bench/data/photos --repeats 4 \\
        --json bench/results/ray-task-cost-$(date +%F)-$(git rev-parse --short HEAD).json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROWS = ("local", "pool", "ray")


def machine() -> list[float]:
    """The machine's CPU-seconds so far: user + nice, system, idle + iowait."""
    ticks = os.sysconf("SC_CLK_TCK")
    user, nice, system, idle, iowait = (int(v) / ticks for v in open("/proc/stat").readline().split()[1:6])
    return [user + nice, system, idle + iowait]


def write_slice(job: tuple[Any, list[Any], Any]) -> int:
    """One task's work, as a Ray worker does it."""
    from fastload.converters.cluster.ray_tasks import write_parts

    write_parts(*job)
    return os.getpid()


def plan(src: Path, work: Path) -> tuple[list[tuple[Any, list[Any], Any]], float]:
    """``pack --ray``'s slices of ``src`` for 2 CPUs (its tasks write under ``work``), and the
    seconds the driver took to list and plan them."""
    from fastload.config import MAX_FILE_SIZE, MAX_PIXELS
    from fastload.converters.cluster.cluster_pack import ClusterPack
    from fastload.converters.cluster.ray_plan import IMAGE, KEY, LABEL, ORDER, part_source, plan_tasks
    from fastload.converters.packing.options import check_options
    from fastload.converters.sources.items import normalize_extensions
    from fastload.converters.sources.listing import list_to_pack

    started = time.perf_counter()
    options = check_options("lmdb", "64MB", None, "fail", None, None, "header", MAX_PIXELS, False, MAX_FILE_SIZE,
                            "rows")
    exts = normalize_extensions(None)
    listing = list_to_pack(src, None, src, layout="auto", extensions=exts, on_error="fail", options=options,
                           sidecars=False, file_columns=())
    pack = ClusterPack(work, image=IMAGE, label=LABEL, key=KEY, order=ORDER, fields=dict(listing.fields),
                       classes=listing.classes, shard_size="64MB", overwrite=True)
    slices = plan_tasks(listing, pack.shard_bytes, 2)
    seconds = time.perf_counter() - started
    pack.start()
    source = part_source(listing, exts)
    return [(source, s.parts, pack.settings) for s in slices], seconds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="an ImageFolder tree of JPEGs (bench/make_photos.py makes one)")
    p.add_argument("--work", type=Path, default=Path("bench/data/ray-task-cost"))
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    import ray

    import fastload

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    jobs, driver = plan(args.src, args.work / "parts.fl")
    parts = Path(jobs[0][2].work)
    local = args.work / "local.fl"
    pool = multiprocessing.get_context("fork").Pool(2)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    from fastload.converters.cluster.ray_tasks import task_options

    task = ray.remote(**task_options())(write_slice)  # the pack's own options (its workers' malloc arenas)

    def clean() -> None:
        for entry in parts.iterdir():
            if not entry.name.startswith("."):
                shutil.rmtree(entry)
        shutil.rmtree(local, ignore_errors=True)

    run = {"local": lambda: fastload.pack(args.src, local, overwrite=True, progress=False, shard_size="64MB"),
           "pool": lambda: pool.map(write_slice, jobs, chunksize=1),
           "ray": lambda: ray.get([task.remote(job) for job in jobs])}
    run["pool"](), run["ray"]()  # the workers started and warm, as a job's later packs find them
    rows: dict[str, list[list[float]]] = {mode: [] for mode in ROWS}
    loads = [os.getloadavg()[0]]
    for repeat in range(args.repeats):
        for mode in ROWS[repeat % 3:] + ROWS[:repeat % 3]:
            clean()
            before, started = machine(), time.perf_counter()
            run[mode]()
            seconds, after = time.perf_counter() - started, machine()
            rows[mode].append([seconds, *(round(b - a, 2) for a, b in zip(before, after))])
        loads.append(os.getloadavg()[0])
    clean()
    ray.shutdown()
    pool.close()
    table = {mode: {"seconds": statistics.median(r[0] for r in runs),
                    "user_system_idle": [statistics.median(r[k] for r in runs) for k in (1, 2, 3)],
                    "runs": runs} for mode, runs in rows.items()}
    print("| row | seconds (median) | vs local | machine user / system / idle CPU-s |\n|---|---:|---:|---|")
    for mode, row in table.items():
        print(f"| {mode} | {row['seconds']:.2f} | {row['seconds'] / table['local']['seconds']:.2f}x | "
              f"{' / '.join(f'{v:.2f}' for v in row['user_system_idle'])} |")
    print(f"driver's listing and plan (outside the task rows): {driver:.2f} s; "
          f"load before and after each repeat: {', '.join(f'{x:.2f}' for x in loads)}")
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=False).stdout.strip()
        args.json.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "commit": commit,
                                         "date": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": table,
                                         "driver_seconds": driver, "load_average": loads}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
