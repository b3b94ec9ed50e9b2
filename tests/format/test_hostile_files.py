"""A dataset folder whose files are FIFOs or links to a device: refused at once, never a hang and
never an endless read, by PackedDataset, ``fastload info`` and ``fastload verify`` alike."""

from __future__ import annotations

import os
import shutil
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
    rel = shard_file(dataset) if rel == "shard" else rel
    plant(dataset, rel, kind)
    expected = "not a regular file" if rel != shard_file(dataset) else "not a regular file"
    with pytest.raises(ManifestError) as err:
        ds = PackedDataset(dataset)
        for i in range(len(ds)):  # shards open lazily, at the first read
            ds.record(i)
    assert str(dataset / rel) in str(err.value) and expected in str(err.value)
    with pytest.raises(ManifestError) if rel in ("manifest.json", "index/label.npy", "index/path.blob.npy") \
            else _no_raise():
        report = verify(dataset)
        assert not report.ok
    result = cli("info", dataset)
    if rel.startswith(("manifest", "index")):
        assert result.rc != 0 and "not a regular file" in result.err


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_an_oversized_index_column_is_refused_before_it_is_read(packed, tmp_path):
    dataset = copy_dataset(packed("lmdb")[0], tmp_path / "ds")
    with open(dataset / "index" / "label.npy", "r+b") as f:
        f.truncate(3 * 2**30)  # sparse: 3 GB on paper
    with pytest.raises(ManifestError, match=r"label\.npy: index column 'label' cannot be read \(3221225472 bytes"):
        PackedDataset(dataset)
