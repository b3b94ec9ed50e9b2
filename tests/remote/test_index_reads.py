"""An index column in a store that cannot be read whole (cut to nothing in the store, or cut short
on every try on the wire) is an error naming the column's object and what to do, never
"cannot be read (None)"."""

from __future__ import annotations

import pytest
from fastload.converters import pack

from fastload import PackedDataset
from fastload.errors import ManifestError, RemoteReadError
from fastload.storage.remote import RemoteStore
from tests.conftest import make_jpeg


@pytest.fixture
def packed(tmp_path, s3_server, s3_bucket) -> RemoteStore:
    root = tmp_path / "images"
    (root / "c0").mkdir(parents=True)
    for i in range(6):
        (root / "c0" / f"{i}.jpg").write_bytes(make_jpeg(30 + i, 20, seed=i))
    store = RemoteStore(f"s3://{s3_bucket}/ds.fl", s3_server.storage_options())
    pack(root, store.url, progress=False, storage_options=store.options, staging=tmp_path / "staging")
    return store


def _label_column(store: RemoteStore) -> str:
    return PackedDataset(store.url, storage_options=store.options, cache_limit=0).manifest.index["label"].file


def test_an_index_column_emptied_in_the_store_fails_its_digest(packed):
    name = _label_column(packed)
    packed.put_bytes(name, b"")
    with pytest.raises(ManifestError, match=rf"{packed.display(name)}: index column 'label' does not match "
                                            r"the digest .*re-pack the dataset"):
        PackedDataset(packed.url, storage_options=packed.options, cache_limit=0)


def test_an_index_column_cut_short_on_every_try_names_the_object(packed, s3_server, fault_proxy):
    name = _label_column(packed)
    fault_proxy.fail_next("truncate", count=100, match=lambda request: request.path.endswith(name))
    with pytest.raises(RemoteReadError) as info:
        PackedDataset(packed.url, storage_options=s3_server.storage_options(fault_proxy.url), cache_limit=0)
    message = str(info.value)
    assert message.startswith(packed.display(name)) and "failed 6 times" in message and "(None)" not in message
