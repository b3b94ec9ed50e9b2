"""Pack stage, read side of a map-style dataset: items read, checked and encoded in worker processes.
Each worker takes the next shard not taken yet and writes it whole (converters.packing.dataset_shards),
sending back its index columns on a queue; with fewer shards to write than workers, the workers
send back the items themselves, in index order with a bounded number in flight, and a thread in
the packing process writes them. Resume checks read items the second way.

Workers are forked where the platform can (the dataset is inherited, never pickled), else spawned
with the dataset pickled to each. They ignore Ctrl-C (the packing process handles it and stops
them) and exit when it is killed. One worker reads in the packing process itself (a thread there
writes the shards; nothing pickled).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from fastload.converters.packing.dataset_runs import ShardRun
from fastload.converters.packing.dataset_shards import (
    ShardOutcome,
    ShardTask,
    read_items,
    write_shards,
)
from fastload.converters.sources.samples import Schema
from fastload.converters.sources.torch_dataset import Read, ReadSettings, read_item

from fastload.config import available_cpus

_CHUNK = 16  # items per task: one pipe round trip carries several records
_STATE: tuple[Any, ReadSettings, Any, Any, Any] | None = None  # a worker's dataset, settings, and shared state


def default_dataset_workers() -> int:
    """Reading an item is the dataset's Python and the image checks: one process per core."""
    return max(1, min(16, available_cpus()))


def start_method() -> str:
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


class ItemReads:
    """``read(schema, indices)`` yields each item's Read in order; ``write_shards`` writes shards
    from them; ``close`` stops the workers.

    The workers start here, before the pack takes OUT's lock and starts its threads: a forked
    worker holds no lock of the pack's (a kill -9 leaves none held by a worker still reading)."""

    def __init__(self, dataset: Any, settings: ReadSettings, workers: int) -> None:
        self.dataset, self.settings, self.workers = dataset, settings, workers
        self.pool: ProcessPoolExecutor | None = None
        if workers > 1:
            context = multiprocessing.get_context(start_method())
            self.stop = context.Event()  # set: the workers' shards stop at their next item
            self.taken = context.Value("q", 0)  # the shards the workers took, in order: the next is theirs
            self.results: Any = context.Queue()  # each shard's outcome, once written (or not)
            self.pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                            initargs=(dataset, settings, self.stop, self.taken, self.results))
            self.pool.submit(int).result()  # every worker is forked now (the fork context starts all at once)

    def read(self, schema: Schema, indices: Sequence[int]) -> Iterator[Read]:
        if self.pool is None:
            for index in indices:
                yield read_item(self.dataset, schema, self.settings, index)
            return
        chunks = (indices[k:k + _CHUNK] for k in range(0, len(indices), _CHUNK))
        window: deque[Future[list[Read]]] = deque()
        try:
            for chunk in chunks:
                window.append(self.pool.submit(_read_chunk, schema, list(chunk)))
                if len(window) >= 2 * self.workers:
                    yield from window.popleft().result()
            while window:
                yield from window.popleft().result()
        finally:
            for future in window:  # stopped early (an error, Ctrl-C): queued chunks are not read
                future.cancel()

    def write_shards(self, schema: Schema, tasks: Sequence[ShardTask],
                     check_interrupt: Callable[[], None]) -> Iterator[ShardOutcome]:
        """Each task's shard written, its outcome yielded in task order (one that could not be
        written at once). With a worker for each, the workers write whole shards, each taking the
        next shard to write (each item read, checked and written in one process); else a thread
        here writes them from the items read (in the workers, or here)."""
        run, got = ShardRun(tasks), None
        if self.pool is not None and len(tasks) >= self.workers:
            self.stop.clear()
            self.taken.value = 0
            futures = [self.pool.submit(_write_shards, schema, list(tasks)) for _ in range(self.workers)]
            run.start(futures, self.results.get, self.stop.set)
        else:
            got = (self.read(schema, [i for task in tasks for i in range(task.shard.start, task.shard.end)])
                   if self.pool is not None else None)
            run.start_thread(lambda task: got if got is not None else read_items(
                self.dataset, self.settings, schema, task.shard))
        try:
            yield from run.in_order(check_interrupt)
        finally:  # stopped early (an item that failed, an error, Ctrl-C): the runners stop, their files go
            run.end()
            if got is not None:
                got.close()  # type: ignore[attr-defined]

    def write_here(self, schema: Schema, task: ShardTask) -> ShardOutcome:
        """``task``'s shard written by this process from its items read here."""
        outcomes: list[ShardOutcome] = []
        write_shards(iter([task, None]).__next__, lambda t: read_items(self.dataset, self.settings, schema, t.shard),
                     lambda: False, outcomes.append)
        return outcomes[0]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
            self.results.close()


def _start_worker(dataset: Any, settings: ReadSettings, stop: Any, taken: Any, results: Any) -> None:
    global _STATE
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _STATE = (dataset, settings, stop, taken, results)
    parent = os.getppid()
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()


def _exit_with(parent: int) -> None:
    """A worker outlives a killed packing process (kill -9) by a second at most: its queue stays open."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _write_shards(schema: Schema, tasks: list[ShardTask]) -> int:
    """A worker's run: the next shard not taken yet, written, until none is left; returns how many
    outcomes it sent."""
    assert _STATE is not None
    dataset, settings, stop, taken, results = _STATE
    parent = os.getppid()

    def next_task() -> ShardTask | None:
        with taken.get_lock():
            number = taken.value
            taken.value += 1
        return tasks[number] if number < len(tasks) else None

    def stopping() -> bool:
        if os.getppid() != parent:  # killed (kill -9): its next pack may be writing this shard's file now
            os._exit(1)
        return bool(stop.is_set())

    def send(outcome: ShardOutcome) -> None:
        if outcome.failed is not None:  # the dataset's exception crosses back as text (see _read_chunk)
            outcome.failed = replace(outcome.failed, error=None)
        results.put(outcome)

    return write_shards(next_task, lambda task: read_items(dataset, settings, schema, task.shard), stopping, send)


def _read_chunk(schema: Schema, indices: list[int]) -> list[Read]:
    assert _STATE is not None
    dataset, settings, *_ = _STATE
    # A dataset's exception crosses back as its text and traceback (Read.reason, Read.trace), not
    # as the object: some exceptions cannot be rebuilt in another process.
    return [replace(read_item(dataset, schema, settings, index), error=None) for index in indices]
