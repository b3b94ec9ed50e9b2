"""Decode threads benchmark: the auto loader against every explicit decode-thread count, paired.

    python bench/threads_bench.py bench/data/photos.rm.fl --duration 5 --repeats 5 \\
        --json bench/results/threads.json

Issue 15, item 5: "auto within 5 % of the best explicit setting". Every row is
``fastload.DataLoader(PackedDataset(path, image_size=224, train=True, ...), batch_size=64,
shuffle=True)`` (RandomResizedCrop 224 + flip, uint8 batches), warm page cache:

* ``auto``: the defaults (threads mode; ``decode_threads=None``).
* ``threads=N`` for each ``--threads`` N: ``PackedDataset(..., decode_threads=N)``, threads mode.
* ``proposed rule``: ``decode_threads=proposed_decode_threads(...)`` (below), a candidate for
  the default in ``fastload/samples/reading.py`` (``PackedDataset.decoder``), measured beside
  the others.
* ``2 workers`` (``--workers``): ``num_workers=cores``, persistent workers, one decode thread
  each (the default inside a worker).

Each repeat runs every row once, in an order rotated by one row per repeat, so a burst of load
from another process hits one repeat of every row rather than every repeat of one. A row builds a
fresh dataset and loader, runs untimed for ``--warmup`` seconds (thread pools, worker start, file
handles), then is timed batch by batch for ``--duration`` seconds without a pause (so the
prefetch queue is in its steady state at both ends); a row never crosses an epoch end (10,000
photos are ~6 s at 1,600/s: the timed window ends early at the epoch's last full batch, and the
JSON says so). Reported: the median of the repeats' rates, and each row's rate over the best
``threads=N`` row *of the same repeat* (the paired ratio), median and range. CPU seconds of the
process and its workers over the timed window (not the ``--background-load`` processes), how
the decode threads spent it (on a CPU, runnable but waiting for one, blocked: /proc schedstat), the machine's busy fraction (/proc/stat) and
``os.getloadavg()`` are recorded per run: other sessions share these 2 cores. Nothing asserts on
time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastload
from fastload.benchmark.monitor import child_pids
from fastload.config import available_cpus
from fastload.format import read_manifest


def proposed_decode_threads(manifest: Any, cores: int, *, in_worker: bool) -> int:
    """A candidate default for ``PackedDataset(decode_threads=None)``, measured beside the others.

    One thread per core plus one in the main process (threads mode): a decode thread is off its
    core while it waits for the GIL (crop plan, checksum, reading the record, Python glue
    between records) or for a ``pread``; a spare thread fills that gap. Inside a worker
    process: one, as today (the workers are the parallelism). Depends only on the core count.

    Measured (bench/results/threads.json, quiet 2-core VM): no better than today's default (one
    per core): two decode threads are off their cores only 4 % of the time, and the loader uses
    1.93 of 2 cores already. Its gain on a shared machine comes from the scheduler: with other
    runnable processes, CFS shares the cores per thread, so a third thread takes CPU from them
    (``--background-load 2``: 3 threads 1.12x, 4 threads 1.24x auto).
    """
    del manifest  # LMDB and HDF5, both with restart markers, gave the same picture
    return 1 if in_worker else cores + 1


@dataclass
class Row:
    name: str
    dataset_kwargs: dict[str, Any]
    loader_kwargs: dict[str, Any] = field(default_factory=dict)
    explicit: bool = False  # one of the threads=N rows that "the best explicit setting" is taken from


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("packed", type=Path, nargs="+", help="packed datasets (fastload pack ... --restart-markers)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--duration", type=float, default=5.0, help="timed seconds per row (default 5)")
    p.add_argument("--warmup", type=float, default=1.0, help="untimed seconds per row first (default 1)")
    p.add_argument("--repeats", type=int, default=5, help="rounds of every row (default 5)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2, 3, 4],
                   help="explicit decode_threads rows (default 1 2 3 4)")
    p.add_argument("--no-workers", action="store_true", help="leave out the worker-process row")
    p.add_argument("--no-proposed", action="store_true", help="leave out the proposed-rule row")
    p.add_argument("--background-load", type=int, default=0, metavar="N",
                   help="run N busy-loop processes of our own through every row: cores shared on "
                        "purpose, as other sessions share them at times (default 0)")
    p.add_argument("--json", type=Path, help="write everything here (bench/results/threads.json)")
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    if any(n < 1 for n in args.threads):
        p.error("--threads: every count must be at least 1")
    return args


def rows_for(path: Path, args: argparse.Namespace, cores: int) -> list[Row]:
    rows = [Row("auto", {})]
    rows += [Row(f"threads={n}", {"decode_threads": n}, explicit=True) for n in args.threads]
    if not args.no_proposed:
        n = proposed_decode_threads(read_manifest(path), cores, in_worker=False)
        rows.append(Row(f"proposed rule ({n})", {"decode_threads": n}))
    if not args.no_workers:
        rows.append(Row(f"{cores} workers", {}, {"num_workers": cores, "persistent_workers": True}))
    return rows


SPINNERS: set[int] = set()  # --background-load processes: load from outside, not the loader's


def cpu_seconds(pids: list[int]) -> float:
    """utime + stime of these processes (all their threads), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def children(pid: int) -> list[int]:
    """The loader's worker processes (not the --background-load spinners)."""
    return [p for p in child_pids(pid) if p not in SPINNERS]


def thread_times() -> dict[int, tuple[str, int, int]]:
    """Every thread of this process: tid -> (name, ns on a CPU, ns runnable but waiting for one),
    from /proc/self/task/*/schedstat."""
    names = {t.native_id: t.name for t in threading.enumerate()}  # CPython 3.11 leaves comm as "python"
    out: dict[int, tuple[str, int, int]] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = names.get(int(task.name), "")
            run, wait, _ = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        out[int(task.name)] = (name, int(run), int(wait))
    return out


def thread_split(before: dict[int, tuple[str, int, int]], after: dict[int, tuple[str, int, int]],
                 wall: float) -> dict[str, dict[str, float]]:
    """Per thread kind (decode pool, prefetch, main): mean fraction of the timed wall time each
    thread of that kind spent on a CPU, runnable but waiting for a CPU (other load), and off the
    run queue (blocked: the GIL, a read, or no work between batches). Threads that never ran in
    the window (an earlier row's idle pool) are left out."""
    kinds: dict[str, list[tuple[float, float]]] = {}
    for tid, (name, run1, wait1) in after.items():
        if tid not in before:
            continue
        _, run0, wait0 = before[tid]
        if run1 == run0:
            continue
        kind = ("decode" if name.startswith("fastload-decod") else "prefetch" if name.startswith("fastload-pref")
                else "main" if tid == os.getpid() else "other")
        kinds.setdefault(kind, []).append(((run1 - run0) / 1e9 / wall, (wait1 - wait0) / 1e9 / wall))
    return {kind: {"threads": len(v), "on_cpu": round(sum(r for r, _ in v) / len(v), 3),
                   "waiting_for_cpu": round(sum(w for _, w in v) / len(v), 3),
                   "blocked": round(1 - sum(r + w for r, w in v) / len(v), 3)} for kind, v in kinds.items()}


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of every core, from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def run_row(path: Path, row: Row, args: argparse.Namespace) -> dict[str, Any]:
    dataset = fastload.PackedDataset(path, image_size=224, train=True, **row.dataset_kwargs)
    loader = fastload.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, **row.loader_kwargs)
    settings = loader.settings
    it = iter(loader)
    try:
        started = time.perf_counter()
        for warm_batches, _ in enumerate(it, 1):  # untimed: thread pools, worker start, file handles
            if time.perf_counter() - started >= args.warmup and warm_batches >= 3:
                break
        pids = [os.getpid(), *children(os.getpid())]
        cpu0, (busy0, total0), load0 = cpu_seconds(pids), machine_ticks(), os.getloadavg()
        threads0 = thread_times()
        samples, epoch_end = 0, True
        t0 = time.perf_counter()
        t = t0
        for batch in it:
            images = batch[0]
            if images.shape[0] < args.batch_size:  # the epoch's last, short batch: stop before it
                break
            samples += images.shape[0]
            t = time.perf_counter()
            if t - t0 >= args.duration:
                epoch_end = False
                break
        cpu1, (busy1, total1), load1 = cpu_seconds(pids), machine_ticks(), os.getloadavg()
        threads1 = thread_times()
    finally:
        del it, loader, dataset  # the iterator's __del__ stops the prefetch thread / workers
        gc.collect()
    wall = t - t0
    decoder_threads = row.dataset_kwargs.get("decode_threads")
    return {
        "row": row.name, "samples": samples, "seconds": round(wall, 3),
        "samples_per_s": samples / wall if wall > 0 else 0.0,
        "cut_at_epoch_end": epoch_end,
        "mode": settings.mode, "num_workers": settings.num_workers,
        "decode_threads": decoder_threads if decoder_threads is not None else
        ("default" if settings.mode == "processes" else available_cpus()),
        "cpu_s": round(cpu1 - cpu0, 3), "cores_used": round((cpu1 - cpu0) / wall, 3) if wall > 0 else None,
        "machine_busy": round((busy1 - busy0) / max(1, total1 - total0), 3),
        "loadavg_before": [round(v, 2) for v in load0], "loadavg_after": [round(v, 2) for v in load1],
        "threads": thread_split(threads0, threads1, wall) if wall > 0 else {},
    }


def bench_one(path: Path, args: argparse.Namespace, cores: int) -> dict[str, Any]:
    rows = rows_for(path, args, cores)
    runs: list[list[dict[str, Any]]] = []  # runs[repeat] = one result per row, in row order
    for repeat in range(args.repeats):
        shift = repeat % len(rows)
        order = rows[shift:] + rows[:shift]
        by_name: dict[str, dict[str, Any]] = {}
        for row in order:
            result = run_row(path, row, args)
            result["repeat"] = repeat
            by_name[row.name] = result
            dec = result["threads"].get("decode")
            split = (f"; decode threads on CPU {dec['on_cpu']:.0%}, waiting for a CPU {dec['waiting_for_cpu']:.0%}, "
                     f"blocked {dec['blocked']:.0%}" if dec else "")
            print(f"  repeat {repeat + 1}/{args.repeats} {row.name:>20}: {result['samples_per_s']:7.0f}/s "
                  f"({result['cores_used']} cores by the loader, machine {result['machine_busy']:.0%} busy, "
                  f"load {result['loadavg_after'][0]}{split})", file=sys.stderr, flush=True)
        best = max(by_name[r.name]["samples_per_s"] for r in rows if r.explicit) or float("nan")
        best_name = max((r for r in rows if r.explicit), key=lambda r: by_name[r.name]["samples_per_s"]).name
        for r in by_name.values():
            r["x_best_explicit"] = r["samples_per_s"] / best
            r["best_explicit_this_repeat"] = best_name
        runs.append([by_name[r.name] for r in rows])
    summary = []
    for k, row in enumerate(rows):
        rates = [runs[rep][k]["samples_per_s"] for rep in range(args.repeats)]
        ratios = [runs[rep][k]["x_best_explicit"] for rep in range(args.repeats)]
        cores_used = [c for rep in range(args.repeats) if (c := runs[rep][k]["cores_used"]) is not None]
        summary.append({
            "row": row.name, "dataset_kwargs": row.dataset_kwargs, "loader_kwargs": row.loader_kwargs,
            "median_samples_per_s": statistics.median(rates), "rates": rates,
            "median_x_best_explicit": statistics.median(ratios), "x_best_explicit": ratios,
            "median_cores_used": statistics.median(cores_used) if cores_used else None,
        })
    manifest = read_manifest(path)
    return {
        "packed": str(path), "storage": manifest.storage, "num_records": manifest.num_records,
        "restart_markers": bool(manifest.packed.get("restart_markers")),
        "summary": summary, "runs": [r for rep in runs for r in rep],
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['packed']} ({result['storage']}, restart markers: {result['restart_markers']})")
    print("| row | samples/s (median) | repeats | × best explicit, paired (median) | each repeat | "
          "loader cores used |")
    print("|---|---:|---|---:|---|---:|")
    for s in result["summary"]:
        each = ", ".join(f"{r:.0f}" for r in s["rates"])
        ratios = ", ".join(f"{r:.3f}" for r in s["x_best_explicit"])
        print(f"| {s['row']} | {s['median_samples_per_s']:.0f} | {each} | {s['median_x_best_explicit']:.3f} | "
              f"{ratios} | {s['median_cores_used'] or 0:.2f} |")


def spin() -> None:
    """A busy loop: one process of competing load (``--background-load``)."""
    while True:
        pass


def main(args: argparse.Namespace) -> int:
    import multiprocessing

    spinners = [multiprocessing.get_context("spawn").Process(target=spin, daemon=True)
                for _ in range(args.background_load)]
    for proc in spinners:
        proc.start()
        SPINNERS.add(proc.pid)
    try:
        return run_all(args)
    finally:
        for proc in spinners:
            proc.terminate()
            proc.join()


def run_all(args: argparse.Namespace) -> int:
    cores = available_cpus()
    started = dt.datetime.now().isoformat(timespec="seconds")
    load_start = os.getloadavg()
    results = []
    for path in args.packed:
        print(f"{path}: {args.repeats} repeats of {args.warmup:g} s warm-up + {args.duration:g} s timed",
              file=sys.stderr, flush=True)
        results.append(bench_one(path, args, cores))
        print_table(results[-1])
    out = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "started": started, "finished": dt.datetime.now().isoformat(timespec="seconds"),
        "cores": cores, "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
        "python": platform.python_version(), "fastload": fastload.__version__,
        "batch_size": args.batch_size, "duration_s": args.duration, "warmup_s": args.warmup,
        "repeats": args.repeats, "background_load_processes": args.background_load, "proposed_rule": proposed_decode_threads.__doc__.split("\n\n")[1].strip(),
        "datasets": results,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
