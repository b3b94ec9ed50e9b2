"""Cluster packing from SRC, the tasks: plain Ray tasks (``ray.remote``, no Ray Data pipeline), one
per slice of the plan (converters.cluster.ray_plan); each packs its parts, part after part, with
the local pack's own loop into one small dataset each (converters.cluster.ray_parts).

A task returns its parts' ``TaskPart``s (folder names, order ranges, skips), never image bytes. Ray
re-runs a task whose node was lost (``max_retries``); the parts it had finished are found by their
listings' names and reused, the others written again, so every record is adopted exactly once.
"""

from __future__ import annotations

import os
from typing import Any

from fastload.converters.cluster.ray_parts import write_listed_part
from fastload.converters.cluster.ray_plan import PartSource, TaskSlice
from fastload.converters.cluster.task_shards import SinkSettings, TaskPart
from fastload.converters.packing.report import progress_bar

from fastload.errors import PackError
from fastload.storage.allocator import bounded_arenas_env, keep_freed_heap

RETRIES = 3  # Ray's re-runs of a task whose worker or node died (a task's own error is not retried)
KEPT_BETWEEN_PARTS = 256 * 2**20  # freed heap a worker keeps for its next part (a part reads ahead 64 MB)
WORKER_ARENAS = 2
"""malloc arenas of a task's worker process. A Ray worker's 21 threads of its own had taken most of
glibc's 16 (2 cores), so each part's new read threads were dealt arenas other than those the last
part's threads freed into: 56k-90k page faults a task of ~270 MB, and every page zeroed. With 2,
500-1,300 after the workers' first parts (as in a fork pool), and the tasks' work took 0.87-0.91 s
against 1.05-1.35 s (bench/HISTORY.md, issue 28)."""


def write_parts(source: PartSource, parts: list[Any], settings: SinkSettings) -> list[TaskPart | None]:
    """One task: each part (a table of listed rows: ray_plan) packed as one dataset, in order."""
    if not settings.in_store and not os.path.isdir(settings.work):
        raise PackError(f"{settings.work}: not found from this node; OUT must be on a file system every node "
                        "of the cluster sees, at the path the driver sees it")
    keep_freed_memory()
    return [write_listed_part(part, source, settings) for part in parts]


def keep_freed_memory() -> None:
    """This worker process keeps the memory a part frees for its next part (glibc's malloc; with
    another, nothing changes). The workers of a ``pack --ray`` job serve that job alone and end with it.

    A part's pack frees all its read-ahead and write-behind buffers (~64 MB) when it ends, and glibc
    gives a freed heap top over 128 KB back to the system: the next part faulted every page in again
    (147k faults and ~0.3 s of system time per 5,000 photos of ~110 KB on this VM; 3k with this). The
    local pack reads on from shard to shard and never frees them midway. Blocks of 4 MB or more still
    go back at once, as in a pack that decodes (fastload.storage.allocator).
    """
    keep_freed_heap(KEPT_BETWEEN_PARTS)


def task_options() -> dict[str, Any]:
    """The Ray options of a pack task: one CPU, re-run where its node is lost, and worker processes
    started with their malloc arenas bounded (a task's ``env_vars`` merge with the job's)."""
    return {"num_cpus": 1, "max_retries": RETRIES, "runtime_env": {"env_vars": bounded_arenas_env(WORKER_ARENAS)}}


def run_tasks(slices: list[TaskSlice], source: PartSource, settings: SinkSettings,
              progress: bool) -> list[TaskPart | None]:
    """Every slice's task run on the connected Ray cluster; their parts, in slice order. On an error
    (or an interrupt) the tasks still running are cancelled and the error raised."""
    import ray

    task = ray.remote(**task_options())(write_parts)
    pending = {task.remote(source, s.parts, settings): (k, s.listed_bytes) for k, s in enumerate(slices)}
    results: dict[int, list[TaskPart | None]] = {}
    try:
        with progress_bar(sum(s.listed_bytes for s in slices), progress) as bar:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    k, listed = pending.pop(ref)
                    results[k] = ray.get(ref)
                    bar.update(listed)
    finally:
        for ref in pending:
            ray.cancel(ref)
    return [part for k in range(len(slices)) for part in results[k]]
