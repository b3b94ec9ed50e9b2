"""A dataset folder whose files are FIFOs or links to a device: refused at once, never a hang and
never an endless read, by PackedDataset, ``fastload info`` and ``fastload verify`` alike."""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path

import pytest

from fastload import PackedDataset
from fastload.errors import ManifestError
from fastload.verifier import verify
from tests.conftest import copy_dataset


def plant(dataset: Path, rel: str, kind: str) -> None:
    path = dataset / rel
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)


def shard_file(dataset: Path) -> str:
    return sorted(p.name for p in dataset.glob("shard-*"))[0]


CASES = [("manifest.json", "fifo"), ("manifest.json", "zero"), ("index/label.npy", "fifo"),
         ("index/path.blob.npy", "zero"), ("shard", "fifo"), ("shard", "zero")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("storage", ["lmdb", "hdf5"])
@pytest.mark.parametrize("rel, kind", CASES)
def test_fifos_and_devices_in_a_dataset_are_refused_without_reading(packed, tmp_path, cli, storage, rel, kind):
    dataset = copy_dataset(packed(storage)[0], tmp_path / "ds")
    in_shard = rel == "shard"
    rel = shard_file(dataset) if in_shard else rel
    plant(dataset, rel, kind)
    with pytest.raises(ManifestError) as err:
        ds = PackedDataset(dataset)
        for i in range(len(ds)):  # shards open lazily, at the first read
            ds.record(i)
    assert str(dataset / rel) in str(err.value) and "not a regular file" in str(err.value)
    # verify reports a bad shard among its findings; a bad manifest or index stops it at once
    with nullcontext() if in_shard else pytest.raises(ManifestError):
        assert not verify(dataset).ok
    result = cli("info", dataset)  # reads the manifest and index, not the shards
    if in_shard:
        assert result.rc == 0
    else:
        assert result.rc != 0 and "not a regular file" in result.err


def test_an_oversized_index_column_is_refused_before_it_is_read(packed, tmp_path):
    dataset = copy_dataset(packed("lmdb")[0], tmp_path / "ds")
    with open(dataset / "index" / "label.npy", "r+b") as f:
        f.truncate(3 * 2**30)  # sparse: 3 GB on paper
    with pytest.raises(ManifestError, match=r"label\.npy: index column 'label' cannot be read \(3221225472 bytes"):
        PackedDataset(dataset)
