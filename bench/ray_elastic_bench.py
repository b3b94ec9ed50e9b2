"""Elastic decode actors under a consumer that takes real time per batch: how many actors
``DataLoader(mode="ray", ray_min_workers=1)`` settles at, against fixed actor counts, for a fast
step and then a slow one (issue 40, item 2: the wait-share trigger measured, not only tested).

    python bench/ray_elastic_bench.py bench/data/photos.fl --nodes 3 --steps-ms 40,400 \\
        --json bench/results/ray-elastic-$(date +%F)-$(git rev-parse --short HEAD).json

A ``ray.cluster_utils.Cluster`` on this machine stands for a cluster: a head node with no CPU for
actors (the trainer's node) and ``--nodes`` nodes of one CPU, one actor each at most. The
consumer stands for a GPU training step: it sleeps ``step`` ms a batch, which leaves the trainer's
CPU idle as a step running on a GPU does.

For each step time, in order:

* **fixed k**: a loader of ``num_workers=k`` actors (started before timing), for every k up to
  ``--nodes``, one epoch: samples/s and the share of the time the loop waited (``wait_fraction``).
  ``needed``: the fewest actors whose wait is at most 10 % (the policy's trigger, ``GROW_AT``).
* **elastic**: one loader, ``num_workers=--nodes, ray_min_workers=1``, made once and run through
  the step times in order (``--epochs`` epochs each), so that the slow step follows the fast one:
  the actor count after each batch, and each epoch's samples/s, wait share and final count.

Reported per step time: what the elastic loader ran with at the end of its last epoch against
``needed``, and its last epoch's samples/s and wait against the fixed rows'. On 2 cores the nodes
share the machine's cores: three 1-CPU nodes do not decode 3× one. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ray_decode_bench import run_facts

import fastload
from fastload.loading.ray_scaling import GROW_AT


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", type=Path, help="a packed dataset of photos (fastload pack)")
    p.add_argument("--nodes", type=int, default=3, help="Ray nodes of one CPU, the most actors (default 3)")
    p.add_argument("--steps-ms", default="40,400", help="the consumer's time per batch, in order (default 40,400)")
    p.add_argument("--epochs", type=int, default=3, help="elastic epochs per step time (default 3)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--object-store", default="300MB", help="object store of each node (default 300MB)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    return p.parse_args(argv)


def epoch(loader: Any, step_s: float) -> dict[str, Any]:
    """One whole epoch with a consumer taking ``step_s`` a batch: rate, wait share, actors after each batch."""
    loader.stats(reset=True)
    counts = []
    for _images, _labels in loader:
        time.sleep(step_s)
        counts.append(len(loader._tail.actors))
    stats = loader.stats()
    return {"samples_per_s": stats["samples_per_s"], "wait_fraction": stats["wait_fraction"],
            "actors": counts[-1], "actors_per_batch": counts}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import ray
    from ray.cluster_utils import Cluster

    from fastload.config import parse_size

    steps_ms = [float(s) for s in args.steps_ms.split(",")]
    store = parse_size(args.object_store)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                            "object_store_memory": store})
    for _ in range(args.nodes):
        cluster.add_node(num_cpus=1, object_store_memory=store)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    ds = fastload.PackedDataset(args.path, image_size=args.image_size, train=True)
    kwargs = {"batch_size": args.batch_size, "shuffle": True, "seed": 0, "mode": "ray"}
    rows: dict[str, Any] = {}
    try:
        for step in steps_ms:
            fixed = {}
            for k in range(1, args.nodes + 1):
                loader = fastload.DataLoader(ds, num_workers=k, **kwargs)
                loader._tail.start(wait=True)
                row = epoch(loader, step / 1000)
                fixed[k] = {key: row[key] for key in ("samples_per_s", "wait_fraction")}
                print(f"step {step:g} ms, {k} fixed: {row['samples_per_s']:.0f} samples/s, "
                      f"waited {row['wait_fraction']:.0%}", file=sys.stderr)
                loader._tail.close()
                del loader
            needed = next((k for k, row in fixed.items() if row["wait_fraction"] <= GROW_AT), args.nodes)
            rows[f"{step:g}"] = {"step_ms": step, "fixed": fixed, "needed": needed}
        elastic = fastload.DataLoader(ds, num_workers=args.nodes, ray_min_workers=1, **kwargs)
        elastic._tail.start(wait=True)
        for step in steps_ms:
            runs = []
            for e in range(args.epochs):
                row = epoch(elastic, step / 1000)
                runs.append(row)
                print(f"step {step:g} ms, elastic epoch {e}: {row['samples_per_s']:.0f} samples/s, waited "
                      f"{row['wait_fraction']:.0%}, {row['actors']} actors", file=sys.stderr)
            rows[f"{step:g}"]["elastic"] = runs
        tail = elastic._tail
        counters = {"retired": tail.retired, "replaced": tail.replaced, "resent": tail.resent}
        elastic._tail.close()
    finally:
        ray.shutdown()
        cluster.shutdown()
    summary = {step: {"needed": row["needed"], "elastic_actors": row["elastic"][-1]["actors"],
                      "elastic_samples_per_s": row["elastic"][-1]["samples_per_s"],
                      "elastic_wait": row["elastic"][-1]["wait_fraction"],
                      "fixed_needed_samples_per_s": row["fixed"][row["needed"]]["samples_per_s"]}
               for step, row in rows.items()}
    result = {
        **run_facts("ray-elastic", args, ds),
        "steps": rows,
        "summary": summary,
        "elastic_counters": counters,
    }
    print(json.dumps({"summary": summary, "elastic_counters": counters}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
