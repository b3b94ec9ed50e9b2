"""URLs and local paths, --storage-option parsing, error classification and range coalescing."""

from __future__ import annotations

import errno
import os

import pytest

from tests.conftest import make_jpeg

from fastload.errors import RemoteAccessDenied, RemoteNotFound, RemoteReadError
from fastload.storage.location import is_remote, local_path, parse_storage_options, scheme_of
from fastload.storage.remote import RemoteStore, coalesce
from fastload.storage.retry import RetryPolicy, ShortRead, is_transient


def test_urls_and_paths():
    assert is_remote("s3://bucket/x.fl") and is_remote("gs://b/x") and is_remote("https://host/x.fl")
    assert not is_remote("/data/x.fl") and not is_remote("x.fl") and not is_remote("file:///data/x.fl")
    assert scheme_of("C:\\data") == "" and local_path("file:///data/x%20y.fl") == "/data/x y.fl"
    assert local_path("rel.fl") == os.path.abspath("rel.fl")
    with pytest.raises(ValueError, match="unknown URL scheme 'ftp'"):
        is_remote("ftp://host/x")
    with pytest.raises(ValueError, match="not on host 'other'"):
        local_path("file://other/x")


@pytest.mark.parametrize("url", ["s3://", "s3:///images.fl", "gs://"])
def test_a_url_without_a_bucket_is_refused_saying_how_to_write_one(cli, tmp_path, url):
    (tmp_path / "images" / "c0").mkdir(parents=True)
    (tmp_path / "images" / "c0" / "a.jpg").write_bytes(make_jpeg(16, 16))
    got = cli("pack", tmp_path / "images", "-o", url)
    scheme = url.split(":")[0]
    assert got.rc == 2 and f"{url}: names no bucket after {scheme}://; write {scheme}://BUCKET/PREFIX" in got.err
    assert "IndexError" not in got.err
    with pytest.raises(ValueError, match=f"^{url}: names no bucket"):
        RemoteStore(url)


def test_storage_options_parse_json_values_and_keep_strings():
    got = parse_storage_options(["endpoint_url=http://127.0.0.1:9000", "anon=true", "retries=3",
                                 'client_kwargs={"region_name": "eu-west-1"}'])
    assert got == {"endpoint_url": "http://127.0.0.1:9000", "anon": True, "retries": 3,
                   "client_kwargs": {"region_name": "eu-west-1"}}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_storage_options(["anon"])


def test_transient_and_permanent_errors():
    class ClientPayloadError(Exception):
        pass

    class EndpointConnectionError(Exception):
        pass

    for exc in (OSError(errno.EBUSY, "Please reduce your request rate."), OSError(errno.EREMOTEIO, "x"),
                ConnectionResetError(), TimeoutError(), ShortRead("short"), ClientPayloadError(),
                EndpointConnectionError()):
        assert is_transient(exc), exc
    for exc in (FileNotFoundError("nope"), PermissionError("Access Denied"), OSError(errno.EINVAL, "bad"),
                ValueError("x")):
        assert not is_transient(exc), exc


def test_the_policy_retries_transients_and_names_what_failed():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise OSError(errno.EBUSY, "SlowDown")
        return b"ok"

    quick = RetryPolicy(attempts=3, base=0.001, cap=0.002)
    assert quick.call(flaky, lambda: "s3://b/k") == b"ok" and len(calls) == 3
    with pytest.raises(RemoteReadError, match="s3://b/k: failed 3 times"):
        quick.call(lambda: (_ for _ in ()).throw(OSError(errno.EBUSY, "SlowDown")), lambda: "s3://b/k")
    with pytest.raises(RemoteNotFound, match="s3://b/k: no such object"):
        quick.call(lambda: (_ for _ in ()).throw(FileNotFoundError("404")), lambda: "s3://b/k")
    with pytest.raises(RemoteAccessDenied, match="access denied"):
        quick.call(lambda: (_ for _ in ()).throw(PermissionError("403")), lambda: "s3://b/k")
    assert all(0 <= quick.delay(a) <= 0.002 for a in range(1, 10))


def test_coalesce_merges_neighbours_of_one_object_only():
    ranges = [("a", 0, 10), ("b", 5, 5), ("a", 100, 10), ("a", 10**7, 10), ("a", 50, 10)]
    spans = coalesce(ranges, gap=1000, max_span=10**6)
    assert spans == [("a", 0, 110, [0, 4, 2]), ("a", 10**7, 10**7 + 10, [3]), ("b", 5, 10, [1])]
    assert len(coalesce([("a", k * 100, 100) for k in range(100)], gap=0, max_span=1000)) == 10
