"""Packing the same photos locally and on Ray, side by side: ``fastload.pack`` (read threads for 2
cores), ``fastload pack --ray`` on one Ray node of 2 CPUs, and on a ``ray.cluster_utils.Cluster``
of two nodes of 1 CPU each (issue 28).

Each row runs in a fresh Python process, the rows in rotated order each repeat, medians reported.
A Ray row starts its Ray first (``ray.init(num_cpus=2)``, or the two-node cluster) and times the
pack alone (``converters.cluster.ray_source.pack_on_ray``: listing, plain Ray tasks of a few
shard-sized parts each, finalize), as a user's cluster is running already; the start is reported
beside it. No warm-up task runs before the timed pack: a job's first pack waits for Ray's worker
processes (started by ``ray.init``, importing fastload on their first task; a fixed cost per job,
which every ``fastload pack --ray`` is). Each child then packs ``--again`` more times (the same
job, its workers warm) and reports their median as "again": the per-record cost alone. One pack
of 1.1 GB is a second or so, and on this VM the kernel's cost of writing it swings from pack to
pack (0.7-1.3 system CPU-s for the same Ray pack; the later packs of a job settle), so one later
pack was too few. The page cache is warm for every row (SRC is read once before the timed runs).

Memory just freed: on this VM, writing ~600 MB of shards into page-cache pages that have sat free
for a few seconds costs up to 1.7 s more than writing into pages freed a moment before (likely the
host taking idle guest memory back, each first touch faulting it in again; the time shows in the
kernel's copy into the page cache). Measured: a local pack right after deleting the last pack's
output 1.0 s, the same pack 5 s after it 1.7 s. So each child deletes its row's output of the run
before just before its timed first pack, the local row's too: every row writes into memory freed
a moment before, and Ray's start (~2.5 s) no longer ages it. Targets: the Ray pack takes <= 1.25x
the local pack's time at equal cores, and records/s per CPU stays flat from one node to two.

Where a Ray pack's time goes (measured 2026-11-26): each task packs its parts with the local
pack's own loop, so a record's work in user space is the local pack's (in one process ~1.0
CPU-s per 10,000 photos either way). What is left: the kernel's copy of the shards into the page
cache, which on this VM costs 3-10x more or less with the free pages it is given (perf, the same
1.1 GB: 0.24-0.43 CPU-s in the Ray workers, 0.08 s in the local pack; 0.76 s in a local pack right
after 1.2 GB of anonymous memory was touched and freed, which then took 1.76 s instead of 1.02 s);
Ray handing a CPU its next task (0.04-0.13 s); its daemons (~0.1 CPU-s); and its workers'
niceness, 15 by default: on a busy machine anything at 0 runs first. The machine's user, nice,
system and idle seconds during each row's second pack are printed under the table.

    python bench/ray_pack_bench.py bench/data/photos --repeats 2 \\
        --json bench/results/ray-pack-$(date +%F)-$(git rev-parse --short HEAD).json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET = 1.25  # the Ray pack's seconds over the local pack's, at equal cores
ROWS = {"local": "fastload.pack, 2 cores", "ray-1x2": "Ray: 1 node x 2 CPUs", "ray-2x1": "Ray: 2 nodes x 1 CPU"}
CPUS = 2

CHILD = """
import json, os, shutil, sys, time
mode, src, out, shard_size, agains = *sys.argv[1:5], int(sys.argv[5])
def machine():  # the machine's CPU-seconds so far: user, nice (Ray's workers run at niceness 15), system, idle
    if not os.path.exists("/proc/stat"):
        return [0.0] * 4
    ticks = os.sysconf("SC_CLK_TCK")
    return [int(v) / ticks for v in open("/proc/stat").readline().split()[1:5]]
started = time.perf_counter()
if mode == "local":
    import fastload
    def pack():
        return fastload.pack(src, out, overwrite=True, progress=False, workers=8, shard_size=shard_size)
else:
    import ray
    from fastload.config import MAX_FILE_SIZE, MAX_PIXELS
    from fastload.converters.cluster.ray_source import pack_on_ray
    cluster = None
    if mode == "ray-1x2":
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    else:
        from ray.cluster_utils import Cluster
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
    def pack():
        return pack_on_ray(src, out, address=None, overwrite=True, shard_size=shard_size, progress=False,
                           max_pixels=MAX_PIXELS, max_file_size=MAX_FILE_SIZE)
shutil.rmtree(out, ignore_errors=True)  # here, not before the start: see "Memory just freed" in the docstring
start = time.perf_counter()
report = pack()  # the first pack of the job: Ray starts its worker processes
first = time.perf_counter()
warm = []  # each later pack of the same job, its workers warm: (seconds, the machine's CPU-seconds)
for _ in range(agains):
    shutil.rmtree(out)
    again, before = time.perf_counter(), machine()
    pack()
    ended, after = time.perf_counter(), machine()
    warm.append((ended - again, [round(b - a, 2) for a, b in zip(before, after)]))
warm.sort(key=lambda w: w[0])
median = warm[len(warm) // 2]
if mode != "local":
    ray.shutdown()
    if cluster is not None:
        cluster.shutdown()
print("RESULT " + json.dumps({"seconds": first - start, "warm_seconds": median[0], "start_seconds": start - started,
                              "warm_machine_cpu": median[1], "warm_runs": [w[0] for w in warm],
                              "num_records": report.num_records, "num_shards": report.num_shards,
                              "total_bytes": report.total_bytes}))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="an ImageFolder tree of JPEGs (bench/make_photos.py makes one)")
    p.add_argument("--work", type=Path, default=Path("bench/data/ray-pack-work"),
                   help="where the packs (and a --limit subset, hard links) go")
    p.add_argument("--limit", type=int, default=None, help="pack the first N photos of SRC (default: all)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--again", type=int, default=3,
                   help="packs of the same job after its first; 'again' is their median (default 3)")
    p.add_argument("--shard-size", default="64MB", help="both packs' shard size (Ray: ~one task each; default 64MB)")
    p.add_argument("--rows", default=",".join(ROWS), help=f"which rows (default: {','.join(ROWS)})")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    if not args.src.is_dir():
        p.error(f"{args.src}: not a folder; make one with bench/make_photos.py")
    unknown = set(args.rows.split(",")) - set(ROWS)
    if unknown:
        p.error(f"--rows: unknown {sorted(unknown)}; choose from {', '.join(ROWS)}")
    return args


def source(src: Path, work: Path, limit: int | None) -> Path:
    """SRC, or a tree of hard links to its first ``limit`` photos in pack order (classes, then names)."""
    if limit is None:
        return src
    subset = work / f"photos-{limit}"
    if subset.is_dir() and sum(1 for _ in subset.rglob("*.jpg")) == limit:
        return subset
    shutil.rmtree(subset, ignore_errors=True)
    files = [src / c / name for c in sorted(d.name for d in src.iterdir() if d.is_dir())
             for name in sorted(os.listdir(src / c))][:limit]
    for path in files:
        (subset / path.parent.name).mkdir(parents=True, exist_ok=True)
        os.link(path, subset / path.parent.name / path.name)
    return subset


def warm(src: Path) -> None:
    """Every file read once: each row then reads from the page cache."""
    for path in src.rglob("*"):
        if path.is_file():
            path.read_bytes()


def run_row(mode: str, src: Path, out: Path, shard_size: str, agains: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(src), str(out), shard_size, str(agains)],
                          capture_output=True, text=True, check=False)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"{mode}: exited {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(line.removeprefix("RESULT "))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    src = source(args.src, args.work, args.limit)
    warm(src)
    rows = args.rows.split(",")
    runs: dict[str, list[dict]] = {mode: [] for mode in rows}
    loads = [os.getloadavg()[0]]
    for repeat in range(args.repeats):
        for mode in rows[repeat % len(rows):] + rows[:repeat % len(rows)]:  # rotated
            result = run_row(mode, src, args.work / f"{mode}.fl", args.shard_size, args.again)
            runs[mode].append(result)
            print(f"  repeat {repeat}: {mode:8s} {result['seconds']:7.2f} s, again {result['warm_seconds']:.2f} s (start {result['start_seconds']:.1f} s, "
                  f"{result['num_shards']} shards)", file=sys.stderr)
        loads.append(os.getloadavg()[0])
    table = {}
    for mode in rows:
        seconds = statistics.median(r["seconds"] for r in runs[mode])
        records = runs[mode][0]["num_records"]
        again = statistics.median(r["warm_seconds"] for r in runs[mode])
        table[mode] = {"what": ROWS[mode], "seconds": seconds, "records_per_s": records / seconds,
                       "warm_seconds": again, "warm_records_per_s_per_cpu": records / again / CPUS,
                       "records_per_s_per_cpu": records / seconds / CPUS,
                       "start_seconds": statistics.median(r["start_seconds"] for r in runs[mode]),
                       "num_records": records, "num_shards": runs[mode][0]["num_shards"],
                       "warm_machine_cpu": [statistics.median(r["warm_machine_cpu"][k] for r in runs[mode])
                                            for k in range(4)],
                       "runs": [[r["seconds"], r["warm_seconds"]] for r in runs[mode]]}
    if "local" in table:
        for row in table.values():
            row["vs_local"] = row["seconds"] / table["local"]["seconds"]
            row["warm_vs_local"] = row["warm_seconds"] / table["local"]["warm_seconds"]
    print("\n| row | seconds | records/s | records/s per CPU | time vs local | again, same process: seconds | "
          "records/s per CPU | time vs local | Ray start s | shards |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode, row in table.items():
        start = f"{row['start_seconds']:.1f}" if mode != "local" else "-"
        print(f"| {row['what']} | {row['seconds']:.2f} | {row['records_per_s']:.0f} | "
              f"{row['records_per_s_per_cpu']:.0f} | {row.get('vs_local', 0):.2f}x | {row['warm_seconds']:.2f} | "
              f"{row['warm_records_per_s_per_cpu']:.0f} | {row.get('warm_vs_local', 0):.2f}x | {start} | "
              f"{row['num_shards']} |")
    print("\nthe machine's CPU-seconds while each row packed again (medians; other processes' too): "
          "user, nice (Ray's workers: niceness 15), system, idle")
    for row in table.values():
        print(f"  {row['what']}: {', '.join(f'{v:.2f}' for v in row['warm_machine_cpu'])}")
    verdicts = {}
    if "local" in table:
        verdicts["ray_time_vs_local_at_2_cpus"] = {m: table[m]["vs_local"] <= TARGET for m in table if m != "local"}
        verdicts["warm_ray_time_vs_local_at_2_cpus"] = {m: table[m]["warm_vs_local"] <= TARGET for m in table
                                                        if m != "local"}
    if "ray-1x2" in table and "ray-2x1" in table:
        verdicts["per_cpu_two_nodes_over_one"] = (table["ray-2x1"]["records_per_s_per_cpu"]
                                                  / table["ray-1x2"]["records_per_s_per_cpu"])
    print(f"\nload average (1 min) before and after each repeat: {', '.join(f'{x:.2f}' for x in loads)}")
    print(f"targets: Ray time <= {TARGET}x local: {verdicts.get('ray_time_vs_local_at_2_cpus')} (again, warm: "
          f"{verdicts.get('warm_ray_time_vs_local_at_2_cpus')}); "
          f"per-CPU rate, two nodes over one: {verdicts.get('per_cpu_two_nodes_over_one', float('nan')):.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=False).stdout.strip()
        args.json.write_text(json.dumps({
            "command": " ".join(["python", *sys.argv]), "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "cpus": os.cpu_count(), "limit": args.limit,
            "shard_size": args.shard_size, "repeats": args.repeats, "again": args.again, "load_average": loads,
            "rows": table, "verdicts": verdicts}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
