"""A pack lease object that fastload did not write as it is (empty, huge, an expiry that is no time
or lies far ahead) is read bounded and refused or taken over with a message naming it, on both
store clients; an empty object reads as empty."""

from __future__ import annotations

import json
import time

import pytest
from fastload.converters import pack

from fastload.errors import PackError
from fastload.format.layout import STORE_LEASE_NAME
from fastload.storage.remote import RemoteStore
from fastload.verifier import verify
from tests.conftest import make_jpeg


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("lease") / "images"
    (root / "c0").mkdir(parents=True)
    for i in range(4):
        (root / "c0" / f"{i}.jpg").write_bytes(make_jpeg(32 + i, 24, seed=i))
    return root


def _pack(tree, store: RemoteStore, opts, staging):
    return pack(tree, store.url, progress=False, storage_options=opts, staging=staging)


def _lease(**fields) -> bytes:
    return json.dumps({"fastload": "pack lease", "token": "x", "host": "elsewhere", "boot": "", "pid": 1,
                       "renewed": time.time(), "generations": [], **fields}).encode()


def test_an_empty_object_reads_as_empty(client, s3_server, s3_bucket):
    store = RemoteStore(f"s3://{s3_bucket}/f", s3_server.storage_options())
    store.put_bytes("empty", b"")
    assert store.read_file("empty", 100) == b""


def test_an_object_over_the_limit_is_refused_naming_it(client, s3_server, s3_bucket):
    store = RemoteStore(f"s3://{s3_bucket}/f", s3_server.storage_options())
    store.put_bytes("big", b"x" * 1000)
    with pytest.raises(OSError, match=f"larger than the limit of 999 bytes: '{store.display('big')}'"):
        store.read_file("big", 999)


@pytest.mark.parametrize("body, what", [(b"", r"an empty object"), (b"{" * (1 << 20), r"over 64 KiB"),
                                        (b'{"expires": 1e20}', r"17 bytes")])
def test_a_lease_fastload_did_not_write_is_refused_naming_it(client, tree, s3_server, s3_bucket, tmp_path,
                                                             body, what):
    opts = s3_server.storage_options()
    store = RemoteStore(f"s3://{s3_bucket}/ds.fl", opts)
    store.put_bytes(STORE_LEASE_NAME, body)
    with pytest.raises(PackError, match=rf"^{store.display(STORE_LEASE_NAME)}: is not a fastload pack lease "
                                        rf"\({what}\); .*remove the object"):
        _pack(tree, store, opts, tmp_path / "s")
    assert store.read_file(STORE_LEASE_NAME, 2 << 20) == body  # kept: it is not ours


@pytest.mark.parametrize("expires", ["NaN", "Infinity", "-Infinity"])
def test_a_lease_that_expires_at_no_time_is_taken_over(client, tree, s3_server, s3_bucket, tmp_path, expires):
    opts = s3_server.storage_options()
    store = RemoteStore(f"s3://{s3_bucket}/ds.fl", opts)
    store.put_bytes(STORE_LEASE_NAME, _lease(expires=0).replace(b'"expires": 0', f'"expires": {expires}'.encode()))
    _pack(tree, store, opts, tmp_path / "s")  # no pack holds it: fastload writes only finite times
    assert verify(store.url, storage_options=opts).ok


def test_a_lease_from_a_clock_far_ahead_says_waiting_will_not_end_it(client, tree, s3_server, s3_bucket, tmp_path):
    opts = s3_server.storage_options()
    store = RemoteStore(f"s3://{s3_bucket}/ds.fl", opts)
    store.put_bytes(STORE_LEASE_NAME, _lease(expires=time.time() + 86400))
    with pytest.raises(PackError) as info:
        _pack(tree, store, opts, tmp_path / "s")
    message = str(info.value)
    assert "another pack (pid 1 on elsewhere" in message and "after 120 s" not in message
    assert "remove the lease object" in message and "clocks of this machine and elsewhere disagree" in message
    # a live lease of a clock in step: how long is left, not the whole lease time
    store.put_bytes(STORE_LEASE_NAME, _lease(expires=time.time() + 30))
    with pytest.raises(PackError, match=r"run this again after (2\d|30) s"):
        _pack(tree, store, opts, tmp_path / "s")
