"""Write-behind: shard writers run on one background thread while the packing thread reads on.

Reading a file and writing it are both copies that release the GIL, so on two cores they overlap:
the packing thread reads and checks the next files while this thread appends the previous ones,
commits them and fsyncs each finished shard. Payloads travel in batches (a queue hand-off per
file would cost more than the copy of a small file), and the bytes waiting are bounded.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


class ShardWriter(Protocol):
    def append(self, payload: bytes) -> int: ...
    def finish(self) -> tuple[int, int]: ...
    def abort(self) -> None: ...


class WriteFailed(Exception):
    """A shard could not be written; ``shard`` names it and ``cause`` is the original error."""

    def __init__(self, shard: str, cause: BaseException) -> None:
        super().__init__(f"{shard}: {cause}")
        self.shard, self.cause = shard, cause


@dataclass
class _Shard:
    name: str
    make: Callable[[], ShardWriter]
    done: Callable[[int, int], None]  # (file bytes, data offset), after finish: rename + journal
    cleanup: Callable[[], None]  # after a failure or cancel: remove the partial file
    writer: ShardWriter | None = None


_BATCH_BYTES = 1 << 20
_BATCH_ITEMS = 64


class WriteBehind:
    """Queue of shard work for one writer thread; errors come back on the next call or ``close``."""

    def __init__(self, max_pending_bytes: int = 64 * 2**20) -> None:
        self.max_pending = max_pending_bytes
        self.pending = 0
        self.room = threading.Condition()
        self.commands: queue.SimpleQueue[tuple[str, Any] | None] = queue.SimpleQueue()
        self.error: WriteFailed | None = None
        self.dropping = False  # set by cancel: stop at the next command
        self.batch: list[bytes] = []
        self.batch_bytes = 0
        self.thread = threading.Thread(target=self._run, name="fastload-pack-writer", daemon=True)
        self.thread.start()

    def start_shard(self, name: str, make: Callable[[], ShardWriter], done: Callable[[int, int], None],
                    cleanup: Callable[[], None]) -> None:
        self._check()
        self.commands.put(("start", _Shard(name, make, done, cleanup)))

    def append(self, payload: bytes) -> None:
        self.batch.append(payload)
        self.batch_bytes += len(payload)
        if self.batch_bytes >= _BATCH_BYTES or len(self.batch) >= _BATCH_ITEMS:
            self._flush()

    def end_shard(self) -> None:
        """Finish the current shard (commit, fsync, then its ``done``) behind the caller's back."""
        self._flush()
        self.commands.put(("end", None))

    def close(self, while_waiting: Callable[[], None] = lambda: None) -> None:
        """Wait until every shard is written; raise WriteFailed for the first that was not.
        ``while_waiting`` is called every 20 ms meanwhile (the packer checks for Ctrl-C there)."""
        self._flush()
        self.commands.put(None)
        while self.thread.is_alive():
            while_waiting()
            self.thread.join(0.02)
        self._check()

    def cancel(self, finish_queued: bool = True) -> None:
        """Stop after the packing thread failed: the shard it was writing is aborted and its
        partial file removed. Shards it had ended are finished first (they are whole, and a
        resume keeps them) unless ``finish_queued`` is False (Ctrl-C: stop now, redo them later);
        a shard already being finished is finished either way."""
        if self.thread.is_alive():
            self.batch, self.batch_bytes = [], 0
            self.dropping = not finish_queued
            self.commands.put(("abort", None))
            self.thread.join()

    def _flush(self) -> None:
        self._check()
        if not self.batch:
            return
        with self.room:
            while self.pending > self.max_pending and self.error is None:
                self.room.wait()
            self.pending += self.batch_bytes
        self.commands.put(("append", (self.batch, self.batch_bytes)))
        self.batch, self.batch_bytes = [], 0

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        shard: _Shard | None = None
        while (command := self.commands.get()) is not None:
            kind, arg = command
            if kind == "append":
                payloads, size = arg
                with self.room:
                    self.pending -= size
                    self.room.notify_all()
            if self.error is not None or self.dropping or kind == "abort":
                break
            try:
                if kind == "start":
                    shard = arg
                    shard.writer = shard.make()
                elif kind == "append" and shard is not None and shard.writer is not None:
                    for payload in payloads:
                        shard.writer.append(payload)
                elif kind == "end" and shard is not None and shard.writer is not None:
                    file_bytes, data_offset = shard.writer.finish()
                    shard.writer = None
                    shard.done(file_bytes, data_offset)
                    shard = None
            except BaseException as exc:  # handed to the packing thread, which raises it
                self.error = WriteFailed(shard.name if shard else "?", exc)
                with self.room:
                    self.room.notify_all()
        if shard is not None:  # failed or cancelled mid-shard
            if shard.writer is not None:
                try:
                    shard.writer.abort()
                except Exception:
                    pass
            shard.cleanup()
