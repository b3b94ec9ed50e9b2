"""LatencyProxy: the test bed's cheap proxy (latency_proxy_server.py) as a subprocess, so that its
CPU-seconds are read apart from the client's and the server's."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tests.remote.latency_proxy_server import CONTROL

SERVER = Path(__file__).with_name("latency_proxy_server.py")


class LatencyProxy:
    """The proxy as a subprocess in front of ``upstream_host:upstream_port``; dies with its parent.

    ``latency``: seconds added before each request is forwarded. ``stats()`` is the proxy's own
    count (``requests``, ``range_bytes``, ``cpu_s``); ``clear()`` zeroes the counts.
    """

    def __init__(self, upstream_host: str, upstream_port: int, latency: float = 0.0) -> None:
        self.upstream_host, self.upstream_port, self.latency = upstream_host, upstream_port, latency
        self.process: subprocess.Popen[str] | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RuntimeError("LatencyProxy is not running: call start() or use it in a with block")
        return self.process.pid

    def start(self) -> Self:
        if self.process is None:
            self.process = subprocess.Popen(
                [sys.executable, str(SERVER), self.upstream_host, str(self.upstream_port), "--latency",
                 str(self.latency), "--parent", str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
            line = self.process.stdout.readline() if self.process.stdout else ""
            if not line.strip().isdigit():
                self.stop()
                raise RuntimeError(f"latency proxy did not start (said {line!r}); run {SERVER} to see why")
            self.port = int(line)
        return self

    def _call(self, method: str, what: str) -> dict[str, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request(method, CONTROL + what)
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def stats(self) -> dict[str, Any]:
        """``requests`` and ``range_bytes`` since the last ``clear()``, the proxy's ``cpu_s``."""
        return self._call("GET", "stats")

    def clear(self) -> None:
        self._call("POST", "clear")

    def stop(self) -> None:
        """End the proxy process; idempotent."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            if self.process.stdout:
                self.process.stdout.close()
            self.process = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
