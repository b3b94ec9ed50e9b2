"""A split of a PackedDataset keeps the fast path: ``torch.utils.data.Subset``/``random_split``
parts and ``PackedDataset.split``/``subset`` load with decode threads, the epoch sampler and resume,
and yield exactly their samples."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import Subset, random_split

import fastload

from .helpers import ID_RECORDS


def packed(path, train: bool = True) -> fastload.PackedDataset:
    return fastload.PackedDataset(path, image_size=16, train=train)


def ids(loader) -> list[int]:
    return [i for _, labels in loader for i in labels.tolist()]


def test_a_random_split_part_loads_on_the_fast_path_with_exactly_its_samples(id_packed):
    ds = packed(id_packed("lmdb"))
    part, rest = random_split(ds, [0.75, 0.25], generator=torch.Generator().manual_seed(0))
    whole = fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=0)
    loader = fastload.DataLoader(part, batch_size=4, shuffle=True, seed=0)
    assert loader.settings.mode == whole.settings.mode and loader.settings.num_workers == whole.settings.num_workers
    assert loader.epoch_sampler is not None and isinstance(loader.dataset, fastload.PackedDataset)
    assert sorted(ids(loader)) == sorted(part.indices)  # labels are record numbers
    assert len(loader) == -(-len(part) // 4)
    assert sorted(ids(fastload.DataLoader(rest, batch_size=4))) == sorted(rest.indices)


def test_a_subset_gives_torchs_batches(id_packed):
    ds = packed(id_packed("hdf5"), train=False)
    nested = Subset(Subset(ds, list(range(30, 0, -2))), [0, 3, 4, 7, 9])  # records 30, 24, 22, 16, 12
    ours = list(fastload.DataLoader(nested, batch_size=2, num_workers=0))
    theirs = list(torch.utils.data.DataLoader(nested, batch_size=2, num_workers=0))
    assert [b[1].tolist() for b in ours] == [b[1].tolist() for b in theirs] == [[30, 24], [22, 16], [12]]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(ours, theirs))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_split_resumes_mid_epoch(id_packed, num_workers):
    train, _ = packed(id_packed("lmdb")).split([0.8, 0.2], seed=1)
    expected = ids(fastload.DataLoader(train, batch_size=4, shuffle=True, seed=2))
    saver = fastload.DataLoader(train, batch_size=4, shuffle=True, seed=2, num_workers=num_workers)
    it = iter(saver)
    next(it), next(it)
    state = json.loads(json.dumps(saver.state_dict()))
    del it
    resumed = fastload.DataLoader(train, batch_size=4, shuffle=True, seed=2, num_workers=num_workers)
    resumed.load_state_dict(state)
    assert ids(resumed) == expected[8:]


def test_split_is_disjoint_whole_and_set_by_its_seed(id_packed):
    ds = packed(id_packed("lmdb"))
    a, b = ds.split([0.8, 0.2], seed=1)
    assert (len(a), len(b)) == (30, 7)  # 29.6 and 7.4: the remainder goes round-robin, as random_split's
    assert sorted([*a.targets.tolist(), *b.targets.tolist()]) == list(range(ID_RECORDS))
    assert a.targets.tolist() == ds.split([0.8, 0.2], seed=1)[0].targets.tolist()
    assert a.targets.tolist() != ds.split([0.8, 0.2], seed=2)[0].targets.tolist()
    assert [len(p) for p in ds.split([10, 27])] == [10, 27]
    with pytest.raises(ValueError, match="summing to 37"):
        ds.split([10, 10])
    with pytest.raises(IndexError, match="index 37 is out of range"):
        ds.subset([0, 37])
    assert a.subset([-1]).targets.tolist() == a.targets[-1:].tolist()
