"""Both store clients (obstore, the default for s3://, and fsspec) hold the same contract against the real moto
server: reads, streamed reads, listings, uploads, conditional publishes, ETags, and the faults of
the fault proxy retried (or not) alike."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from fastload.config import available_cpus
from fastload.errors import RemoteAccessDenied, RemoteNotFound, RemoteReadError
from fastload.storage.remote import RemoteStore
from fastload.storage.retry import RetryPolicy
from tests.remote.endless_listing import EndlessListing
from tests.remote.fault_proxy import FaultProxy
from tests.remote.s3_server import S3Server

QUICK = RetryPolicy(attempts=3, base=0.01, cap=0.05)
DATA = os.urandom(3 << 20)  # a few MB, random so any misplaced byte shows


@pytest.fixture
def store(client: str, s3_server: S3Server, fault_proxy: FaultProxy, s3_bucket: str) -> Iterator[RemoteStore]:
    """A folder holding ``blob`` (DATA), reached through the fault proxy, retried quickly."""
    s3_server.client().put_object(Bucket=s3_bucket, Key="folder/blob", Body=DATA)
    store = RemoteStore(f"s3://{s3_bucket}/folder", s3_server.storage_options(fault_proxy.url), retry=QUICK)
    assert store.client.name == client
    yield store
    assert fault_proxy.errors == []


class Pieces:
    """A sink that keeps what arrives buffer by buffer (to see that a body was not joined first)."""

    def __init__(self) -> None:
        self.buffers: list[bytes] = []
        self.restarts = 0

    def write(self, buffer: Any) -> None:
        self.buffers.append(bytes(buffer))

    def restart(self) -> None:
        self.buffers.clear()
        self.restarts += 1


def test_reads_lists_writes_and_removes(store: RemoteStore) -> None:
    assert store.read_ranges([("blob", 5, 100), ("blob", 2 << 20, 1000)]) == [DATA[5:105], DATA[2 << 20:(2 << 20) + 1000]]
    assert store.read_file("blob", len(DATA)) == DATA
    written = store.put_bytes("sub/small", b"hello")
    assert store.stat("sub/small") == written and written.size == 5 and written.etag
    assert [(name, size) for name, size, _ in store.list_objects()] == [("blob", len(DATA)), ("sub/small", 5)]
    store.put_bytes("sub/empty", b"")
    assert store.read_ranges([("sub/empty", 0, 0), ("blob", 0, 0)]) == [b"", b""]
    store.remove(["sub/small", "sub/empty", "never-was"])
    with pytest.raises(RemoteNotFound, match="folder/sub/small: no such object"):
        store.stat("sub/small")


def test_a_listing_past_its_bound_stops_there_naming_the_prefix(store: RemoteStore,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A listing that never ends (a hostile or broken store) is read up to MAX_LISTED and refused."""
    import fastload.storage.client

    for k in range(5):
        store.put_bytes(f"part-{k}", b"x")
    monkeypatch.setattr(fastload.storage.client, "MAX_LISTED", 6)
    assert len(store.list_objects()) == 6  # at the bound: all of it
    monkeypatch.setattr(fastload.storage.client, "MAX_LISTED", 5)
    with pytest.raises(RemoteReadError, match=r"folder: ListingTooLong: the listing goes on past 5 objects "
                                              r"\(stopped there\); name a narrower prefix"):
        store.list_objects()


def test_an_endless_listing_of_long_names_stops_at_its_bound_in_bytes(client: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 44, O2: a store whose listing never ends, of 1 KB keys, filled memory before ten million
    objects and the process aborted (rc 134); s3fs's find read every page before the bound was
    applied. Now the names' bytes are bounded too, and neither client reads pages past the bound."""
    import fastload.storage.client

    monkeypatch.setattr(fastload.storage.client, "MAX_LISTED_BYTES", 3_000_000, raising=False)  # 3 pages here
    with EndlessListing(per_page=1000, key_bytes=1000, cap=200) as server:
        store = RemoteStore("s3://bucket/folder", server.storage_options(), retry=QUICK)
        with pytest.raises(RemoteReadError, match=r"s3://bucket/folder: ListingTooLong: the listing goes on past "
                                                  r"3000000 bytes of names \(30\d\d objects\) \(stopped there\)"):
            store.list_objects()
        assert server.pages <= 5  # obstore asks for the next page while the last is read


def test_the_store_copies_an_object_itself(store: RemoteStore) -> None:
    """A server-side copy (a Ray pack's finalize adopts its parts' shards so): the same bytes at the
    target, and the source left as it was."""
    copied = store.copy("blob", "sub/copy")
    assert copied == store.stat("sub/copy") and copied.size == len(DATA)
    assert store.read_file("sub/copy", len(DATA)) == DATA and store.read_file("blob", len(DATA)) == DATA
    store.remove(["sub/copy"])


def test_a_large_upload_reads_back_whole(store: RemoteStore, tmp_path) -> None:
    local = tmp_path / "big"
    local.write_bytes(DATA * 3)  # over 5 MiB: obstore uploads it in parts
    assert store.put_file(local, "big").size == len(DATA) * 3
    assert store.read_file("big", 10 * len(DATA)) == DATA * 3


def test_a_changed_object_has_another_etag(store: RemoteStore) -> None:
    before = store.stat("blob").etag
    store.put_bytes("blob", DATA[:-1] + bytes([DATA[-1] ^ 1]))  # same size, other bytes
    assert store.stat("blob").etag != before
    assert {n: e for n, _, e in store.list_objects()}["blob"] == store.stat("blob").etag


def test_conditional_publish(store: RemoteStore) -> None:
    first = store.put_if("manifest", b"one", None)
    assert first and store.put_if("manifest", b"two", None) is None  # one is there already
    assert store.put_if("manifest", b"two", '"not-its-etag"') is None
    second = store.put_if("manifest", b"two", first)
    assert second and second != first and store.read_file("manifest", 10) == b"two"


def test_read_into_streams_the_body(client: str, store: RemoteStore) -> None:
    sink = Pieces()
    store.read_into([("blob", 0, len(DATA))], [sink])
    assert b"".join(sink.buffers) == DATA
    if client == "obstore":  # buffers of about a MiB as they came, never the whole body at once
        assert len(sink.buffers) > 1 and max(map(len, sink.buffers)) < len(DATA)


@pytest.mark.parametrize("fault", ["503", "500", "reset", "truncate"])
def test_transient_faults_are_retried_and_the_bytes_are_right(store: RemoteStore, fault_proxy: FaultProxy,
                                                             fault: str) -> None:
    fault_proxy.fail_next(fault, match=lambda r: r.method == "GET")
    assert store.read_ranges([("blob", 1000, 1 << 20)]) == [DATA[1000:1000 + (1 << 20)]]
    assert fault_proxy.faults_injected == {fault: 1}
    fault_proxy.fail_next(fault, match=lambda r: r.method == "GET")
    sink = Pieces()
    store.read_into([("blob", 0, len(DATA))], [sink])
    assert b"".join(sink.buffers) == DATA and sink.restarts >= 1  # before each try (aiohttp retries a reset itself)
    assert fault_proxy.faults_injected == {fault: 2}


def test_a_fault_that_persists_names_the_range(store: RemoteStore, fault_proxy: FaultProxy) -> None:
    fault_proxy.fail_next("503", count=10)
    with pytest.raises(RemoteReadError, match=r"folder/blob bytes 0-99: failed 3 times"):
        store.read_ranges([("blob", 0, 100)])
    assert fault_proxy.faults_injected == {"503": 3}


def test_403_is_never_retried(store: RemoteStore, fault_proxy: FaultProxy) -> None:
    fault_proxy.fail_next("403", count=10)
    with pytest.raises(RemoteAccessDenied, match="folder/blob bytes 0-99: access denied"):
        store.read_ranges([("blob", 0, 100)])
    assert fault_proxy.faults_injected == {"403": 1}


def test_nothing_answering_says_so(client: str, s3_server: S3Server, s3_bucket: str) -> None:
    store = RemoteStore(f"s3://{s3_bucket}/x", s3_server.storage_options("http://127.0.0.1:9"),
                        retry=RetryPolicy(attempts=2, base=0.01, cap=0.01))
    with pytest.raises(RemoteReadError, match="nothing answers at the store's endpoint"):
        store.stat("anything")


def _read_in_child(store: RemoteStore, out: Any) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out.put((store.read_ranges([("blob", 0, 10)])[0], store.client.name, [str(w.message) for w in caught]))


def test_a_child_forked_after_obstore_started_reads_through_fsspec(monkeypatch: pytest.MonkeyPatch,
                                                                   s3_server: S3Server, s3_bucket: str) -> None:
    pytest.importorskip("obstore", reason="the obstore client needs obstore: pip install -e '.[dev]'")
    monkeypatch.setenv("FASTLOAD_STORE_CLIENT", "obstore")
    s3_server.client().put_object(Bucket=s3_bucket, Key="folder/blob", Body=DATA)
    store = RemoteStore(f"s3://{s3_bucket}/folder", s3_server.storage_options())
    assert store.read_ranges([("blob", 0, 10)]) == [DATA[:10]] and store.client.name == "obstore"
    fork = multiprocessing.get_context("fork")
    out = fork.Queue()
    child = fork.Process(target=_read_in_child, args=(store, out))
    child.start()
    body, name, said = out.get(timeout=60)  # obstore there would hang: its runtime's threads are gone
    child.join(30)
    assert body == DATA[:10] and name == "fsspec" and child.exitcode == 0
    assert any("forkserver" in text for text in said)


def test_s3fs_only_options_are_refused_by_obstore(s3_server: S3Server, s3_bucket: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("obstore", reason="the obstore client needs obstore: pip install -e '.[dev]'")
    options = s3_server.storage_options(config_kwargs={"signature_version": "s3v4"})
    monkeypatch.setenv("FASTLOAD_STORE_CLIENT", "obstore")
    with pytest.raises(ValueError, match=r"config_kwargs\.signature_version are s3fs's own"):
        RemoteStore(f"s3://{s3_bucket}/x", options).client  # noqa: B018 - made on first use


ARENAS_IN_CHILD = """
import json, sys
from fastload.storage.allocator import malloc_arenas
from fastload.storage.remote import RemoteStore
a = json.loads(sys.argv[1])
store = RemoteStore(a["url"], a["options"])
for _ in range(8):  # many GETs at once, each on a thread of the client's pool
    assert all(len(b) == 1 << 16 for b in store.read_ranges([("blob", k << 16, 1 << 16) for k in range(48)]))
print(store.client.name, malloc_arenas())
"""


@pytest.mark.parametrize("limit", [None, "5"])
def test_the_obstore_clients_threads_share_a_few_malloc_arenas(limit: str | None, s3_server: S3Server,
                                                               s3_bucket: str) -> None:
    """glibc gives threads up to 8 arenas a core, each keeping the top of what its threads freed: the
    obstore client bounds them to one a core (at least 2) before its pool of GET threads starts,
    unless MALLOC_ARENA_MAX says otherwise (counted with glibc's malloc_info, in a fresh process)."""
    pytest.importorskip("obstore", reason="the obstore client needs obstore: pip install -e '.[dev]'")
    s3_server.client().put_object(Bucket=s3_bucket, Key="folder/blob", Body=DATA)
    env = {k: v for k, v in os.environ.items() if k not in ("FASTLOAD_STORE_CLIENT", "MALLOC_ARENA_MAX")}
    if limit is not None:
        env["MALLOC_ARENA_MAX"] = limit
    args = {"url": f"s3://{s3_bucket}/folder", "options": s3_server.storage_options()}
    done = subprocess.run([sys.executable, "-c", ARENAS_IN_CHILD, json.dumps(args)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    name, arenas = done.stdout.split()
    assert name == "obstore"
    # the main arena and the bounded ones (a thread made before the bound may hold one more)
    assert int(arenas) <= (int(limit) if limit else max(2, available_cpus()) + 1), done.stdout
