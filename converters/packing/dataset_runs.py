"""Pack stage, the runs of a map-style dataset's shard writers: worker processes (or a thread here)
writing shards, their outcomes handed to the packing process in shard order, and what they leave
removed when the pack stops early."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path

from fastload.converters.packing.dataset_shards import ShardOutcome, ShardTask, write_shards
from fastload.converters.sources.torch_dataset import Read

_POLL_S = 0.05  # how often the packing process looks for a held Ctrl-C while it waits
_LAST_S = 5.0  # after the runners ended: how long an outcome still on its way is waited for


class ShardRun:
    """``in_order`` yields the tasks' outcomes in shard order (a shard that could not be written at
    once); ``end`` stops the runners and removes the files of shards not renamed into place."""

    def __init__(self, tasks: Sequence[ShardTask]) -> None:
        self.numbers = [task.shard.number for task in tasks]
        self.tasks = tasks
        self.received: list[ShardOutcome] = []
        self.futures: list[Future[int]] = []
        self.thread: threading.Thread | None = None
        self.failure: BaseException | None = None

    def start(self, futures: list[Future[int]], get: Callable[..., ShardOutcome], stop: Callable[[], None]) -> None:
        """Worker processes run ``futures`` (each returns how many outcomes it sent), sending outcomes to ``get``."""
        self.futures, self.get, self.stop = futures, get, stop

    def start_thread(self, reads: Callable[[ShardTask], Iterator[Read]]) -> None:
        """A thread here writes the shards, one after another, from ``reads(task)``."""
        results: queue.SimpleQueue[ShardOutcome] = queue.SimpleQueue()
        stopped = threading.Event()
        tasks = iter(self.tasks)

        def run() -> None:
            try:
                write_shards(lambda: next(tasks, None), reads, stopped.is_set, results.put)
            except BaseException as exc:  # noqa: BLE001 - raised in the packing thread (in_order)
                self.failure = exc

        self.get, self.stop = results.get, stopped.set
        self.thread = threading.Thread(target=run, name="fastload-dataset-shards", daemon=True)
        self.thread.start()

    def in_order(self, check_interrupt: Callable[[], None]) -> Iterator[ShardOutcome]:
        pending: dict[int, ShardOutcome] = {}
        k = 0
        while k < len(self.numbers):
            check_interrupt()
            alive = self._alive()
            try:
                outcome = self.get(timeout=_POLL_S if alive else _LAST_S)
            except queue.Empty:
                if alive:
                    continue
                raise RuntimeError(f"the pack's shard writers ended before shard {self.numbers[k]} was "
                                   "written, and said nothing of why") from None
            self.received.append(outcome)
            if outcome.error is not None:
                yield outcome
                return
            pending[outcome.number] = outcome
            while k < len(self.numbers) and self.numbers[k] in pending:
                yield pending.pop(self.numbers[k])
                k += 1

    def end(self) -> None:
        self.stop()  # the runners stop at their next item
        if self.thread is not None:
            self.thread.join()
            expected = None
        else:
            expected = sum(f.result() for f in self.futures if not f.cancelled() and f.exception() is None)
        while expected is None or len(self.received) < expected:  # outcomes sent before they stopped
            try:
                self.received.append(self.get(timeout=_LAST_S if expected is not None else 0))
            except queue.Empty:
                break
        for outcome in self.received:  # written, not renamed into place (those renamed are gone)
            if outcome.tmp:
                Path(outcome.tmp).unlink(missing_ok=True)

    def _alive(self) -> bool:
        """Whether a runner still runs; a runner's own error raised here."""
        if self.thread is not None:
            if self.failure is not None:
                raise self.failure
            return self.thread.is_alive()
        for future in self.futures:
            if future.done() and future.exception() is not None:
                raise future.exception()  # type: ignore[misc]
        return not all(future.done() for future in self.futures)
