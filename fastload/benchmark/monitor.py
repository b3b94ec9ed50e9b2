"""What a run shows while it goes: one progress line on stderr, and its peak memory."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any


class MemoryPeak:
    """Peak proportional set size (PSS) of this process and its children (loader workers), in MB.

    PSS splits pages shared after fork between the processes, so summing it does not count torch's
    libraries once per worker. Sampled at most every 0.2 s; Linux only (None elsewhere).
    """

    def __init__(self) -> None:
        self.peak_mb: float | None = None
        self._next = 0.0

    def sample(self) -> None:
        now = time.perf_counter()
        if now < self._next:
            return
        self._next = now + 0.2
        total = sum(_pss_kb(pid) for pid in [os.getpid(), *child_pids(os.getpid())])
        if total:
            self.peak_mb = max(self.peak_mb or 0.0, total / 1024)


def child_pids(pid: int) -> list[int]:
    """The processes ``pid`` started (its worker processes), from /proc."""
    pids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            pids += [int(p) for p in task.read_text().split()]
        except OSError:
            continue
    return pids


def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class Progress:
    """One status line on stderr, rewritten in place, when stderr is a terminal (else silent)."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._label = ""
        self._next = 0.0

    def start(self, name: str, k: int, total: int) -> None:
        self._label = f"[{k + 1}/{total}] {name}"
        self._write(f"{self._label}: starting")

    def update(self, name: str, clock: Any) -> None:
        """``clock``: the run's clock (``timing``, ``elapsed()``, ``samples``, ``limits``)."""
        now = time.perf_counter()
        if not self.enabled or now < self._next:
            return
        self._next = now + 0.1
        if not clock.timing:
            self._write(f"{self._label}: warming up")
            return
        elapsed = clock.elapsed()
        rate = clock.samples / elapsed if elapsed > 0 else 0.0
        self._write(f"{self._label}: {elapsed:4.1f}/{clock.limits.duration:.0f} s, "
                    f"{clock.samples} samples, {rate:.0f}/s")

    def note(self, text: str) -> None:
        self._write(text)

    def finish(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()

    def _write(self, text: str) -> None:
        if self.enabled:  # one row of the terminal: a longer line wraps, and "\r" rewrites only its last row
            width = shutil.get_terminal_size((100, 24)).columns - 1
            sys.stderr.write("\r\033[K" + text[:width])
            sys.stderr.flush()
