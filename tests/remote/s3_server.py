"""A real S3-compatible server for tests and benchmarks: moto_server as a subprocess."""

from __future__ import annotations

import atexit
import http.client
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from typing import IO, Any

KEY = SECRET = "testing"
REGION = "us-east-1"
HOST = "127.0.0.1"
# moto.server.main, run so that it dies with us (PR_SET_PDEATHSIG set by the child itself after
# exec, so no preexec_fn runs in a forked copy of our threads; then a check that the parent did
# not die first) and with werkzeug's one-line-per-request log silenced: at benchmark rates that
# log costs the server time and fills its log file (errors, tracebacks, are still written).
_LAUNCH = """
import ctypes, logging, os, signal, sys
parent = int(sys.argv.pop(1))
if sys.platform.startswith("linux"):
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() != parent:
    sys.exit("moto_server: parent gone before start")
logging.getLogger("werkzeug").setLevel(logging.WARNING)
if os.environ.get("FASTLOAD_MOTO_PRELOAD"):  # a script that patches moto first (bench/ranged_moto.py)
    import runpy
    runpy.run_path(os.environ["FASTLOAD_MOTO_PRELOAD"])
from moto.server import main
main(sys.argv[1:])
"""


@dataclass
class S3Server:
    """A running moto_server: where it listens and how to talk to it."""

    endpoint_url: str
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    log: IO[bytes] | None = field(default=None, repr=False)
    _client: Any = field(default=None, init=False, repr=False)

    @property
    def host(self) -> str:
        return self.endpoint_url.split("//", 1)[1].rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.endpoint_url.rsplit(":", 1)[1])

    def storage_options(self, endpoint_url: str | None = None, **extra: Any) -> dict[str, Any]:
        """fsspec/s3fs options for this server, or for a proxy in front of it at ``endpoint_url``;
        ``extra`` entries override (``client_kwargs`` are merged)."""
        options: dict[str, Any] = {
            "key": KEY,
            "secret": SECRET,
            "endpoint_url": endpoint_url or self.endpoint_url,
            "client_kwargs": {"region_name": REGION},
        }
        if "client_kwargs" in extra:
            options["client_kwargs"] = {**options["client_kwargs"], **extra.pop("client_kwargs")}
        options.update(extra)
        return options

    def client(self) -> Any:
        """A boto3 S3 client straight to the server (no proxy), made once."""
        if self._client is None:
            import boto3

            self._client = boto3.client(
                "s3", endpoint_url=self.endpoint_url, aws_access_key_id=KEY,
                aws_secret_access_key=SECRET, region_name=REGION)
        return self._client

    def make_bucket(self, name: str) -> str:
        """Create bucket ``name`` and return the name."""
        self.client().create_bucket(Bucket=name)
        return name

    def reset(self) -> None:
        """Drop every bucket and object (moto's POST /moto-api/reset)."""
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()

    def stop(self) -> None:
        """Terminate the server (kill it if it lingers); idempotent."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=5)
            self.process = None
        if self.log is not None:
            self.log.close()
            self.log = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _log_tail(log: IO[bytes], limit: int = 4000) -> str:
    log.flush()
    log.seek(0)
    return log.read().decode(errors="replace")[-limit:]


def _launch(port: int, timeout: float, preload: str | None = None) -> S3Server:
    log = tempfile.TemporaryFile(prefix="moto-server-")  # noqa: SIM115 - the server owns it
    process = subprocess.Popen(
        [sys.executable, "-c", _LAUNCH, str(os.getpid()), "-H", HOST, "-p", str(port)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "MOTO_PORT": str(port), "FASTLOAD_MOTO_PRELOAD": preload or ""})
    server = S3Server(f"http://{HOST}:{port}", process, log)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            tail = _log_tail(log)
            server.stop()
            raise RuntimeError(
                f"moto_server exited with {process.returncode} on port {port}:\n{tail}")
        try:
            with urllib.request.urlopen(f"{server.endpoint_url}/moto-api/", timeout=1) as response:
                response.read()
            break
        except (OSError, http.client.HTTPException):  # URLError is an OSError: not up yet
            pass
        if time.monotonic() > deadline:
            tail = _log_tail(log)
            server.stop()
            raise RuntimeError(
                f"moto_server did not answer on port {port} within {timeout:.0f} s:\n{tail}")
        time.sleep(0.05)
    atexit.register(server.stop)  # in case the caller never stops it
    return server


def start_s3_server(timeout: float = 30.0, preload: str | None = None) -> S3Server:
    """Start moto_server on a free port of 127.0.0.1 and wait until it answers; ``preload``: a
    Python file run in the server process first (the benchmark's ranged-read patch).

    The server dies with the thread that starts it (PR_SET_PDEATHSIG), so start it from the main
    thread or one that lives as long as the server.
    """
    for attempt in range(3):  # the free port may be taken between finding and binding it
        try:
            return _launch(_free_port(), timeout, preload)
        except RuntimeError as e:
            if attempt == 2 or "Address already in use" not in str(e):
                raise
    raise AssertionError("unreachable")
