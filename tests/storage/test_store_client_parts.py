"""The store clients' parts that need no server: a cache span filled buffer by buffer, obstore's
options and errors translated, the client chosen."""

from __future__ import annotations

import os

import pytest

from fastload.storage.cache import NodeCache
from fastload.storage.cache_entry import BlocksMissing
from fastload.storage.cache_entry_files import BLOCK
from fastload.storage.client_choice import make_client
from fastload.storage.obstore_config import s3_settings, untranslated

DATA = os.urandom(3 * BLOCK + 100)


def test_a_span_is_present_only_once_all_of_it_is_written(tmp_path) -> None:
    entry = NodeCache(tmp_path / "cache", 10 * BLOCK).entry("s3://b/x|1|e", len(DATA), "ds")
    writer = entry.span_writer(BLOCK, len(DATA) - BLOCK)
    writer.write(b"junk")
    writer.restart()  # a retried GET begins the span again
    for k in range(BLOCK, len(DATA), 5000):
        writer.write(memoryview(DATA)[k:k + 5000])
        with pytest.raises(BlocksMissing):
            entry.read(BLOCK, 10)  # nothing marked until the span is whole
    assert writer.commit()
    assert entry.read(BLOCK, len(DATA) - BLOCK) == DATA[BLOCK:]
    assert entry.missing([(0, len(DATA))]) == [(0, BLOCK)]


def test_a_short_or_overlong_span_is_not_kept(tmp_path) -> None:
    entry = NodeCache(tmp_path / "cache", 10 * BLOCK).entry("s3://b/x|1|e", len(DATA), "ds")
    short = entry.span_writer(0, BLOCK)
    short.write(DATA[:100])
    assert not short.commit() and entry.missing([(0, BLOCK)]) == [(0, BLOCK)]
    with pytest.raises(ValueError, match="run past the span"):
        entry.span_writer(0, BLOCK).write(DATA[:BLOCK + 1])
    with pytest.raises(ValueError, match="not block-aligned"):
        entry.span_writer(10, BLOCK)


def test_an_entry_not_admitted_has_no_span_writer(tmp_path) -> None:
    cache = NodeCache(tmp_path / "cache", 2 * BLOCK)
    entry = cache.entry("s3://b/x|1|e", BLOCK, "ds")
    assert entry is not None and entry.span_writer(0, BLOCK) is not None
    entry._files = entry._through()  # as after the cache failed under it
    assert entry.span_writer(0, BLOCK) is None


def test_fsspec_options_become_obstore_settings() -> None:
    bucket, prefix, settings = s3_settings("s3://bucket/a/b.fl", {
        "key": "K", "secret": "S", "endpoint_url": "http://127.0.0.1:9000/",
        "client_kwargs": {"region_name": "eu-west-1"}, "config_kwargs": {"connect_timeout": 3, "read_timeout": 2}})
    assert (bucket, prefix) == ("bucket", "a/b.fl")
    assert settings["access_key_id"] == "K" and settings["secret_access_key"] == "S"
    assert settings["region"] == "eu-west-1" and settings["endpoint"] == "http://127.0.0.1:9000"
    assert settings["virtual_hosted_style_request"] is False and settings["client_options"]["allow_http"]
    assert settings["client_options"]["connect_timeout"].total_seconds() == 3
    assert settings["client_options"]["read_timeout"].total_seconds() == 2
    assert settings["retry_config"]["max_retries"] == 0  # fastload retries
    assert s3_settings("s3://bucket", {"anon": True})[2]["skip_signature"] is True


def test_options_only_s3fs_knows_are_named() -> None:
    assert untranslated({"key": "k", "config_kwargs": {"retries": {}}}) == set()
    assert untranslated({"requester_pays": True, "client_kwargs": {"verify": False}}) == \
        {"requester_pays", "client_kwargs.verify"}


def test_the_client_is_chosen_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("fsspec")
    monkeypatch.setenv("FASTLOAD_STORE_CLIENT", "fsspec")
    assert make_client("s3://b/x", "s3", {"anon": True}, 4).name == "fsspec"
    monkeypatch.setenv("FASTLOAD_STORE_CLIENT", "obstore")
    assert make_client("https://example.com/x", "https", {}, 4).name == "fsspec"  # obstore: s3:// only
    monkeypatch.setenv("FASTLOAD_STORE_CLIENT", "fast")
    with pytest.raises(ValueError, match="store client 'fast' is unknown; use one of obstore, fsspec"):
        make_client("s3://b/x", "s3", {}, 4)


def test_obstore_is_made_for_s3_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("obstore", reason="the obstore client needs obstore: pip install -e '.[dev]'")
    monkeypatch.setenv("FASTLOAD_STORE_CLIENT", "obstore")
    assert make_client("s3://b/x", "s3", {"anon": True, "endpoint_url": "http://127.0.0.1:9"}, 4).name == "obstore"


def test_the_default_is_obstore_for_s3_where_it_can_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("obstore", reason="the obstore client needs obstore: pip install -e '.[dev]'")
    pytest.importorskip("s3fs")
    monkeypatch.delenv("FASTLOAD_STORE_CLIENT", raising=False)
    assert make_client("s3://b/x", "s3", {"anon": True}, 4).name == "obstore"
    assert make_client("s3a://b/x", "s3a", {"anon": True}, 4).name == "obstore"
    # options only s3fs takes: the default reads through s3fs, as it did before obstore was the default
    assert make_client("s3://b/x", "s3", {"anon": True, "requester_pays": True}, 4).name == "fsspec"
    monkeypatch.setenv("FASTLOAD_STORE_CLIENT", "fsspec")  # the way back
    assert make_client("s3://b/x", "s3", {"anon": True}, 4).name == "fsspec"


def test_a_get_is_bounded_by_its_size_class() -> None:
    pytest.importorskip("obstore", reason="the obstore client needs obstore: pip install -e '.[dev]'")
    from fastload.storage.client_obstore import size_class

    assert [size_class(n) for n in (1, 1 << 16, (1 << 16) + 1, 3 << 20, 4 << 20)] == \
        [1 << 16, 1 << 16, 1 << 17, 4 << 20, 4 << 20]
