"""Frameworks rebuild loaders: Lightning from the attributes named like ``__init__``'s parameters,
Accelerate as a plain torch DataLoader over ``batch_sampler``. The rebuilt loader yields the same."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DistributedSampler, RandomSampler

import fastload
from fastload.samples.collate import collate_images
from fastload.sampling.epoch_sampler import EpochSampler

from .helpers import ID_RECORDS, EveryThird, Numbers, UnevenBatches, epoch, ids_and_pixels

N = 23
PARAMETERS = [name for name in inspect.signature(fastload.DataLoader.__init__).parameters
              if name not in ("self", "dataset")]


def rebuild_from_attributes(loader: fastload.DataLoader) -> fastload.DataLoader:
    """Every ``__init__`` parameter read back from the attribute of the same name."""
    return fastload.DataLoader(loader.dataset, **{name: getattr(loader, name) for name in PARAMETERS})


def rebuild_like_lightning(loader: fastload.DataLoader, sampler: Any) -> fastload.DataLoader:
    """What Lightning's ``_get_dataloader_init_args_and_kwargs`` does for a loader it did not wrap:
    the instance attributes whose value is not the parameter's default, the dataset, and its own
    sampler with ``shuffle=False`` and no batch_sampler."""
    attrs = {k: v for k, v in vars(loader).items() if not k.startswith("_")}
    attrs["multiprocessing_context"] = loader.multiprocessing_context
    params = dict(inspect.signature(loader.__init__).parameters)
    kwargs = {name: attrs[name] for name, p in params.items()
              if name in attrs and p.default is not attrs[name]}
    kwargs["dataset"] = loader.dataset
    kwargs.update(sampler=sampler, shuffle=False, batch_sampler=None)
    return type(loader)(**kwargs)


def reseed(loader: Any) -> Any:
    """Put the loader's order back at its first epoch (its sampler object may be shared)."""
    sampler = getattr(loader.batch_sampler, "sampler", loader.sampler)
    if isinstance(sampler, EpochSampler):
        sampler.set_epoch(0)
    elif isinstance(sampler, RandomSampler) and sampler.generator is not None:
        sampler.generator.manual_seed(7)
    return loader


PLAIN = {
    "sequential": lambda: {"batch_size": 4},
    "shuffle-generator": lambda: {"batch_size": 4, "shuffle": True, "generator": torch.Generator()},
    "shuffle-drop-last-workers": lambda: {"batch_size": 5, "shuffle": True, "drop_last": True,
                                          "generator": torch.Generator(), "num_workers": 2},
    "sampler": lambda: {"batch_size": 3, "sampler": EveryThird(N)},
    "batch-sampler": lambda: {"batch_sampler": UnevenBatches(N)},
    "no-batching": lambda: {"batch_size": None},
    "distributed": lambda: {"batch_size": 4, "shuffle": True, "distributed": True, "num_workers": 0},
    "auto": lambda: {"batch_size": 4, "shuffle": False},
}


@pytest.mark.parametrize("case", list(PLAIN))
def test_rebuild_from_every_attribute_on_a_plain_dataset(case, request):
    if case == "distributed":  # needs a process group; rank 0 of 1 is enough here
        request.getfixturevalue("one_rank_group")
    loader = fastload.DataLoader(Numbers(N), **PLAIN[case]())
    expected = epoch(reseed(loader))
    rebuilt = rebuild_from_attributes(loader)
    assert epoch(reseed(rebuilt)) == expected
    assert len(rebuilt) == len(loader)
    # And once more, from the rebuilt loader's own attributes.
    assert epoch(reseed(rebuild_from_attributes(rebuilt))) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_rebuild_from_every_attribute_on_a_packed_dataset(id_packed, num_workers, drop_last):
    ds = fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True)
    loader = fastload.DataLoader(ds, batch_size=5, shuffle=True, drop_last=drop_last, num_workers=num_workers)
    ids, pixels = ids_and_pixels(reseed(loader))
    rebuilt = rebuild_from_attributes(loader)
    assert rebuilt.epoch_sampler is loader.epoch_sampler
    got_ids, got_pixels = ids_and_pixels(reseed(rebuilt))
    assert got_ids == ids and len(ids) == (ID_RECORDS // 5 * 5 if drop_last else ID_RECORDS)
    assert all(torch.equal(a, b) for a, b in zip(got_pixels, pixels))


def test_lightning_rebuild_keeps_the_loader(id_packed):
    """Without a distributed sampler to inject, Lightning passes the loader's own sampler back."""
    ds = fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True)
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2, mean=[0.5] * 3, std=[0.25] * 3)
    expected = ids_and_pixels(reseed(loader))
    rebuilt = rebuild_like_lightning(loader, loader.sampler)
    got = ids_and_pixels(reseed(rebuilt))
    assert got[0] == expected[0]
    assert all(torch.equal(a, b) for a, b in zip(got[1], expected[1]))
    assert got[1][0].dtype == torch.float32  # mean/std survived the rebuild
    assert rebuilt.num_workers == 2


@pytest.mark.parametrize("num_workers", [0, 2])
def test_lightning_injects_a_distributed_sampler(id_packed, num_workers):
    """Lightning under DDP rebuilds with ``DistributedSampler``: the rebuilt loader reads exactly
    that sampler's share, as torch's loader does with it."""
    ds = fastload.PackedDataset(id_packed("hdf5"), image_size=24, train=False)
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=num_workers)

    def injected() -> DistributedSampler:
        return DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)

    rebuilt = rebuild_like_lightning(loader, injected())
    reference = torch.utils.data.DataLoader(ds, batch_size=4, sampler=injected(), collate_fn=collate_images)
    got, expected = ids_and_pixels(rebuilt), ids_and_pixels(reference)
    assert got[0] == expected[0] == list(injected())
    assert all(torch.equal(a, b) for a, b in zip(got[1], expected[1]))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_accelerate_rebuild_as_a_torch_loader(id_packed, num_workers):
    """Accelerate replaces the loader with torch's, from the dataset and the standard settings:
    the batches, augmentations included, come from the Dataset and the batch_sampler, not __iter__."""
    ds = fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True)
    loader = fastload.DataLoader(ds, batch_size=6, shuffle=True, drop_last=True, num_workers=num_workers)
    expected = ids_and_pixels(reseed(loader))
    plain = torch.utils.data.DataLoader(loader.dataset, batch_sampler=loader.batch_sampler,
                                        num_workers=loader.num_workers, collate_fn=loader.collate_fn,
                                        pin_memory=loader.pin_memory)
    assert type(plain.batch_sampler) is BatchSampler
    got = ids_and_pixels(reseed(plain))
    assert got[0] == expected[0] and len(got[0]) == 36
    assert all(torch.equal(a, b) for a, b in zip(got[1], expected[1]))
