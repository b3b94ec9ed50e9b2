"""One stage of the GPU pipeline in a thread of its own, up to ``depth`` batches ahead of the next,
that gives back what its batches hold (their payload slots' leases) when the pass is given up:
those waiting in its queue at once, the one in its hands when it stops."""

from __future__ import annotations

import queue
import time
import weakref
from collections.abc import Iterator
from typing import Any

from fastload.loading.prefetch import ThreadPrefetcher


def let_go(item: Any) -> None:
    """Release the payload slot lease a pipeline item holds (a planned batch's, or a decoded
    batch's), if any; anything else is left to the garbage collector."""
    batch = getattr(item, "batch", item)
    lease = getattr(batch, "lease", None)
    if lease is not None:
        lease.release()


_stages: weakref.WeakSet[PipelineStage] = weakref.WeakSet()


def settle(timeout_s: float = 10.0) -> None:
    """Let the threads of stages closed with a batch in hand (a pass given up) finish it, for up to
    ``timeout_s``: a process forked meanwhile (worker processes) would copy nvImageCodec's or
    torch's native state in the middle of a call."""
    deadline = time.monotonic() + timeout_s
    for stage in list(_stages):
        if stage._stop.is_set():
            stage._thread.join(max(0.0, deadline - time.monotonic()))


class PipelineStage(ThreadPrefetcher):
    """``source`` (a generator running the stage on each batch) run in a thread, ``depth`` ahead;
    closing it releases the leases of the batches it still holds (:func:`let_go`)."""

    def __init__(self, source: Iterator[Any], depth: int) -> None:
        super().__init__(source, depth)
        _stages.add(self)

    def _put(self, entry: tuple[bool, Any]) -> bool:
        if super()._put(entry):
            return True
        ok, item = entry
        if ok:
            let_go(item)  # closed while this batch was in the stage's hands
        return False

    def _run(self, source: Iterator[Any]) -> None:
        try:
            super()._run(source)
        finally:
            if self._stop.is_set():
                self._drain()  # what it put after the close emptied the queue

    def close(self) -> None:
        super().close()
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                ok, item = self._queue.get_nowait()
            except queue.Empty:
                return
            if ok:
                let_go(item)
