"""iter(fastload.DataLoader) is torch's kind of iterator: a batch that raised raises in its turn
and the next batch follows, and the attributes code around a loader reads are there."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

import fastload
from fastload.errors import CorruptRecordError

from .helpers import Numbers, as_plain


class OddBatchesFail(Numbers):
    """With batch_size=2, every other batch holds a sample that raises: 50 of 100 batches."""

    def __getitem__(self, i: int):
        if i % 4 == 1:
            raise ValueError(f"sample {i} is broken")
        return super().__getitem__(i)


def walk(loader) -> tuple[list, list[str]]:
    """Every batch and every error of one pass, calling next() after each error as torch's tests do."""
    it, batches, errors = iter(loader), [], []
    while True:
        try:
            batches.append(as_plain(next(it)))
        except StopIteration:
            return batches, errors
        except Exception as exc:  # noqa: BLE001
            errors.append(str(exc).strip().splitlines()[-1] if "Caught" in str(exc) else str(exc))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_each_failing_batch_raises_and_the_next_one_follows(num_workers):
    dataset = OddBatchesFail(200)
    theirs = walk(TorchLoader(dataset, batch_size=2, num_workers=num_workers))
    ours = walk(fastload.DataLoader(dataset, batch_size=2, num_workers=num_workers))
    assert len(ours[1]) == 50 and len(ours[0]) == 50
    assert ours == theirs


def test_a_bad_record_in_the_threads_mode_raises_and_the_epoch_goes_on(id_packed, tmp_path):
    from tests.conftest import copy_dataset, flip_payload_byte

    dataset = copy_dataset(id_packed("lmdb"), tmp_path / "ds")
    flip_payload_byte(dataset, 5)
    ds = fastload.PackedDataset(dataset, image_size=32, train=True)
    loader = fastload.DataLoader(ds, batch_size=4, mode="threads")
    assert loader.settings.mode == "threads"
    it = iter(loader)
    seen, errors = 0, 0
    while True:
        try:
            seen += len(next(it)[1])
        except StopIteration:
            break
        except CorruptRecordError:
            errors += 1
    assert errors == 1 and seen == len(ds) - 4  # the batch holding record 5 raised; the rest came


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_iterator_is_torchs_kind_with_its_attributes(num_workers):
    loader = fastload.DataLoader(Numbers(10), batch_size=3, num_workers=num_workers)
    it = iter(loader)
    assert isinstance(it, _BaseDataLoaderIter) and iter(it) is it
    assert len(it) == len(TorchLoader(Numbers(10), batch_size=3)) == 4
    assert it._num_yielded == 0
    next(it)
    assert it._num_yielded == 1
    if num_workers:
        assert len(it._workers) == 2 and all(w.is_alive() for w in it._workers)
    assert len(list(it)) == 3 and it._num_yielded == 4


def test_the_device_feed_raises_a_failing_batch_in_its_turn():
    """One batch ahead (the CUDA path's shape, run here on the CPU): the batch copied before an
    error is delivered first, then the error, then the batches after it."""
    from fastload.loading.transfer import DeviceFeed

    def source():
        yield from ([1], [2])

    class Source:
        def __init__(self):
            self.items = iter([[1], ValueError("bad"), [3]])

        def __next__(self):
            item = next(self.items)
            if isinstance(item, Exception):
                raise item
            return torch.tensor(item)

    feed = DeviceFeed(Source(), torch.device("cpu"), None)
    assert next(feed).tolist() == [1]
    with pytest.raises(ValueError, match="bad"):
        next(feed)
    assert next(feed).tolist() == [3]
    with pytest.raises(StopIteration):
        next(feed)


def _clone(batch):
    return [t.clone() for t in batch]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_of_nested_tensors_are_counted_and_delivered(num_workers):
    """torch's test_nested_tensor_multiprocessing: a nested tensor has no ``shape``; the loader
    counts a batch's samples without asking for it."""
    data = [torch.nested.nested_tensor([torch.randn(5)]) for _ in range(6)]
    loader = fastload.DataLoader(data, batch_size=1, num_workers=num_workers, collate_fn=_clone)
    batches = list(loader)
    assert len(batches) == 6 and all(b[0].is_nested for b in batches)
    assert loader.stats()["samples"] == 6
