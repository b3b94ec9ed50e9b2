"""Peak memory of this process while a block runs, sampled from /proc/self/status: all of it (RSS)
and its private part (RssAnon: what a page cache drop cannot give back; a mapped file's pages are
RssFile). Used by pixel_cache_bench.py and ffcv_raw_row.py alike (the latter runs in FFCV's own
environment, so this imports nothing of fastload)."""

from __future__ import annotations

import threading
import time


def _status() -> dict[str, int]:
    """Bytes of VmRSS, RssAnon and RssFile now."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon", "RssFile"):
                out[name] = int(value.split()[0]) * 1024
    return out


class PeakMemory:
    """``with PeakMemory() as peak: ...``; then ``peak.figures()``: the highest RSS, RssAnon and
    RssFile seen (every 20 ms), in MB."""

    def __init__(self, every: float = 0.02) -> None:
        self.every, self.peak = every, {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, value in _status().items():
                self.peak[name] = max(self.peak[name], value)
            time.sleep(self.every)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for name, value in _status().items():
            self.peak[name] = max(self.peak[name], value)

    def figures(self) -> dict[str, float]:
        return {"rss_mb": self.peak["VmRSS"] / 1e6, "anon_mb": self.peak["RssAnon"] / 1e6,
                "file_mb": self.peak["RssFile"] / 1e6}
