"""Pack stage, read side of a map-style dataset: items read, checked and encoded in worker processes;
each worker writes whole shards of them (converters.packing.dataset_shards) and hands back their
index columns in shard order, or, with fewer shards to write than workers, hands back the items
themselves in index order, a bounded number in flight, for the packing process to write.

Workers are forked where the platform can (the dataset is inherited, never pickled), else spawned
with the dataset pickled to each. They ignore Ctrl-C (the packing process handles it and stops them) and exit when it is killed.
One worker reads in the packing process itself (no process, nothing pickled).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastload.converters.packing.dataset_shards import (
    ShardOutcome,
    ShardTask,
    read_items,
    write_shard,
)
from fastload.converters.sources.samples import Schema
from fastload.converters.sources.torch_dataset import Read, ReadSettings, read_item

from fastload.config import available_cpus

_CHUNK = 16  # items per task: one pipe round trip carries several records
_STATE: tuple[Any, ReadSettings, Any] | None = None  # a worker process's dataset, settings and stop event


def default_dataset_workers() -> int:
    """Reading an item is the dataset's Python and the image checks: one process per core."""
    return max(1, min(16, available_cpus()))


def start_method() -> str:
    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


class ItemReads:
    """``read(schema, indices)`` yields each item's Read in order; ``close`` stops the workers.

    The workers start here, before the pack takes OUT's lock and starts its threads: a forked
    worker holds no lock of the pack's (a kill -9 leaves none held by a worker still reading)."""

    def __init__(self, dataset: Any, settings: ReadSettings, workers: int) -> None:
        self.dataset, self.settings, self.workers = dataset, settings, workers
        self.pool: ProcessPoolExecutor | None = None
        if workers > 1:
            context = multiprocessing.get_context(start_method())
            self.stop = context.Event()  # set: the workers' shards stop at their next item
            self.pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                                            initargs=(dataset, settings, self.stop))
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

    def write_shards(self, schema: Schema, tasks: Sequence[ShardTask], check_interrupt: Callable[[], None],
                     taken: Collection[str]) -> Iterator[ShardOutcome]:
        """Each task's shard written, its outcome yielded in task order. With a worker for each, the
        workers write whole shards (each item read, checked and written in one process); else this
        process writes them from the items read (in the workers, or here), ``taken`` (the keys of
        the shards done, kept up to date by the caller) telling which keys are given already."""
        if self.pool is None or len(tasks) < self.workers:
            got = self.read(schema, [i for task in tasks for i in range(task.shard.start, task.shard.end)])
            try:
                for task in tasks:
                    yield write_shard(got, replace(task, taken=taken), _not_stopping(check_interrupt))
            finally:
                got.close()  # type: ignore[attr-defined]
            return
        self.stop.clear()
        futures = [self.pool.submit(_write_shard, schema, task) for task in tasks]
        try:
            for future in futures:
                while True:
                    check_interrupt()
                    try:
                        outcome = future.result(timeout=0.05)
                    except FutureTimeout:
                        continue
                    yield outcome
                    break
        finally:  # stopped early (an item that failed, an error, Ctrl-C): the running shards stop and go
            self.stop.set()
            for future in futures:
                future.cancel()
            for future in futures:
                if not future.cancelled() and future.exception() is None:  # waits for it to stop
                    Path(future.result().tmp).unlink(missing_ok=True)  # written, not renamed into place

    def write_here(self, schema: Schema, task: ShardTask) -> ShardOutcome:
        """``task``'s shard written by this process from its items read here."""
        return write_shard(read_items(self.dataset, self.settings, schema, task.shard), task, lambda: False)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


def _not_stopping(check_interrupt: Callable[[], None]) -> Callable[[], bool]:
    def stopping() -> bool:
        check_interrupt()  # a held Ctrl-C raises here, between items
        return False

    return stopping


def _start_worker(dataset: Any, settings: ReadSettings, stop: Any) -> None:
    global _STATE
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _STATE = (dataset, settings, stop)
    parent = os.getppid()
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()


def _exit_with(parent: int) -> None:
    """A worker outlives a killed packing process (kill -9) by a second at most: its queue stays open."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _write_shard(schema: Schema, task: ShardTask) -> ShardOutcome:
    assert _STATE is not None
    dataset, settings, stop = _STATE
    parent = os.getppid()

    def stopping() -> bool:
        if os.getppid() != parent:  # killed (kill -9): its next pack may be writing this shard's file now
            os._exit(1)
        return bool(stop.is_set())

    outcome = write_shard(read_items(dataset, settings, schema, task.shard), task, stopping)
    if outcome.failed is not None:  # the dataset's exception crosses back as text (see _read_chunk)
        outcome.failed = replace(outcome.failed, error=None)
    return outcome


def _read_chunk(schema: Schema, indices: list[int]) -> list[Read]:
    assert _STATE is not None
    dataset, settings, _ = _STATE
    # A dataset's exception crosses back as its text and traceback (Read.reason, Read.trace), not
    # as the object: some exceptions cannot be rebuilt in another process.
    return [replace(read_item(dataset, schema, settings, index), error=None) for index in indices]
