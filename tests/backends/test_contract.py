"""Every decoding backend (``dali``, ``nvimgcodec``) against ``backend="torch"``: the same samples,
order, labels, crops, epochs, partial batches, resume, ranks, stats and errors in their turn; pixels
within the tolerances each backend was measured at (tests/backends/contract.py). Real pipelines on
real packed datasets: CPU operators and codecs everywhere, ``device="cuda"`` on a lent GPU."""

from __future__ import annotations

import inspect
import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload.decode.crops import decode_crop
from fastload.errors import CorruptRecordError
from fastload.loading.transfer import Normalizer
from fastload.sampling.epoch_sampler import EpochSampler
from tests.backends.contract import (
    BACKENDS,
    BATCH,
    DEVICES,
    FULL_SCALE_TOLERANCE,
    MEAN,
    SIZE,
    STD,
    TORCH_TOLERANCE,
    assert_close,
    make,
    run,
    same_crops,
)
from tests.conftest import flip_payload_byte
from tests.loading.helpers import ID_RECORDS, UnevenBatches


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("storage", ["lmdb", "hdf5"])
def test_same_labels_order_shapes_and_dtypes_as_torch(backend, packed, storage, device):
    torch_loader = make(packed[storage], "torch")
    tested = make(packed[storage], backend, device=device)
    assert tested.backend == backend and len(tested) == len(torch_loader) == 8
    for _ in range(2):  # two epochs: each a new permutation, the same on both backends
        expected, _, _ = run(torch_loader)
        batches = list(tested)
        assert [len(y) for _, y in batches] == [BATCH] * 7 + [2]
        for x, y in batches:
            assert x.dtype == torch.uint8 and x.shape[1:] == (3, SIZE, SIZE) and x.is_contiguous()
            assert y.dtype == torch.int64 and y.shape == (len(x),)
            assert x.device.type == y.device.type == device
        assert [i for _, y in batches for i in y.tolist()] == expected
    assert sorted(expected) == list(range(ID_RECORDS))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_eval_pixels_close_to_the_torch_backend(backend, packed, device):
    ids, expected, _ = run(make(packed["lmdb"], "torch", train=False, shuffle=False))
    tested_ids, got, _ = run(make(packed["lmdb"], backend, train=False, shuffle=False, device=device))
    assert tested_ids == ids == list(range(ID_RECORDS))
    assert_close(got, expected, TORCH_TOLERANCE)
    assert not torch.equal(got, expected)  # two decoders: equal would mean torch's ran twice


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_same_crop_boxes_and_flips_as_the_torch_backend(backend, packed, train, device):
    """Against Pillow decoding each sample's own plan at full scale, the backend is within rounding: a
    box off by one pixel or a missed flip would be far outside these bounds."""
    path = packed["lmdb"]
    loader = make(path, backend, train=train, seed=5, device=device)
    ds = loader.dataset
    flips = Counter()
    for epoch in range(2):
        ids, got, _ = run(loader)
        reference = []
        for i in ids:
            plan = ds.pipeline.plan(i, epoch, 5, int(ds.index.width[i]), int(ds.index.height[i]))
            flips[plan.flip] += 1
            pixels = decode_crop(ds.reader.read(i), plan, draft=False)
            reference.append(torch.from_numpy(np.array(pixels)).permute(2, 0, 1))
        assert_close(got, torch.stack(reference), FULL_SCALE_TOLERANCE[(backend, device)])
        # ... and within the stated tolerance of the torch backend itself.
        torch_ids, torch_pixels, _ = run(_torch_epoch(path, train, epoch))
        assert torch_ids == ids
        assert_close(got, torch_pixels, TORCH_TOLERANCE)
    if train:
        assert flips[True] > 10 and flips[False] > 10  # both kinds of sample were checked


def _torch_epoch(path: Path, train: bool, epoch: int):
    loader = make(path, "torch", train=train, seed=5)
    loader.set_epoch(epoch)
    return loader


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_dtype_and_channels_last_come_as_asked(backend, packed, device):
    floats = make(packed["hdf5"], backend, device=device, seed=2, mean=MEAN, std=STD)
    halves = make(packed["hdf5"], backend, device=device, seed=2, mean=MEAN, std=STD, dtype=torch.bfloat16,
                  memory_format=torch.channels_last)
    for (x, y), (h, z) in zip(floats, halves, strict=True):
        assert h.dtype == torch.bfloat16 and h.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(h, x.to(torch.bfloat16)) and torch.equal(y, z)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
def test_mean_std_gives_float32_normalised_like_the_torch_backend(backend, packed, device):
    uint8 = make(packed["hdf5"], backend, device=device, seed=2)
    floats = make(packed["hdf5"], backend, device=device, seed=2, mean=MEAN, std=STD)
    torch_floats = make(packed["hdf5"], "torch", seed=2, mean=MEAN, std=STD)
    ids, pixels, _ = run(uint8)
    batches = list(floats)
    assert all(x.dtype == torch.float32 and x.shape[1:] == (3, SIZE, SIZE) for x, _ in batches)
    assert [i for _, y in batches for i in y.tolist()] == ids
    got = torch.cat([x.cpu() for x, _ in batches])
    # The backend normalised its own pixels exactly as fastload's Normalizer would ...
    torch.testing.assert_close(got, Normalizer(MEAN, STD)((pixels,))[0], atol=1e-5, rtol=0)
    # ... and they are within the pixel tolerance of the torch backend's (1 level = 1/(255 std)).
    expected = torch.cat([x for x, _ in torch_floats])
    scale = torch.tensor([255 * s for s in STD]).view(1, 3, 1, 1)
    assert float(((got - expected).abs() * scale).mean()) < TORCH_TOLERANCE[0]


# --- epochs, partial batches, resume, ranks -------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_epochs_and_set_epoch_follow_the_sampler(backend, packed):
    path = packed["lmdb"]
    torch_loader, tested = make(path, "torch"), make(path, backend)
    epochs = [run(torch_loader)[0] for _ in range(3)]
    assert epochs[0] != epochs[1] != epochs[2]
    assert [run(tested)[0] for _ in range(3)] == epochs  # each new iteration is the next epoch
    tested.set_epoch(1)
    assert run(tested)[0] == epochs[1]
    assert run(tested)[0] == epochs[2]
    tested.set_epoch(9)
    torch_loader.set_epoch(9)
    assert run(tested)[0] == run(torch_loader)[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("batch_size", [5, 37, 40])
def test_last_partial_batch_kept_or_dropped(backend, packed, drop_last, batch_size):
    torch_loader = make(packed["lmdb"], "torch", batch_size=batch_size, drop_last=drop_last)
    tested = make(packed["lmdb"], backend, batch_size=batch_size, drop_last=drop_last)
    expected_ids, _, expected_sizes = run(torch_loader)
    ids, _, sizes = run(tested)
    assert (ids, sizes) == (expected_ids, expected_sizes)
    full, rest = divmod(ID_RECORDS, batch_size)
    assert sizes == [batch_size] * full + ([rest] if rest and not drop_last else [])
    assert len(tested) == len(sizes)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_sampler_of_growing_batches(backend, packed):
    """Batches of 1, 2, 3, … plain indices: the pipeline is rebuilt wider as they grow."""
    def loader(backend: str):
        ds = fastload.PackedDataset(packed["lmdb"], image_size=SIZE, train=False)
        return fastload.DataLoader(ds, batch_sampler=UnevenBatches(ID_RECORDS), backend=backend)

    expected_ids, expected, expected_sizes = run(loader("torch"))
    ids, got, sizes = run(loader(backend))
    assert (ids, sizes) == (expected_ids, expected_sizes) and sizes[:4] == [1, 2, 3, 4]
    assert_close(got, expected, TORCH_TOLERANCE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("consumed", [0, 3, 7, 8], ids=["start", "mid", "last-batch", "end"])
def test_resume_mid_epoch_yields_exactly_the_rest(backend, packed, consumed, device):
    path = packed["lmdb"]
    reference = make(path, backend, device=device)
    first, second = run(reference), run(reference)

    saver = make(path, backend, device=device)
    it = iter(saver)
    for _ in range(consumed):
        next(it)  # batches decoded ahead must not count
    state = json.loads(json.dumps(saver.state_dict()))
    del it

    resumed = make(path, backend, device=device)
    resumed.load_state_dict(state)
    ids, pixels, _ = run(resumed)
    if consumed < 8:
        assert (state["epoch"], state["position"]) == (0, consumed * BATCH)
        assert ids == first[0][consumed * BATCH:]
        assert same_crops(pixels, first[1][consumed * BATCH:], device)  # same crops
        following = second
    else:  # the saved epoch was complete: resume at the next one
        assert ids == second[0] and same_crops(pixels, second[1], device)
        following = run(reference)
    assert run(resumed)[0] == following[0]
    # A state saved by one backend resumes the other at the same sample.
    other = make(path, "torch")
    other.load_state_dict(state)
    assert run(other)[0] == (ids if consumed < 8 else second[0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("drop_last", [True, False])
def test_two_rank_shares_are_disjoint_and_complete(backend, packed, drop_last):
    """Two ranks' loaders (the EpochSampler each rank would build) split every epoch exactly."""
    def rank_loader(rank: int, backend: str):
        ds = fastload.PackedDataset(packed["lmdb"], image_size=SIZE, train=True)
        sampler = EpochSampler(len(ds), shuffle=True, seed=4, rank=rank, world_size=2,
                               drop_last=drop_last, keyed=True)
        return fastload.DataLoader(ds, batch_size=4, sampler=sampler, backend=backend, seed=4)

    tested = [rank_loader(r, backend) for r in range(2)]
    reference = [rank_loader(r, "torch") for r in range(2)]
    for _ in range(2):
        shares = [run(loader) for loader in tested]
        assert [s[0] for s in shares] == [run(loader)[0] for loader in reference]
        assert len(shares[0][2]) == len(shares[1][2])  # the same number of batches on both ranks
        ids = Counter(shares[0][0] + shares[1][0])
        if drop_last:  # 36 of 37 samples, each exactly once
            assert len(ids) == ID_RECORDS - 1 and set(ids.values()) == {1}
        else:  # all 37, one of them twice (the DistributedSampler padding policy)
            assert set(ids) == set(range(ID_RECORDS)) and sum(ids.values()) == ID_RECORDS + 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("taken", [1, 2, 6])
def test_no_stale_batch_after_breaking_out_early(backend, packed, taken, device):
    path = packed["lmdb"]
    reference = make(path, backend, device=device)
    epochs = [run(reference) for _ in range(2)]
    loader = make(path, backend, device=device)
    ids, pixels, _ = run(loader, limit=taken)  # broken off with batches still in flight
    assert ids == epochs[0][0][:taken * BATCH]
    ids, pixels, _ = run(loader)
    assert ids == epochs[1][0] and same_crops(pixels, epochs[1][1], device)
    assert loader.state_dict()["epoch"] == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_stats_count_what_was_delivered(backend, packed):
    loader = make(packed["hdf5"], backend)
    run(loader)
    stats = loader.stats()
    assert stats["samples"] == ID_RECORDS and stats["batches"] == 8
    assert stats["mb_per_s"] > 0 and 0 <= stats["wait_fraction"] <= 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_rebuilt_loader_keeps_the_backend(backend, packed):
    """Lightning re-creates the loader from its attributes named like __init__'s parameters."""
    loader = make(packed["lmdb"], backend)
    names = [n for n in inspect.signature(fastload.DataLoader.__init__).parameters
             if n not in ("self", "dataset")]
    rebuilt = fastload.DataLoader(loader.dataset, **{n: getattr(loader, n) for n in names})
    assert rebuilt.backend == backend
    loader.set_epoch(0)
    expected = run(loader)[0]
    rebuilt.set_epoch(0)
    assert run(rebuilt)[0] == expected


@pytest.mark.parametrize("backend", BACKENDS)
def test_target_transform_applies_to_the_labels(backend, packed):
    ds = fastload.PackedDataset(packed["lmdb"], image_size=SIZE, train=True, target_transform=lambda y: 100 + y)
    ids, _, _ = run(fastload.DataLoader(ds, batch_size=BATCH, shuffle=False, backend=backend))
    assert ids == [100 + i for i in range(ID_RECORDS)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_pixels_is_enforced_before_decoding(backend, packed):
    ds = fastload.PackedDataset(packed["lmdb"], image_size=SIZE, train=False, max_pixels=64 * 64)
    loader = fastload.DataLoader(ds, batch_size=BATCH, shuffle=False, backend=backend)
    big = next(i for i in range(ID_RECORDS) if ds.index.width[i] * ds.index.height[i] > 64 * 64)
    delivered = []
    with pytest.raises(CorruptRecordError, match=rf"record {big} .*possible decompression bomb"):
        for _, y in loader:
            delivered += y.tolist()
    assert delivered == list(range(big // BATCH * BATCH))  # the batches before its own


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_damaged_record_fails_after_the_batches_before_it(backend, packed, tmp_path):
    """A checksum failure while reading ahead waits for its turn, as in the torch backend."""
    dataset = shutil.copytree(packed["lmdb"], tmp_path / "ids.fl")
    bad = 16
    flip_payload_byte(dataset, bad)
    loader = make(dataset, backend, shuffle=False)
    delivered = []
    with pytest.raises(CorruptRecordError, match=f"record {bad} "):
        for _, y in loader:
            delivered += y.tolist()
    assert delivered == list(range(15))
