"""Tests of the object-store test infrastructure: moto_server and FaultProxy, driven by s3fs."""

from __future__ import annotations

import errno
import http.client
import io
import os
import socketserver
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from tests.remote.fault_proxy import FaultProxy, ProxyRequest
from tests.remote.s3_server import S3Server, start_s3_server

OBJECT = os.urandom(3 << 20)  # a few MB, random so any misplaced byte shows


@pytest.fixture(autouse=True)
def _proxy_stays_sound(fault_proxy: FaultProxy) -> Iterator[None]:
    """Faults are for the client: the proxy itself must never hit an unexpected exception."""
    yield
    assert fault_proxy.errors == []


def make_fs(server: S3Server, proxy: FaultProxy, fs_retries: int = 1, attempts: int = 1,
            **config: Any) -> Any:
    """An uncached s3fs filesystem through ``proxy`` with both retry layers pinned down:
    ``fs_retries`` for s3fs's own loop, ``attempts`` in all for botocore's."""
    import s3fs

    config = {"retries": {"total_max_attempts": attempts}, "connect_timeout": 2,
              "read_timeout": 5, **config}
    fs = s3fs.S3FileSystem(skip_instance_cache=True,
                           **server.storage_options(proxy.url, config_kwargs=config))
    fs.retries = fs_retries  # s3fs takes no constructor argument for its own retry loop
    return fs


def put(server: S3Server, bucket: str, key: str, data: bytes = OBJECT) -> str:
    """Store ``data`` straight on the server (no proxy) and return the s3fs path."""
    server.client().put_object(Bucket=bucket, Key=key, Body=data)
    return f"{bucket}/{key}"


def test_round_trip_through_the_proxy_is_bit_exact(
        s3_server: S3Server, fault_proxy: FaultProxy, s3_bucket: str) -> None:
    fs = make_fs(s3_server, fault_proxy)
    fs.pipe_file(f"{s3_bucket}/big", OBJECT)
    fs.pipe_file(f"{s3_bucket}/small", b"tiny")
    assert fs.cat_file(f"{s3_bucket}/big") == OBJECT
    assert fs.cat_file(f"{s3_bucket}/small") == b"tiny"
    # start/end by keyword: cat_file's third positional parameter is version_id
    assert fs.cat_file(f"{s3_bucket}/big", start=1000, end=2_500_000) == OBJECT[1000:2_500_000]
    starts = [0, 7, 1 << 20, len(OBJECT) - 10]
    got = fs.cat_ranges([f"{s3_bucket}/big"] * 4, starts, [s + 5000 for s in starts])
    assert got == [OBJECT[s:s + 5000] for s in starts]
    seen = fault_proxy.requests
    assert any(r.method == "PUT" and r.headers.get("expect") == "100-continue" for r in seen)
    assert any(r.method == "GET" and r.headers.get("range") == "bytes=1000-2499999" for r in seen)
    assert fault_proxy.connections < len(seen)  # keep-alive, though moto closes after each reply
    assert fault_proxy.upstream_connections == len(seen)


def test_chunked_request_body_on_a_kept_alive_connection(
        s3_server: S3Server, fault_proxy: FaultProxy, s3_bucket: str) -> None:
    auth = {"Authorization": "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/"
                             "aws4_request, SignedHeaders=host, Signature=0"}
    conn = http.client.HTTPConnection("127.0.0.1", fault_proxy.port, timeout=10)
    conn.request("PUT", f"/{s3_bucket}/chunked", body=iter([b"hello ", b"chunked ", b"world"]),
                 encode_chunked=True, headers=auth)
    assert conn.getresponse().read() is not None
    conn.request("GET", f"/{s3_bucket}/chunked", headers=auth)
    response = conn.getresponse()
    assert (response.status, response.read()) == (200, b"hello chunked world")
    conn.close()
    assert fault_proxy.connections == 1
    assert fault_proxy.requests[0].headers["transfer-encoding"] == "chunked"


class _ChunkedUpstream(socketserver.ThreadingTCPServer):
    """A stub upstream answering every request with a chunked body, keeping connections open."""

    daemon_threads = True
    allow_reuse_address = True
    BODY: ClassVar[list[bytes]] = [b"a" * 1000, b"b" * 30000, b"c" * 7]

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ChunkedHandler)


class _ChunkedHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        while self.rfile.readline():
            while self.rfile.readline() not in (b"\r\n", b""):
                pass
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in _ChunkedUpstream.BODY)
            self.wfile.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + chunks + b"0\r\nX-Trailer: yes\r\n\r\n")


def test_chunked_response_is_forwarded_then_truncated() -> None:
    with _ChunkedUpstream() as upstream:
        threading.Thread(target=upstream.serve_forever, args=(0.05,), daemon=True).start()
        with FaultProxy("127.0.0.1", upstream.server_address[1]) as proxy:
            conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=10)
            for _ in range(2):
                conn.request("GET", "/x")
                assert conn.getresponse().read() == b"".join(_ChunkedUpstream.BODY)
            proxy.fail_next("truncate")
            conn.request("GET", "/x")
            with pytest.raises(http.client.IncompleteRead):
                conn.getresponse().read()
            assert (proxy.connections, proxy.upstream_connections) == (1, 1)
            assert proxy.errors == []
        upstream.shutdown()


def test_latency_is_added_to_every_request(
        s3_server: S3Server, fault_proxy: FaultProxy, s3_bucket: str) -> None:
    path = put(s3_server, s3_bucket, "obj")
    fs = make_fs(s3_server, fault_proxy)
    fault_proxy.latency = 0.1
    began = time.monotonic()
    for i in range(5):
        assert fs.cat_file(path, start=i, end=i + 10) == OBJECT[i:i + 10]
    assert time.monotonic() - began >= 0.5
    assert len(fault_proxy.requests) == 5


def test_bandwidth_caps_response_bodies(
        s3_server: S3Server, fault_proxy: FaultProxy, s3_bucket: str) -> None:
    path = put(s3_server, s3_bucket, "obj")
    fs = make_fs(s3_server, fault_proxy)
    fault_proxy.bandwidth = 2e6
    began = time.monotonic()
    assert fs.cat_file(path, start=0, end=1_000_000) == OBJECT[:1_000_000]
    assert time.monotonic() - began >= 0.4


def test_503_surfaces_as_ebusy_and_s3fs_retries_it(
        s3_server: S3Server, fault_proxy: FaultProxy, s3_bucket: str) -> None:
    path = put(s3_server, s3_bucket, "obj")
    fault_proxy.fail_next("503")
    with pytest.raises(OSError) as raised:
        make_fs(s3_server, fault_proxy).cat_file(path, start=0, end=100)
    assert raised.value.errno == errno.EBUSY and "reduce your request rate" in str(raised.value)
    assert len(fault_proxy.requests) == 1
    fault_proxy.fail_next("503", 2)
    assert make_fs(s3_server, fault_proxy, fs_retries=3).cat_file(path, start=0, end=100) \
        == OBJECT[:100]
    assert len(fault_proxy.requests) == 4
    assert fault_proxy.faults_injected == {"503": 3}


def test_500_surfaces_as_eremoteio_and_botocore_retries_it(
        s3_server: S3Server, fault_proxy: FaultProxy, s3_bucket: str) -> None:
    path = put(s3_server, s3_bucket, "obj")
    fault_proxy.fail_next("500")
    with pytest.raises(OSError) as raised:
        make_fs(s3_server, fault_proxy).cat_file(path, start=0, end=100)
    assert raised.value.errno == errno.EREMOTEIO
    fault_proxy.fail_next("500")
    assert make_fs(s3_server, fault_proxy, attempts=2).cat_file(path, start=0, end=100) \
        == OBJECT[:100]
    assert len(fault_proxy.requests) == 3


def test_403_is_permission_error_and_never_retried(
        s3_server: S3Server, fault_proxy: FaultProxy, s3_bucket: str) -> None:
    path = put(s3_server, s3_bucket, "obj")
    fault_proxy.fail_next("403")
    with pytest.raises(PermissionError):
        make_fs(s3_server, fault_proxy, fs_retries=5, attempts=5).cat_file(path, start=0, end=9)
    assert len(fault_proxy.requests) == 1


def test_reset_is_retried_once_by_aiohttp_then_raised(
        s3_server: S3Server, fault_proxy: FaultProxy, s3_bucket: str) -> None:
    import botocore.exceptions

    path = put(s3_server, s3_bucket, "obj")
    fs = make_fs(s3_server, fault_proxy)
    fault_proxy.fail_next("reset")
    assert fs.cat_file(path, start=0, end=100_000) == OBJECT[:100_000]
    assert len(fault_proxy.requests) == 2
    fault_proxy.fail_next("reset", 2)
    with pytest.raises(botocore.exceptions.EndpointConnectionError):
        fs.cat_file(path, start=0, end=100_000)
    fault_proxy.fail_next("reset", 3)  # with retries on, whatever comes back is the object
    fs = make_fs(s3_server, fault_proxy, fs_retries=2, attempts=2)
    assert fs.cat_file(path, start=5, end=100_000) == OBJECT[5:100_000]


def test_truncate_raises_payload_error_or_returns_the_whole_range(
        s3_server: S3Server, fault_proxy: FaultProxy, s3_bucket: str) -> None:
    import aiohttp

    path = put(s3_server, s3_bucket, "obj")
    fault_proxy.fail_next("truncate")
    with pytest.raises(aiohttp.ClientPayloadError):
        make_fs(s3_server, fault_proxy).cat_file(path, start=0, end=100_000)
    fault_proxy.fail_next("truncate", match=lambda r: r.headers.get("range") == "bytes=0-99999")
    got = make_fs(s3_server, fault_proxy).cat_ranges([path] * 2, [0, 200_000], [100_000, 300_000])
    assert isinstance(got[0], aiohttp.ClientPayloadError)  # cat_ranges returns errors in place
    assert got[1] == OBJECT[200_000:300_000]
    fault_proxy.fail_next("truncate")
    fs = make_fs(s3_server, fault_proxy, fs_retries=2)
    assert fs.cat_file(path, start=0, end=len(OBJECT)) == OBJECT


def test_timeout_hits_the_client_read_timeout(
        s3_server: S3Server, fault_proxy: FaultProxy, s3_bucket: str) -> None:
    import botocore.exceptions

    path = put(s3_server, s3_bucket, "obj")
    fs = make_fs(s3_server, fault_proxy, read_timeout=1, connect_timeout=1)
    fault_proxy.fail_next("timeout")
    began = time.monotonic()
    with pytest.raises(botocore.exceptions.ReadTimeoutError):
        fs.cat_file(path, start=0, end=10)
    assert time.monotonic() - began < 30  # the 1 s read timeout ended it, not botocore's 60 s default
    assert fs.cat_file(path, start=0, end=10) == OBJECT[:10]  # the next request is served


def test_error_fault_on_a_put_with_expect_100_continue(
        s3_server: S3Server, fault_proxy: FaultProxy, s3_bucket: str) -> None:
    fs = make_fs(s3_server, fault_proxy)
    fault_proxy.fail_next("503", match=lambda r: r.method == "PUT")
    with pytest.raises(OSError):
        fs.pipe_file(f"{s3_bucket}/up", OBJECT)
    assert fault_proxy.requests[-1].headers.get("expect") == "100-continue"
    fs.pipe_file(f"{s3_bucket}/up", OBJECT)
    buffer = io.BytesIO()
    s3_server.client().download_fileobj(s3_bucket, "up", buffer)
    assert buffer.getvalue() == OBJECT


def test_match_faults_only_the_chosen_requests(
        s3_server: S3Server, fault_proxy: FaultProxy, s3_bucket: str) -> None:
    a, b = put(s3_server, s3_bucket, "a"), put(s3_server, s3_bucket, "b")

    def ranged_get_of_a(request: ProxyRequest) -> bool:
        return (request.method == "GET" and "range" in request.headers
                and request.path.split("?")[0] == f"/{a}")

    fault_proxy.fail_next("403", count=2, match=ranged_get_of_a)
    fs = make_fs(s3_server, fault_proxy)
    assert fs.cat_file(b, start=0, end=10) == OBJECT[:10]
    with pytest.raises(PermissionError):
        fs.cat_file(a, start=0, end=10)
    assert fault_proxy.pending_faults == 1
    fault_proxy.reset_faults()
    assert fs.cat_file(a, start=0, end=10) == OBJECT[:10]


def test_control_api(fault_proxy: FaultProxy) -> None:
    with pytest.raises(ValueError):
        fault_proxy.fail_next("teapot")
    fault_proxy.fail_next("reset", 3)
    fault_proxy.latency, fault_proxy.bandwidth = 1.0, 10.0
    fault_proxy.reset_faults()
    assert fault_proxy.pending_faults == 0
    assert (fault_proxy.latency, fault_proxy.bandwidth) == (0.0, None)
    assert fault_proxy.url == f"http://127.0.0.1:{fault_proxy.port}"


def test_own_server_starts_resets_and_stops() -> None:
    server = start_s3_server()
    try:
        options = server.storage_options(extra_flag=1, client_kwargs={"verify": False})
        assert options["endpoint_url"] == server.endpoint_url and options["extra_flag"] == 1
        assert options["client_kwargs"] == {"region_name": "us-east-1", "verify": False}
        server.make_bucket("to-be-reset")
        server.reset()
        assert server.client().list_buckets()["Buckets"] == []
        process = server.process
    finally:
        server.stop()
    assert process is not None and process.poll() is not None
