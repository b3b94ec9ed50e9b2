"""A loader pickles and copies like torch's at any point (fresh, mid-epoch, after an epoch):
``ddp_spawn`` pickles loaders and user code deep-copies them. The copy iterates the batches the
original's next iteration would."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import fastload

from .helpers import Numbers


def packed_loader(path, num_workers):
    ds = fastload.PackedDataset(path, image_size=16, train=True)
    return fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=num_workers, seed=1)


def numbers_loader(_, num_workers):
    return fastload.DataLoader(Numbers(23), batch_size=4, shuffle=True, num_workers=num_workers)


def labels(loader) -> list[list[int]]:
    torch.manual_seed(7)  # what a RandomSampler without a generator draws from
    return [batch[1].tolist() for batch in loader]


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.parametrize("make", [packed_loader, numbers_loader], ids=["packed", "own-dataset"])
@pytest.mark.parametrize("num_workers", [0, 2, "auto"])
def test_a_loader_copies_at_any_point_and_the_copy_iterates_the_same(id_packed, how, make, num_workers):
    loader = make(id_packed("lmdb"), num_workers)
    clone = (lambda x: pickle.loads(pickle.dumps(x))) if how == "pickle" else copy.deepcopy
    for stage in ("fresh", "mid-epoch", "after an epoch"):
        if stage == "mid-epoch":
            it = iter(loader)
            next(it)
        elif stage == "after an epoch":
            list(loader)
        copied = clone(loader)
        assert labels(copied) == labels(loader), stage
