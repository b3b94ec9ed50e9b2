"""Device delivery on a real GPU: batches arrive on CUDA, equal to the CPU batches, normalised there."""

from __future__ import annotations

import pytest
import torch

import fastload

from .helpers import Numbers, epoch, ids_and_pixels

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a lent GPU)"),
]

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def packed_loader(path, **kwargs) -> fastload.DataLoader:
    ds = fastload.PackedDataset(path, image_size=32, train=True)
    return fastload.DataLoader(ds, batch_size=8, shuffle=True, **{"seed": 0, **kwargs})  # one order for every loader


@pytest.mark.parametrize("num_workers", [0, 2])
def test_cuda_batches_equal_the_cpu_batches(id_packed, num_workers):
    path = id_packed("lmdb")
    cpu = ids_and_pixels(packed_loader(path, num_workers=num_workers))
    loader = packed_loader(path, num_workers=num_workers, device="cuda")
    assert loader.settings.pin_memory is True  # auto: pinned pages for the asynchronous copy
    ids, images = [], []
    for x, y in loader:
        assert x.is_cuda and y.is_cuda and x.dtype == torch.uint8 and y.dtype == torch.int64
        # Use the batch at once, on the loop's stream: the side-stream copy must be complete.
        ids += y.tolist()
        images += list(x.cpu())
    assert ids == cpu[0]
    assert all(torch.equal(a, b) for a, b in zip(images, cpu[1]))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_normalised_on_the_gpu(id_packed, num_workers):
    path = id_packed("hdf5")
    raw = ids_and_pixels(packed_loader(path, num_workers=num_workers))
    loader = packed_loader(path, num_workers=num_workers, device="cuda", mean=MEAN, std=STD)
    mean = torch.tensor(MEAN, dtype=torch.float64).view(3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(3, 1, 1)
    got = []
    for x, y in loader:
        assert x.is_cuda and x.dtype == torch.float32 and y.is_cuda
        got += list(x.double().cpu())
    assert len(got) == len(raw[1])
    for norm, pixels in zip(got, raw[1]):
        torch.testing.assert_close(norm, (pixels.double() / 255 - mean) / std, atol=1e-5, rtol=0)


def test_every_epoch_and_a_broken_off_one_arrive_whole(id_packed):
    path = id_packed("lmdb")
    reference = packed_loader(path, num_workers=0)
    expected = [ids_and_pixels(reference) for _ in range(3)]
    loader = packed_loader(path, num_workers=0, device="cuda")
    it = iter(loader)
    next(it)  # broken off after one batch: the batch copied ahead is dropped with the iterator
    del it
    loader.set_epoch(0)
    for want in expected:
        got = [(y.tolist(), x.sum(dim=(1, 2, 3)).tolist()) for x, y in loader]
        assert [i for ids, _ in got for i in ids] == want[0]
        assert [s for _, sums in got for s in sums] == [int(p.sum()) for p in want[1]]


def test_plain_dataset_batches_move_to_the_gpu():
    ds = Numbers(23)
    cpu = epoch(torch.utils.data.DataLoader(ds, batch_size=4))
    loader = fastload.DataLoader(ds, batch_size=4, num_workers=0, device="cuda")
    batches = list(loader)
    assert all(t.is_cuda for batch in batches for t in batch)
    assert epoch([[t.cpu() for t in batch] for batch in batches]) == cpu


def test_explicit_cuda_index_and_pin_memory_false(id_packed):
    loader = packed_loader(id_packed("lmdb"), num_workers=0, device="cuda:0", pin_memory=False)
    assert loader.settings.pin_memory is False and loader.settings.reasons["pin_memory"] == "given"
    x, y = next(iter(loader))
    assert x.device == torch.device("cuda", 0) and y.device == torch.device("cuda", 0)
