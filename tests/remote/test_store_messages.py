"""What a user of an object store is told: a missing bucket by its name, an endpoint nobody answers
at with where the endpoint comes from, the skipped report where it is (the store, not a staging
folder already deleted); AWS_ENDPOINT_URL works as the docs say."""

from __future__ import annotations

import socket

import pytest

from fastload.converters import pack
from fastload import BucketNotFound, PackedDataset, RemoteReadError
from fastload.storage.remote import RemoteStore
from fastload.storage.retry import RetryPolicy
from tests.conftest import make_jpeg


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("messages") / "images"
    (root / "a").mkdir(parents=True)
    for i in range(6):
        (root / "a" / f"{i}.jpg").write_bytes(make_jpeg(40, 30, seed=i))
    (root / "a" / "broken.jpg").write_bytes(b"not a jpeg")
    return root


def test_a_missing_bucket_is_named_with_what_to_do(images, s3_server, tmp_path):
    opts = s3_server.storage_options()
    with pytest.raises(BucketNotFound, match="the bucket 'no-such-bucket' does not exist.*create it first"):
        pack(images, "s3://no-such-bucket/x.fl", storage_options=opts, staging=tmp_path / "s", progress=False,
             on_error="skip")
    with pytest.raises(BucketNotFound, match="'no-such-bucket' does not exist"):
        PackedDataset("s3://no-such-bucket/x.fl", storage_options=opts)


def test_an_endpoint_nobody_answers_at_says_where_the_endpoint_comes_from(s3_bucket):
    with socket.socket() as s:  # a port with nothing listening: bound, never listened on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        store = RemoteStore(f"s3://{s3_bucket}/x.fl", {"key": "k", "secret": "s", "endpoint_url": f"http://127.0.0.1:{port}"},
                            retry=RetryPolicy(attempts=2, base=0.01, cap=0.02))
        with pytest.raises(RemoteReadError, match="nothing answers at the store's endpoint: check endpoint_url .*"
                                                  "AWS_ENDPOINT_URL"):
            store.read_file("manifest.json", 100)


def test_the_skipped_report_of_a_store_pack_is_named_where_it_is(images, s3_server, s3_bucket, tmp_path):
    opts = s3_server.storage_options()
    url = f"s3://{s3_bucket}/x.fl"
    report = pack(images, url, storage_options=opts, staging=tmp_path / "s", progress=False, on_error="skip")
    assert report.skipped == 1 and str(report.skipped_report).startswith(url + "/gen-")
    assert f"skipped files listed in {report.skipped_report}" in report.summary()
    name = str(report.skipped_report).removeprefix(url + "/")
    assert b"broken.jpg" in RemoteStore(url, opts).read_file(name, 10_000)
    assert not (tmp_path / "s").exists()


def test_aws_endpoint_url_from_the_environment_reaches_the_store(images, s3_server, s3_bucket, tmp_path, monkeypatch):
    opts = s3_server.storage_options()
    url = f"s3://{s3_bucket}/env.fl"
    pack(images, url, storage_options=opts, staging=tmp_path / "s", progress=False, on_error="skip")
    monkeypatch.setenv("AWS_ENDPOINT_URL", opts["endpoint_url"])
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", opts["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", opts["secret"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert len(PackedDataset(url, cache_limit=0)) == 6  # no storage_options at all
