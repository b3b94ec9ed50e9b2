"""The fork-safe pattern users write for LMDB and HDF5 ("open the file lazily in __getitem__")
works under fastload.DataLoader with workers: its settings never call the dataset in the parent
(they read 17 samples there before), so every read goes through a handle opened by the process
that reads."""

from __future__ import annotations

import os

import h5py
import lmdb
import numpy as np
import pytest
import torch

import fastload

RECORDS = 256


class LazyLMDB(torch.utils.data.Dataset):
    def __init__(self, path: str) -> None:
        self.path, self.env, self.opened_by = path, None, -1

    def __len__(self) -> int:
        return RECORDS

    def __getitem__(self, i: int):
        if self.env is None:  # the usual pattern: one environment per process, opened on first use
            self.env = lmdb.open(self.path, readonly=True, lock=False, max_readers=1, subdir=False)
            self.opened_by = os.getpid()
        with self.env.begin() as txn:
            value = int(txn.get(i.to_bytes(4, "big")))
        return value, self.opened_by, os.getpid()


class LazyHDF5(torch.utils.data.Dataset):
    def __init__(self, path: str) -> None:
        self.path, self.file, self.opened_by = path, None, -1

    def __len__(self) -> int:
        return RECORDS

    def __getitem__(self, i: int):
        if self.file is None:
            self.file = h5py.File(self.path, "r")
            self.opened_by = os.getpid()
        return int(self.file["values"][i]), self.opened_by, os.getpid()


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("lazy")
    env = lmdb.open(str(base / "db.lmdb"), map_size=2**24, subdir=False)
    with env.begin(write=True) as txn:
        for i in range(RECORDS):
            txn.put(i.to_bytes(4, "big"), str(i * 3).encode())
    env.close()
    with h5py.File(base / "values.h5", "w") as f:
        f["values"] = np.arange(RECORDS) * 3
    return {"lmdb": LazyLMDB(str(base / "db.lmdb")), "hdf5": LazyHDF5(str(base / "values.h5"))}


@pytest.mark.parametrize("kind", ["lmdb", "hdf5"])
def test_a_lazily_opening_dataset_reads_through_handles_of_the_reading_process(stores, kind):
    dataset = stores[kind]
    fastload.DataLoader(dataset, batch_size=32)  # the defaults
    loader = fastload.DataLoader(dataset, batch_size=32, num_workers=2)
    assert dataset.opened_by == -1  # constructing the loaders did not touch the data
    values, opened_by, read_by = (torch.cat(parts).tolist() for parts in zip(*loader))
    assert values == [3 * i for i in range(RECORDS)]
    assert opened_by == read_by  # 256 of 256 reads used a handle of the reading process
    assert os.getpid() not in set(read_by) and dataset.opened_by == -1
