"""The test bed's latency proxy: every request pays the added round trip, bodies arrive whole, client
connections stay alive, and the proxy reports its own requests, bytes and CPU-seconds."""

from __future__ import annotations

import os
import time

import pytest

from fastload.storage.remote import RemoteStore
from tests.remote.latency_proxy import LatencyProxy

DELAY = 0.05  # seconds the proxy adds


@pytest.fixture(scope="module")
def bed(s3_server):
    """An 8 MiB object in moto and a proxy adding 50 ms in front of it, shared by the module."""
    bucket = s3_server.make_bucket("latency-proxy-module")
    data = os.urandom(8 << 20)
    RemoteStore(f"s3://{bucket}/d", s3_server.storage_options()).put_bytes("obj", data)
    with LatencyProxy(s3_server.host, s3_server.port, latency=DELAY) as proxy:
        store = RemoteStore(f"s3://{bucket}/d", s3_server.storage_options(proxy.url))
        yield {"proxy": proxy, "store": store, "data": data}


def test_each_request_through_the_proxy_takes_at_least_the_added_delay(bed):
    store, proxy = bed["store"], bed["proxy"]
    store.read_ranges([("obj", 0, 16)])  # the client's connection and credentials set up
    proxy.clear()
    took = []
    for k in range(5):
        start = time.perf_counter()
        assert store.read_ranges([("obj", k << 20, 4096)]) == [bed["data"][k << 20:(k << 20) + 4096]]
        took.append(time.perf_counter() - start)
    stats = proxy.stats()
    assert stats["requests"] == 5 and stats["range_bytes"] == 5 * 4096
    assert min(took) >= DELAY, took  # a lower bound the proxy guarantees, not a speed
    assert stats["connections"] <= 2, stats  # kept alive across requests (moto closes after each)


def test_bodies_are_spliced_whole_and_uploads_pass(bed):
    store, data = bed["store"], bed["data"]
    pieces = [("obj", k << 20, 1 << 20) for k in range(0, 8, 2)] + [("obj", 7, 300_001)]
    got = store.read_ranges(pieces)
    assert got == [data[o:o + n] for _, o, n in pieces]
    store.put_bytes("up", b"hello" * 10_000)  # a PUT's body goes upstream through the same pump
    assert store.read_ranges([("up", 49_990, 10)]) == [b"hello" * 2]


def test_the_proxy_reports_its_own_cpu_seconds(bed):
    proxy = bed["proxy"]
    before = proxy.stats()
    bed["store"].read_ranges([("obj", k << 20, 1 << 20) for k in range(0, 8, 2)])
    after = proxy.stats()
    assert after["pid"] == proxy.pid != os.getpid()  # its own process: its CPU is not the client's
    assert after["cpu_s"] > before["cpu_s"] > 0
    proxy.clear()
    assert proxy.stats()["requests"] == 0
