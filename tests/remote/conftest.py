"""Object-store fixtures: a session moto_server, a fresh fault proxy and a fresh bucket per test."""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterator

import pytest

from tests.remote.fault_proxy import FaultProxy
from tests.remote.s3_server import S3Server, start_s3_server


def _require_client_and_server() -> None:
    """Skip, naming what is missing, when moto (the server) or s3fs (the client) is absent."""
    missing = [name for name in ("moto", "s3fs") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"object-store tests need {' and '.join(missing)}: pip install -e '.[dev]'")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """A moto_server subprocess on 127.0.0.1, shared by the whole session."""
    _require_client_and_server()
    server = start_s3_server()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fault_proxy(s3_server: S3Server) -> Iterator[FaultProxy]:
    """A fresh FaultProxy in front of the session server (no faults, latency or cap to start)."""
    with FaultProxy(s3_server.host, s3_server.port) as proxy:
        yield proxy


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A new, empty bucket: unique names keep tests apart without resetting the server."""
    return s3_server.make_bucket(f"fastload-{uuid.uuid4().hex[:20]}")


@pytest.fixture(params=["obstore", "fsspec"])
def client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each store client in turn (FASTLOAD_STORE_CLIENT), for tests that every client must pass."""
    if request.param == "obstore":
        pytest.importorskip("obstore", reason="the obstore client needs obstore: pip install -e '.[dev]'")
    monkeypatch.setenv("FASTLOAD_STORE_CLIENT", request.param)
    return str(request.param)
