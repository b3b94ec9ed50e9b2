"""The GPU pipeline's streams and events: a stream per stage on the loader's device, events that
order them, and what must live until the GPU is done with it. The host never waits for a batch's
GPU work in the steady state: a stream waits on another's event, and memory the GPU still reads
(nvImageCodec's images, a payload slot) is let go once its event reports done, polled, not awaited.
On the CPU (``device="cpu"``) there are no streams and no events: everything is done when it returns.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch


class Streams:
    """The side streams of one loader on one CUDA device: the decode's, the resample's, and the
    copy of the worker processes' CPU parts (none of them the training loop's)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.decode = torch.cuda.Stream(device)
        self.resample = torch.cuda.Stream(device)
        self.copy = torch.cuda.Stream(device)


def on_device(device: torch.device) -> Any:
    """Make ``device`` current in this thread while the block runs (a thread starts on GPU 0: work
    there without this would open a context on GPU 0 for a loader on ``cuda:1``); on the CPU, nothing."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


def in_stream(stream: torch.cuda.Stream | None) -> Any:
    """Run the block's GPU work on ``stream`` (None, on the CPU: as it is)."""
    return torch.cuda.stream(stream) if stream is not None else nullcontext()


def recorded(stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
    """An event recorded on ``stream`` now (None without a stream)."""
    if stream is None:
        return None
    event = torch.cuda.Event()
    event.record(stream)
    return event


def pinned(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``: from pinned memory on a GPU, a copy the host does not wait for."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


class Retiring:
    """What the GPU may still read, each let go once the event recorded after its last use has
    completed: checked at each ``add`` (never waited for), all waited for at ``flush`` (a pass's end).

    Args:
        limit: the most held at once; past it the oldest is waited for (the GPU is that far behind).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: deque[tuple[torch.cuda.Event, Callable[[], None] | None, Any]] = deque()
        self._lock = threading.Lock()

    def add(self, event: torch.cuda.Event | None, release: Callable[[], None] | None = None, keep: Any = None) -> None:
        """Hold ``keep`` and call ``release`` once ``event`` has completed (None: now)."""
        if event is None:
            if release is not None:
                release()
            return
        with self._lock:
            self._held.append((event, release, keep))
        self._let_go(lambda event: event.query())

    def flush(self) -> None:
        """Wait for every event held, and let everything go."""
        self._let_go(lambda event: False, everything=True)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def _let_go(self, done: Callable[[torch.cuda.Event], bool], everything: bool = False) -> None:
        while True:
            with self._lock:
                if not self._held:
                    return
                event, release, _ = self._held[0]
                passed = done(event)
                if not passed and not everything and len(self._held) <= self.limit:
                    return
                self._held.popleft()
            if not passed:
                event.synchronize()  # the GPU is ``limit`` behind, or a pass's end
            if release is not None:
                release()
