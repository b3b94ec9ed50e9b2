"""The training process's own CPU for the GPU's share of backend="nvimgcodec": planned there or in workers.

Before nvImageCodec decodes a batch, fastload reads its records, checks their checksums and draws
their crop plans (``read_and_plan``; on the lent H200 ~65 µs a record, ~17 ms a batch of 256).
With ``num_workers=0`` that runs in a thread of the training process, whose Python threads then
contend with the training loop for the GIL (the H200's ResNet-50 step ran at 72 ms instead of 55
beside GPU decode). With worker processes it now runs in them, and the training process only
receives planned parts (``fastload/backends/worker_parts.py``). This measures the CPU that leaves
the training process, per batch of 256, side by side in one run, runs interleaved:

- ``before``: ``read_and_plan`` in a prefetch thread, as the backend runs it with ``num_workers=0``;
- ``after``: the backend's own worker loader (``WorkerParts``, ``--workers`` persistent processes)
  with every record on the GPU's side (share 0), its planned parts received and rebuilt into
  PlannedBatches (``as_batch``) by one thread of the training process, as its decode thread does;
  each part's payloads in a fresh shared-memory buffer (the backend with ``payload_slots = 0``);
- ``pooled``: the same, the payloads in the payload slots the backend makes by default
  (``fastload/backends/payload_slots.py``: made once, reused; dropping a batch releases its slot).

The same packed photo-like JPEGs (``make_example.py``), batch 256, the train crop 224; nothing is
decoded, and each batch is dropped once taken (its memory freed here). Measured in the training
process: ``time.process_time`` over the timed batches (every thread), each thread's CPU from
``/proc/self/task``, and the consuming thread's own steps (``take``: receiving a part or taking a
planned batch, ``rebuild``, ``free``); the worker processes' CPU beside it, from ``/proc`` (the
work moved, it did not vanish). Medians of ``--repeats``; nothing asserts on time.

    python bench/nvimgcodec_parent_cpu.py --repeats 5
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from parent_cost import TICK_S, commit, ensure_data, thread_ticks

import fastload
from fastload.backends.decode_split import DecodeSplit
from fastload.backends.nvimgcodec import HELD_HERE
from fastload.backends.payload_slots import PayloadPool
from fastload.backends.planned import read_and_plan
from fastload.backends.planned_part import as_batch
from fastload.backends.worker_parts import WorkerParts
from fastload.loading.prefetch import ThreadPrefetcher

BENCH = Path(__file__).resolve().parent
DEPTH = 2  # the backend's planned batches ahead (nvimgcodec.DEPTH)
SETTLE_S = 0.5  # between runs: the other row's prefetch thread refills before this row's clock starts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=Path, default=Path("/tmp/nvparent/photos"),
                   help="an ImageFolder tree of photo-like JPEGs (made with make_example.py when missing)")
    p.add_argument("--packed", type=Path, default=None, help="its fastload pack (default IMAGES.fl; made when missing)")
    p.add_argument("--count", type=int, default=2048, help="images to make when IMAGES is missing")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=2, help="worker processes of the after row")
    p.add_argument("--batches", type=int, default=40, help="timed batches per run, after --warmup")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--repeats", type=int, default=5, help="runs of each row, interleaved")
    p.add_argument("--json", type=Path, default=None,
                   help="default: bench/results/nvimgcodec-parent-<date>-<commit>.json")
    args = p.parse_args(argv)
    args.packed = args.packed or args.images.with_name(args.images.name + ".fl")
    return args


def key_batches(num_records: int, batch_size: int, seed: int = 0) -> Iterator[list[tuple[int, int, int]]]:
    """The sampler's keys ``(index, epoch, seed)``, shuffled, epoch after epoch, in full batches."""
    epoch = 0
    while True:
        order = np.random.default_rng([seed, epoch]).permutation(num_records)
        for start in range(0, num_records - batch_size + 1, batch_size):
            yield [(int(i), epoch, seed) for i in order[start:start + batch_size]]
        epoch += 1


def planned_here(dataset: Any, args: argparse.Namespace) -> tuple[Iterator[Any], Any]:
    """before: read + plan in a thread of this process (the backend with num_workers=0)."""
    keys = key_batches(len(dataset), args.batch_size)
    prefetcher = ThreadPrefetcher((read_and_plan(dataset, k) for k in keys), DEPTH)
    return prefetcher, (lambda planned: planned)


def planned_in_workers(dataset: Any, args: argparse.Namespace, pool: PayloadPool | None = None
                       ) -> tuple[Iterator[Any], Any]:
    """after (pooled): the backend's worker loader, every record on the GPU's side, the payloads in
    a fresh buffer per part (in ``pool``'s slots); parts rebuilt here."""
    workers = WorkerParts(dataset, num_workers=args.workers, prefetch_factor=2,
                          pin_memory=torch.cuda.is_available(), pool=pool)
    router = workers.epoch(DecodeSplit(key_batches(len(dataset), args.batch_size), share=0.0))
    # Each part as it comes (router.parts would hold the last one until the next: its free would
    # count as the next one's take). The router keeps the loader and its processes.
    return (router.take("gpu") for _ in itertools.repeat(None)), as_batch


def children_cpu() -> float:
    """CPU seconds so far of this process's live child processes (the worker processes)."""
    total = 0.0
    for tid in os.listdir("/proc/self/task"):
        for child in Path(f"/proc/self/task/{tid}/children").read_text().split():
            try:
                fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) * TICK_S
    return total


def run(source: Iterator[Any], rebuild: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Per batch, in ms: this process's CPU (all threads; each thread's), the consuming thread's
    steps, the worker processes' CPU, and the wall time."""
    steps = {"take": 0.0, "rebuild": 0.0, "free": 0.0}
    time.sleep(SETTLE_S)
    ticks0, children0 = thread_ticks(), children_cpu()
    process0, wall0 = time.process_time(), time.perf_counter()
    records = 0
    for _ in range(args.batches):
        t0 = time.thread_time()
        got = next(source)
        t1 = time.thread_time()
        batch = rebuild(got)
        records += len(batch.indices)
        t2 = time.thread_time()
        del got, batch
        t3 = time.thread_time()
        steps["take"] += t1 - t0
        steps["rebuild"] += t2 - t1
        steps["free"] += t3 - t2
    process, wall = time.process_time() - process0, time.perf_counter() - wall0
    ticks1, children = thread_ticks(), children_cpu() - children0
    n = args.batches
    threads = {name: round(1000 * (ticks1[name] - ticks0.get(name, 0.0)) / n, 2) for name in ticks1
               if ticks1[name] - ticks0.get(name, 0.0) > 0}
    return {"parent_ms": 1000 * process / n, **{f"{k}_ms": 1000 * v / n for k, v in steps.items()},
            "threads_ms_from_ticks": threads, "workers_ms": 1000 * children / n,
            "wall_ms": 1000 * wall / n, "records_per_batch": records / n}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ensure_data(args)
    dataset = fastload.PackedDataset(args.packed, image_size=args.image_size, train=True)
    # The workers first: forked beside a running read_and_plan thread, a worker can inherit a held
    # import lock and wait on it for ever.
    after = planned_in_workers(dataset, args)
    pool = PayloadPool.sized_for(dataset, args.batch_size, args.workers * 2 + HELD_HERE)  # as the backend's
    pooled = planned_in_workers(dataset, args, pool)
    rows = {"before": planned_here(dataset, args), "after": after, "pooled": pooled}
    for source, rebuild in rows.values():  # threads and workers started, pages warm
        for _ in range(args.warmup):
            rebuild(next(source))
    runs: dict[str, list[dict[str, Any]]] = {row: [] for row in rows}
    for repeat in range(args.repeats):
        for row, (source, rebuild) in rows.items():
            got = run(source, rebuild, args)
            runs[row].append(got)
            print(f"{row:6s} run {repeat + 1}: training process {got['parent_ms']:6.2f} ms/batch (consumer: take "
                  f"{got['take_ms']:.2f}, rebuild {got['rebuild_ms']:.2f}, free {got['free_ms']:.2f}); workers "
                  f"{got['workers_ms']:.1f} ms; wall {got['wall_ms']:.1f} ms", flush=True)
    keys = ["parent_ms", "take_ms", "rebuild_ms", "free_ms", "workers_ms", "wall_ms"]
    medians = {row: {k: statistics.median(r[k] for r in got) for k in keys} for row, got in runs.items()}
    ratio = medians["after"]["parent_ms"] / medians["before"]["parent_ms"]
    pooled_ratio = medians["pooled"]["parent_ms"] / medians["after"]["parent_ms"]
    print(f"\nbatch {args.batch_size}, {args.image_size} px train crops, {args.workers} workers, {len(dataset)} "
          f"records; medians of {args.repeats} runs of {args.batches} batches, ms per batch:")
    print(f"  {'row':6s} {'training process':>16s} {'take':>6s} {'rebuild':>7s} {'free':>6s} {'workers':>8s} {'wall':>6s}")
    for row, m in medians.items():
        print(f"  {row:6s} {m['parent_ms']:16.2f} {m['take_ms']:6.2f} {m['rebuild_ms']:7.2f} {m['free_ms']:6.2f} "
              f"{m['workers_ms']:8.1f} {m['wall_ms']:6.1f}")
    print(f"  after / before, the training process's CPU: {ratio:.3f}; pooled / after: {pooled_ratio:.3f}")
    print(f"  pooled: {pool.slots.count} slots of {pool.slots.nbytes / 1e6:.1f} MB; parts {pool.counts}")
    today = datetime.date.today().isoformat()
    out = args.json or BENCH / "results" / f"nvimgcodec-parent-{today}-{commit()}.json"
    out.write_text(json.dumps({
        "args": {k: str(v) for k, v in vars(args).items()}, "date": today, "commit": commit(),
        "torch": torch.__version__, "cores": len(os.sched_getaffinity(0)), "pinned": torch.cuda.is_available(),
        "records": len(dataset), "mean_record_kb": float(np.mean(dataset.index.size)) / 1000,
        "runs": runs, "medians": medians, "after_over_before": ratio, "pooled_over_after": pooled_ratio,
        "pool": {"slots": pool.slots.count, "slot_bytes": pool.slots.nbytes, "parts": pool.counts}}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
