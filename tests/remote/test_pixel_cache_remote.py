"""A dataset in an object store keeps its decoded pixels in the local pixel cache (issue 45, item 5):
the first epoch reads every record from the store and stores its pixels; the next reads none of
the records' bytes (no node cache here, so each would be a GET), yet gives the same samples."""

from __future__ import annotations

import pytest
import torch

from fastload import DataLoader, PackedDataset
from fastload.converters import pack
from tests.conftest import write_tree
from tests.pixels.conftest import RECORDS, photo_files


@pytest.fixture(scope="module")
def uploaded(tmp_path_factory, s3_server):
    root = tmp_path_factory.mktemp("pixels-store")
    write_tree(root / "images", photo_files())
    bucket = s3_server.make_bucket("pixel-cache")
    pack(root / "images", f"s3://{bucket}/photos.fl", shard_size="200KB", progress=False,
         storage_options=s3_server.storage_options(), staging=root / "staging")
    return f"s3://{bucket}/photos.fl"


def test_a_store_dataset_crops_from_local_pixels_after_the_first_epoch(uploaded, s3_server, fault_proxy, tmp_path):
    ds = PackedDataset(uploaded, image_size=64, train=True, storage_options=s3_server.storage_options(fault_proxy.url),
                       cache_limit=0, pixel_cache=tmp_path)
    loader = DataLoader(ds, batch_size=6, seed=4)
    first = [(x.clone(), y) for x, y in loader]
    assert loader.stats(reset=True)["pixel_cache"]["stored"] == RECORDS
    fault_proxy.clear()
    second = [(x.clone(), y) for x, y in loader]
    assert loader.stats()["pixel_cache"]["hits"] == RECORDS
    assert not [r for r in fault_proxy.requests if r.method == "GET" and "range" in r.headers]
    again = DataLoader(PackedDataset(uploaded, image_size=64, train=True, storage_options=s3_server.storage_options(),
                                     cache_limit=0, pixel_cache=tmp_path), batch_size=6, seed=4)
    again.set_epoch(1)
    for (x, y), (w, v) in zip(second, again):  # another process's view of the same cache
        assert torch.equal(x, w) and torch.equal(y, v)
    assert len(first) == len(second)
