"""Store responses are read up to the bytes asked for, each request within a deadline: a 200 with an
endless body, a Content-Length larger than the body sent, or a slow drip end in a clear error."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator

import pytest
from fastload.converters import pack

from fastload.errors import RemoteReadError
from fastload.storage.remote import RemoteStore
from fastload.storage.retry import RetryPolicy
from tests.conftest import make_jpeg
from tests.remote.fault_proxy import ENDLESS_CAP, FaultProxy, ProxyRequest
from tests.remote.s3_server import S3Server

QUICK = RetryPolicy(attempts=2, base=0.01, cap=0.05)
DATA = os.urandom(200_000)
MAX_BASE = 8.0  # s: six stalled attempts (the pack's retries) stay well inside the 120 s test timeout
STALL_BASE = 0.5  # s: the base where every GET stalls (``stalls_only``): ~50x a clean GET on an idle machine
RETRY_REACH_BASE = 5.0  # s: the lying-length test's floor, so that its retry reaches the proxy on a busy machine


@pytest.fixture(autouse=True, params=["obstore", "fsspec"])
def _quick_deadline(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, s3_server: S3Server,
                    fault_proxy: FaultProxy, s3_bucket: str) -> Iterator[None]:
    """Each test with each store client; a short deadline base, so a stalled request ends in seconds,
    not a minute; and the proxy itself must stay sound.

    The base is twenty times a clean GET through the proxy, measured here, between 2 s and MAX_BASE:
    a fixed 1 s failed a sound retry on a machine at load 14-20 (the machine, not the deadline, was
    under test), and a retry that had not reached the proxy after 1.4 s was seen beside a CPU hog.
    The tests assert what a stall ends in, never how long it took."""
    if request.param == "obstore":
        pytest.importorskip("obstore", reason="the obstore client needs obstore: pip install -e '.[dev]'")
    monkeypatch.setenv("FASTLOAD_STORE_CLIENT", request.param)
    clean = _clean_get_seconds(s3_server, fault_proxy, s3_bucket)
    monkeypatch.setenv("FASTLOAD_REQUEST_TIMEOUT", f"{min(MAX_BASE, max(2.0, 20 * clean)):.2f}")
    yield
    assert fault_proxy.errors == []


@pytest.fixture
def stalls_only(_quick_deadline: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test whose every GET from here on stalls and must end in DeadlineExceeded: a deadline
    base of STALL_BASE, since each stalled attempt waits out its whole deadline.

    No GET here has to succeed, so no speed of the machine can fail the test: a request that has
    not reached the proxy by then ends in the same DeadlineExceeded. On an idle machine a GET
    reaches the proxy in milliseconds, so the stall is what ends it; the stall-after-headers path
    is also held to its full count of stalled attempts, under the sound base, by
    test_a_stall_after_a_lying_content_length_is_retried_then_raised."""
    monkeypatch.setenv("FASTLOAD_REQUEST_TIMEOUT", f"{STALL_BASE:g}")


@pytest.fixture
def retry_reaches(_quick_deadline: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """For a test whose retry must reach the proxy (to be counted there, or to succeed): a deadline
    base of at least RETRY_REACH_BASE. Beside other work one retry took over 2 s to arrive (load 10+
    on 2 cores, and under make test's two processes); what the retry ends in is under test, not its time."""
    base = float(os.environ["FASTLOAD_REQUEST_TIMEOUT"])
    monkeypatch.setenv("FASTLOAD_REQUEST_TIMEOUT", f"{max(base, RETRY_REACH_BASE):.2f}")


def _clean_get_seconds(s3_server: S3Server, fault_proxy: FaultProxy, bucket: str) -> float:
    """The median of five clean 200 KB GETs through the proxy, after one that sets the client up."""
    s3_server.client().put_object(Bucket=bucket, Key="baseline/blob", Body=DATA)
    store = RemoteStore(f"s3://{bucket}/baseline", s3_server.storage_options(fault_proxy.url), retry=QUICK)
    store.read_ranges([("blob", 0, len(DATA))])
    took = []
    for _ in range(5):
        started = time.perf_counter()
        assert store.read_ranges([("blob", 0, len(DATA))]) == [DATA]
        took.append(time.perf_counter() - started)
    return statistics.median(took)


@pytest.fixture
def store(s3_server: S3Server, fault_proxy: FaultProxy, s3_bucket: str) -> RemoteStore:
    """A folder holding ``blob`` (DATA), reached through the proxy, retried twice, quickly."""
    s3_server.client().put_object(Bucket=s3_bucket, Key="folder/blob", Body=DATA)
    return RemoteStore(f"s3://{s3_bucket}/folder", s3_server.storage_options(fault_proxy.url), retry=QUICK)


def _gets(request: ProxyRequest) -> bool:
    """A ranged GET of an object (every read asks for a range; a listing does not)."""
    return request.method == "GET" and "range" in request.headers


def test_an_endless_200_to_a_ranged_get_is_refused_unbuffered(store: RemoteStore, fault_proxy: FaultProxy) -> None:
    fault_proxy.fail_next("endless", count=10, match=_gets)
    with pytest.raises(RemoteReadError, match=r"blob bytes 1000-2999: .*(HTTP 200|not the range).* where 2000 were asked for"):
        store.read_ranges([("blob", 1000, 2000)])
    assert fault_proxy.faults_injected["endless"] == 1  # not retried: the store would say the same
    assert fault_proxy.endless_sent < ENDLESS_CAP  # the client hung up instead of reading on


def test_a_whole_file_read_stops_at_its_limit_on_an_endless_body(store: RemoteStore, fault_proxy: FaultProxy) -> None:
    fault_proxy.fail_next("endless", count=10, match=_gets)
    with pytest.raises(RemoteReadError, match=r"folder/blob: .* where 5001 were asked for"):
        store.read_file("blob", 5000)
    assert fault_proxy.endless_sent < ENDLESS_CAP


@pytest.mark.timeout(60)
def test_a_stall_after_a_lying_content_length_is_retried_then_raised(store: RemoteStore, fault_proxy: FaultProxy,
                                                                     retry_reaches: None) -> None:
    fault_proxy.fail_next("stall", count=10, match=_gets)
    with pytest.raises(RemoteReadError, match=r"blob bytes 0-99999: failed 2 times \(DeadlineExceeded"):
        store.read_ranges([("blob", 0, 100_000)])
    assert fault_proxy.faults_injected["stall"] == 2


@pytest.mark.timeout(60)
def test_a_whole_file_read_that_stalls_is_retried_then_raised(store: RemoteStore, fault_proxy: FaultProxy,
                                                              stalls_only: None) -> None:
    # a limit above the blob's 200 KB: a whole-file read (the deadline grows with the bytes asked)
    fault_proxy.fail_next("stall", count=10, match=_gets)
    with pytest.raises(RemoteReadError, match=r"folder/blob: failed 2 times \(DeadlineExceeded"):
        store.read_file("blob", 250_000)


@pytest.mark.timeout(60)
def test_one_stall_is_retried_and_the_bytes_are_right(store: RemoteStore, fault_proxy: FaultProxy,
                                                      retry_reaches: None) -> None:
    fault_proxy.fail_next("stall", count=1, match=_gets)
    assert store.read_ranges([("blob", 500, 50_000)]) == [DATA[500:50_500]]
    assert fault_proxy.faults_injected["stall"] == 1


@pytest.mark.timeout(60)
def test_a_slow_drip_under_the_socket_timeout_still_meets_the_deadline(store: RemoteStore,
                                                                       fault_proxy: FaultProxy,
                                                                       stalls_only: None) -> None:
    # 4 KB pieces every ~0.4 s, 20 s for the body: the socket's read timeout (60 s) never fires; the
    # deadline (STALL_BASE + 0.8 s for 200 KB) does
    fault_proxy.bandwidth = 10_000
    with pytest.raises(RemoteReadError, match=r"blob bytes 0-199999: failed 2 times \(DeadlineExceeded"):
        store.read_ranges([("blob", 0, 200_000)])


@pytest.fixture
def photos(s3_server: S3Server, s3_bucket: str) -> str:
    """Three small JPEGs under a store prefix."""
    for i in range(3):
        s3_server.client().put_object(Bucket=s3_bucket, Key=f"photos/c{i % 2}/{i}.jpg",
                                      Body=make_jpeg(40, 30, seed=i))
    return f"s3://{s3_bucket}/photos"


def test_packing_from_a_prefix_refuses_an_endless_body(photos: str, s3_server: S3Server, fault_proxy: FaultProxy,
                                                       tmp_path) -> None:
    fault_proxy.fail_next("endless", count=10, match=_gets)
    with pytest.raises(RemoteReadError, match=r"photos/c\d/\d\.jpg bytes 0-\d+: .* were asked for"):
        pack(photos, tmp_path / "out.fl", progress=False,
             storage_options=s3_server.storage_options(fault_proxy.url))
    assert fault_proxy.endless_sent < ENDLESS_CAP


@pytest.mark.timeout(120)
def test_packing_from_a_prefix_that_stalls_ends_with_the_deadline(photos: str, s3_server: S3Server,
                                                                  fault_proxy: FaultProxy, tmp_path,
                                                                  stalls_only: None) -> None:
    fault_proxy.fail_next("stall", count=100, match=_gets)
    with pytest.raises(RemoteReadError, match=r"photos/c\d/\d\.jpg bytes 0-\d+: failed 6 times \(DeadlineExceeded"):
        pack(photos, tmp_path / "out.fl", progress=False,
             storage_options=s3_server.storage_options(fault_proxy.url))


@pytest.mark.timeout(60)
def test_an_http_store_that_stalls_meets_the_deadline_too(s3_server: S3Server, fault_proxy: FaultProxy,
                                                         s3_bucket: str, request: pytest.FixtureRequest) -> None:
    # the same object read as plain http(s):// (fsspec's HTTP filesystem, not s3fs): bounded in time
    s3_server.client().put_object(Bucket=s3_bucket, Key="folder/blob", Body=DATA, ACL="public-read")
    store = RemoteStore(f"{fault_proxy.url}/{s3_bucket}/folder", retry=QUICK)
    assert store.read_ranges([("blob", 10, 1000)]) == [DATA[10:1010]]
    request.getfixturevalue("stalls_only")  # the sound read above had the sound base; the rest all stall
    fault_proxy.fail_next("stall", count=10, match=_gets)
    with pytest.raises(RemoteReadError, match=r"folder/blob bytes 0-99999: failed 2 times \(DeadlineExceeded"):
        store.read_ranges([("blob", 0, 100_000)])


def test_bench_leaves_out_a_store_object_over_the_size_bound(s3_server: S3Server, s3_bucket: str, monkeypatch,
                                                             tmp_path) -> None:
    # the bound pack applies (--max-file-size's default), here lowered to 10 KB for a small test
    from fastload.benchmark import far
    from fastload.benchmark.resolve import resolve

    monkeypatch.setattr(far, "MAX_FILE_SIZE", "10KB")
    client = s3_server.client()
    for i in range(2):
        client.put_object(Bucket=s3_bucket, Key=f"photos/c0/{i}.jpg", Body=make_jpeg(40, 30, seed=i))
    client.put_object(Bucket=s3_bucket, Key="photos/c0/huge.jpg", Body=bytes(20_000))
    with resolve(f"s3://{s3_bucket}/photos", storage_options=s3_server.storage_options(), work=tmp_path) as inputs:
        assert [rel for rel, _ in inputs.baseline.samples] == ["c0/0.jpg", "c0/1.jpg"]
        assert inputs.skipped == [("c0/huge.jpg", ("20000 bytes is over --max-file-size 10000; raise the limit "
                                                  "or remove it"))]
        assert inputs.notes[0].startswith("skipped 1 file that cannot be decoded: c0/huge.jpg (20000 bytes")
