"""The training process's own CPU per batch: what caps worker processes whatever the core count.

With ``num_workers`` worker processes the decode scales with cores, but every batch also costs
the training (parent) process something: receiving it from a worker (unpickling, the shared-memory
file descriptor, the mapping), torch's pin-memory thread (pinned copy), freeing the shared memory,
the loader iterator's bookkeeping and the loop's own Python. That share does not shrink with more
cores, so ``rate_cap = batch_size / parent CPU-seconds per batch`` caps the rate on any machine.

Two loaders over the same photo-like JPEGs (``make_example.py``), side by side in one run, runs
interleaved: torch's ``DataLoader`` over the ImageFolder baseline and ``fastload.DataLoader(mode=
"processes")`` over the packed copy, both ``num_workers=2``, ``batch_size=256``,
``persistent_workers``, ``pin_memory=True``, the train crop 224. The timed loop asks for the next
batch, copies its images into one reused buffer (``--pin-copy``: a stand-in for torch's pin-memory
thread, which copies each batch from shared memory into pinned memory; a CPU-only torch cannot pin,
and then ignores ``pin_memory``), then drops the batch. Measured in the parent only (workers are
other processes): ``time.process_time`` over the timed batches (every thread of the parent),
``time.thread_time`` of the main thread around each step (``next``, ``copy``, ``free``), and the
ticks of every parent thread from ``/proc/self/task/*/stat``. One more pass runs cProfile on the main
thread. The median of ``--repeats`` runs. Nothing asserts on time.

On a GPU machine torch's pin-memory thread receives, copies and frees (``next``'s receive part,
``copy`` and ``free``); the main thread runs the iterator's bookkeeping and the loop. Two caps are
printed: the whole parent's CPU (``batch / parent ms``, the brief's figure) and the main thread's alone.

    python bench/parent_cost.py --count 2000 --repeats 3

Findings on this 2-core machine (2026-11-28; medians of 3, ms of parent CPU per batch of 256, i.e.
38.5 MB of uint8 images; caps in samples/s = 256 / parent CPU-seconds per batch):

* Before (fastload at 861b669), both loaders cost the parent the same: without the copy stand-in
  torch 6.7 ms, fastload 7.3 ms (caps 38,000 and 35,000/s), of which ~5.2 ms is freeing the
  batch: shared memory is freed by the last process to drop it, and the worker had dropped its
  mapping after sending, so the parent freed the 9,400 tmpfs pages. Receiving (two descriptors over
  the workers' resource-sharer sockets, the mapping, the unpickling) ~1.2-1.5 ms; fastload's own
  Python (LoaderIterator, skip counts, stats, the sampler's per-sample keys) ~0.3 ms of that.
  With the copy stand-in: torch 27.9, fastload 27.2 ms (caps ~9,200-9,400/s on one core): the copy
  ~5 ms on the main thread plus ~12 ms of a torch intra-op (OpenMP) thread that the 38.5 MB copy
  is split with and that spins after it, and freeing grows to ~8.5 ms (the copy faulted the pages in).
* After (a worker keeps the batch it sent until it has made the next one, so the worker frees it):
  fastload 1.9 ms without the copy (torch 6.2 in the same run; cap 133,000/s against 41,600/s),
  21.8 ms with it (torch 29.8; caps 11,700/s against 8,600/s; the main thread 10.4 ms against
  16.9). What remains is the copy (torch's pin-memory thread on a GPU machine) and its intra-op
  helper, and the receive.
* So the parent does not explain the ~5,500 samples/s of the lent H200's 16 processes: even the
  copy-heavy figure caps it above 9,000/s on one core. Two candidates there, not measurable here:
  ``gpu_bench.py``'s fastload rows do not pass ``persistent_workers`` (torch's row does), so with
  6,000 images (23 batches of 256) 16 workers are forked every epoch of ~1 s, each decoding a whole
  batch before the first arrives, and an epoch's last round keeps 7 of 16 busy (at most ~72 % of
  the cores); and torch's pin-memory copy fans out over the parent's intra-op threads (16 there),
  which compete with 16 busy workers for the cores.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

BENCH = Path(__file__).resolve().parent
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=Path, default=Path("/tmp/parent-cost/photos"),
                   help="an ImageFolder tree (made with make_example.py when missing)")
    p.add_argument("--packed", type=Path, default=None, help="its fastload pack (default IMAGES.fl; made when missing)")
    p.add_argument("--count", type=int, default=2000, help="images to make when IMAGES is missing")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=2, help="worker processes of each loader")
    p.add_argument("--batches", type=int, default=24, help="timed batches per run, after --warmup")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3, help="runs of each loader, interleaved")
    p.add_argument("--rows", nargs="+", default=["torch", "fastload"], choices=["torch", "fastload"])
    p.add_argument("--no-pin-copy", dest="pin_copy", action="store_false",
                   help="do not copy each batch's images into a reused buffer (the pinned-copy stand-in)")
    p.add_argument("--no-profile", dest="profile", action="store_false", help="skip the cProfile pass")
    p.add_argument("--json", type=Path, default=None,
                   help="default: bench/results/parent-cost-2026-11-28-<commit>.json")
    args = p.parse_args(argv)
    args.packed = args.packed or args.images.with_name(args.images.name + ".fl")
    return args


def ensure_data(args: argparse.Namespace) -> None:
    """The photos and their pack, made once and kept for later runs."""
    if not args.images.exists():
        subprocess.run([sys.executable, str(BENCH / "make_example.py"), str(args.images), "--count",
                        str(args.count), "--classes", "20"], check=True)
    if not (args.packed / "manifest.json").exists():
        from fastload.converters import pack

        pack(args.images, args.packed)


def make_loader(row: str, args: argparse.Namespace) -> Any:
    common = {"batch_size": args.batch_size, "shuffle": True, "drop_last": True, "num_workers": args.workers,
              "pin_memory": True, "persistent_workers": True, "prefetch_factor": 2}
    if row == "torch":
        from fastload.benchmark.baseline import ImageFolderBaseline

        return torch.utils.data.DataLoader(ImageFolderBaseline.from_folder(args.images, args.image_size), **common)
    import fastload

    dataset = fastload.PackedDataset(args.packed, image_size=args.image_size, train=True)
    return fastload.DataLoader(dataset, mode="processes", **common)


def endless(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


def thread_ticks() -> dict[str, float]:
    """CPU seconds of each thread of this process so far (utime + stime), by thread name."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            stat = Path(f"/proc/self/task/{tid}/stat").read_text()
            comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        except OSError:
            continue  # the thread ended
        fields = stat[stat.rindex(")") + 2:].split()
        name = names.get(int(tid), comm)
        name = "MainThread" if int(tid) == os.getpid() else name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) * TICK_S
    return out


def run(batches: Iterator[Any], args: argparse.Namespace, profile: cProfile.Profile | None = None) -> dict[str, Any]:
    """Per batch: the parent's CPU (all its threads) and the main thread's by step, in ms."""
    buffer: torch.Tensor | None = None
    steps = {"next": 0.0, "copy": 0.0, "free": 0.0}
    ticks0, process0, wall0 = thread_ticks(), time.process_time(), time.perf_counter()
    if profile is not None:
        profile.enable()
    for _ in range(args.batches):
        t0 = time.thread_time()
        images, labels = next(batches)
        t1 = time.thread_time()
        if args.pin_copy:
            if buffer is None or buffer.shape != images.shape:
                buffer = torch.empty_like(images)
            buffer.copy_(images)
        t2 = time.thread_time()
        del images, labels
        t3 = time.thread_time()
        steps["next"] += t1 - t0
        steps["copy"] += t2 - t1
        steps["free"] += t3 - t2
    if profile is not None:
        profile.disable()
    process, wall, ticks1 = time.process_time() - process0, time.perf_counter() - wall0, thread_ticks()
    n = args.batches
    threads = {name: 1000 * (ticks1[name] - ticks0.get(name, 0.0)) / n for name in ticks1
               if ticks1[name] - ticks0.get(name, 0.0) > 0}
    main = sum(steps.values())
    return {"parent_ms": 1000 * process / n, "main_thread_ms": 1000 * main / n,
            **{f"{k}_ms": 1000 * v / n for k, v in steps.items()},
            "threads_ms_from_ticks": threads, "wall_samples_per_s": n * args.batch_size / wall}


def caps(row: dict[str, float], batch: int) -> dict[str, float]:
    """samples/s the parent allows whatever the cores: all its threads' CPU on one core, and its
    main thread's alone (on a GPU machine the receive, the copy and the free move to the pin thread)."""
    return {"cap_parent": 1000 * batch / row["parent_ms"], "cap_main_thread": 1000 * batch / row["main_thread_ms"],
            "other_threads_ms": row["parent_ms"] - row["main_thread_ms"]}


def profile_rows(profile: cProfile.Profile, top: int = 14) -> list[dict[str, Any]]:
    """The main thread's top functions by their own time, waiting (poll, read) included."""
    stats = pstats.Stats(profile, stream=io.StringIO())
    rows = []
    for (path, line, name), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(path).name}:{line}({name})", "calls": calls,
                     "own_ms": 1000 * own, "cumulative_ms": 1000 * cumulative})
    return sorted(rows, key=lambda r: -r["own_ms"])[:top]


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=BENCH, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ensure_data(args)
    pinned = torch.accelerator.is_available()
    loaders = {row: make_loader(row, args) for row in args.rows}
    iterators: dict[str, Iterator[Any]] = {row: endless(loader) for row, loader in loaders.items()}
    for it in iterators.values():  # workers started and warm
        for _ in range(args.warmup):
            next(it)
    runs: dict[str, list[dict[str, Any]]] = {row: [] for row in args.rows}
    for repeat in range(args.repeats):
        for row, it in iterators.items():
            got = run(it, args)
            runs[row].append(got)
            print(f"{row:9s} run {repeat + 1}: parent {got['parent_ms']:6.2f} ms/batch (main thread: next "
                  f"{got['next_ms']:.2f}, copy {got['copy_ms']:.2f}, free {got['free_ms']:.2f}); "
                  f"{got['wall_samples_per_s']:.0f} samples/s here", flush=True)
    profiles: dict[str, list[dict[str, Any]]] = {}
    if args.profile:
        for row, it in iterators.items():
            profile = cProfile.Profile()
            run(it, args, profile)
            profiles[row] = profile_rows(profile)
    keys = [k for k in runs[args.rows[0]][0] if k.endswith("_ms") and k != "threads_ms_from_ticks"]
    medians = {row: {k: statistics.median(r[k] for r in got) for k in keys + ["wall_samples_per_s"]}
               for row, got in runs.items()}
    for row in medians.values():
        row.update(caps(row, args.batch_size))
    print(f"\nbatch {args.batch_size}, {args.image_size} px, {args.workers} workers, pin_memory "
          f"{'real' if pinned else 'ignored (no accelerator)'}, the pinned-copy stand-in "
          f"{'on' if args.pin_copy else 'off'}; medians of {args.repeats}:")
    print(f"  {'loader':9s} {'parent ms':>9s} {'main':>6s} {'next':>6s} {'copy':>6s} {'free':>6s} {'others':>6s} "
          f"{'cap: parent':>12s} {'cap: main':>10s}  (ms per batch; caps in samples/s)")
    for row, m in medians.items():
        print(f"  {row:9s} {m['parent_ms']:9.2f} {m['main_thread_ms']:6.2f} {m['next_ms']:6.2f} {m['copy_ms']:6.2f} "
              f"{m['free_ms']:6.2f} {m['other_threads_ms']:6.2f} {m['cap_parent']:12,.0f} {m['cap_main_thread']:10,.0f}")
    for row, rows in profiles.items():
        print(f"\n{row}: main thread's top functions by own time over {args.batches} batches (cProfile)")
        for r in rows[:10]:
            print(f"  {r['own_ms']:8.1f} ms {r['calls']:6d} calls  {r['function']}")
    out = args.json or BENCH / "results" / f"parent-cost-2026-11-28-{commit()}.json"
    out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "torch": torch.__version__,
                               "cores": len(os.sched_getaffinity(0)), "pinned": pinned, "runs": runs,
                               "medians": medians, "profiles": profiles}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
