"""The GPU pipeline's stage trace: when each batch entered and left each stage, on the host's clock.

Set on a backend (``backend.trace = StageTrace()``), it records every stage run (read + plan,
decode, resample, hand-over; a test's or a profile's own ``step``) as an interval. ``meet`` makes
two stage runs of different batches overlap, or fail to: each of the two ends only after the other
has started, so a pipeline that runs them at once passes whatever the machine's speed, and one
that runs them one after the other cannot (the wait gives up after ``timeout_s`` and says so).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, NamedTuple

Run = tuple[str, int]
"""One stage's run for one batch: ``(stage, batch number in the pass)``."""


class Interval(NamedTuple):
    """A stage run's start and end, in ``time.perf_counter()`` seconds."""

    stage: str
    batch: int
    start: float
    end: float


class StageTrace:
    """Stage runs recorded as intervals, and meetings between runs (see the module's doc).

    Args:
        timeout_s: how long a run waits at its end for a partner to start before giving up.
    """

    def __init__(self, timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self.intervals: list[Interval] = []
        self.missed: list[tuple[Run, Run]] = []
        """Meetings that did not happen: ``(run, partner)`` where ``run`` gave up waiting."""
        self._lock = threading.Lock()
        self._started: defaultdict[Run, threading.Event] = defaultdict(threading.Event)
        self._partners: defaultdict[Run, list[Run]] = defaultdict(list)

    def meet(self, a: Run, b: Run) -> None:
        """Make runs ``a`` and ``b`` overlap: each ends only after the other has started."""
        with self._lock:
            self._partners[a].append(b)
            self._partners[b].append(a)

    @contextmanager
    def stage(self, name: str, batch: int) -> Iterator[None]:
        """Record the block as stage ``name``'s run for ``batch``."""
        run = (name, batch)
        start = time.perf_counter()
        with self._lock:
            started, partners = self._started[run], list(self._partners.get(run, ()))
        started.set()
        try:
            yield
        finally:
            for partner in partners:
                with self._lock:
                    event = self._started[partner]
                if not event.wait(self.timeout_s):
                    with self._lock:
                        self.missed.append((run, partner))
            with self._lock:
                self.intervals.append(Interval(name, batch, start, time.perf_counter()))

    def interval(self, name: str, batch: int) -> Interval | None:
        """Stage ``name``'s recorded run for ``batch``, if it ran."""
        with self._lock:
            return next((i for i in self.intervals if (i.stage, i.batch) == (name, batch)), None)

    def overlap(self, a: Run, b: Run) -> bool:
        """Whether runs ``a`` and ``b`` were both recorded and ran at once for a while."""
        first, second = self.interval(*a), self.interval(*b)
        return first is not None and second is not None and first.start < second.end and second.start < first.end

    def seconds(self) -> dict[str, list[float]]:
        """Each stage's run times, in batch order."""
        with self._lock:
            runs = sorted(self.intervals, key=lambda i: i.batch)
        out: dict[str, list[float]] = defaultdict(list)
        for i in runs:
            out[i.stage].append(i.end - i.start)
        return dict(out)


class _NoTrace:
    """What stages record into when no trace is set: nothing."""

    def stage(self, name: str, batch: int) -> Any:
        return nullcontext()


NO_TRACE: Any = _NoTrace()
