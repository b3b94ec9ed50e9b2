"""Pack stage, read side of a map-style dataset: items read, checked and encoded in worker processes,
handed back in index order with a bounded number in flight.

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
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from fastload.converters.sources.samples import Schema
from fastload.converters.sources.torch_dataset import Read, ReadSettings, read_item

from fastload.config import available_cpus

_CHUNK = 16  # items per task: one pipe round trip carries several records
_STATE: tuple[Any, ReadSettings] | None = None  # a worker process's dataset and settings


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
            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(start_method()),
                                            initializer=_start_worker, initargs=(dataset, settings))
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

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None


def _start_worker(dataset: Any, settings: ReadSettings) -> None:
    global _STATE
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _STATE = (dataset, settings)
    parent = os.getppid()
    threading.Thread(target=_exit_with, args=(parent,), daemon=True).start()


def _exit_with(parent: int) -> None:
    """A worker outlives a killed packing process (kill -9) by a second at most: its queue stays open."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _read_chunk(schema: Schema, indices: list[int]) -> list[Read]:
    assert _STATE is not None
    dataset, settings = _STATE
    # A dataset's exception crosses back as its text and traceback (Read.reason, Read.trace), not
    # as the object: some exceptions cannot be rebuilt in another process.
    return [replace(read_item(dataset, schema, settings, index), error=None) for index in indices]
