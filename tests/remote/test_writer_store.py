"""The Python writer to an object store: staged locally, uploaded as a pack's, read back from the URL."""

from __future__ import annotations

import pytest

import fastload
from fastload.errors import PackError
from tests.conftest import make_jpeg


def test_a_writer_to_a_store_url_is_readable_there_and_refuses_to_replace_without_overwrite(
        tmp_path, s3_server, s3_bucket):
    url, options = f"s3://{s3_bucket}/written.fl", s3_server.storage_options()
    with fastload.Writer(url, storage_options=options, staging=tmp_path / "staging", shard_size="2KB") as w:
        for k in range(6):
            w.write({"image": make_jpeg(16, 16, seed=k), "label": k % 2, "caption": f"c{k}"})
    assert w.report.num_records == 6 and not (tmp_path / "staging").exists()
    ds = fastload.PackedDataset(url, storage_options=options, cache_limit=0)
    assert [ds.record(k)["data"] for k in range(6)] == [make_jpeg(16, 16, seed=k) for k in range(6)]
    with pytest.raises(PackError, match="already holds a finished dataset"):
        fastload.Writer(url, storage_options=options, staging=tmp_path / "staging")


def test_a_writer_overwriting_the_same_images_with_other_values_replaces_them(tmp_path, s3_server, s3_bucket):
    """Issue 37, item 1: the Writer's "already packed" (an upload finding the same dataset) covers
    every stored value, not the images' checksums alone."""
    url, options = f"s3://{s3_bucket}/values.fl", s3_server.storage_options()
    for captions, overwrite in ((["a", "b"], False), (["a", "changed"], True)):
        with fastload.Writer(url, storage_options=options, staging=tmp_path / "staging", overwrite=overwrite) as w:
            for k, caption in enumerate(captions):
                w.write({"image": make_jpeg(16, 16, seed=k), "label": k, "caption": caption})
        assert not w.report.already_packed
        ds = fastload.PackedDataset(url, storage_options=options, cache_limit=0)
        assert [ds.record(k)["caption"] for k in range(2)] == captions
