"""Resume with any sampler: torch's loaders drawing through ResumableSampler, saved after k batches
and resumed by new loader and sampler objects, yield exactly the rest of the pass, then what the
uninterrupted run yields next; the user's global RNG is left alone."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

import fastload
from fastload.sampling.iterable_resume import iterable_state, load_iterable_state

N = 23


class Indices(Dataset):
    """Sample ``i`` is ``i``: a batch says which indices it holds."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return int(i)


class StatefulSampler(Sampler[int]):
    """A user sampler that resumes itself (torchdata's convention): ``(seed, epoch)`` decides the
    order, ``yielded`` is where the pass is (epoch -1: none began); each new ``__iter__`` is the
    next epoch, unless ``load_state_dict`` restored a pass in progress."""

    def __init__(self, n: int, seed: int = 5) -> None:
        self.n, self.seed, self.epoch, self.yielded = n, seed, -1, 0
        self._resumed = False

    def __iter__(self) -> Iterator[int]:
        if not self._resumed or self.yielded >= self.n or self.epoch < 0:
            self.epoch, self.yielded = self.epoch + 1, 0
        self._resumed = False
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        for i in order[self.yielded:].tolist():
            self.yielded += 1
            yield i

    def __len__(self) -> int:
        resuming = self._resumed and 0 <= self.epoch and self.yielded < self.n
        return self.n - self.yielded if resuming else self.n

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.yielded, self._resumed = state["epoch"], state["yielded"], True


ResumingLoader = fastload.DataLoader  # draws its index sampler through a ResumableSampler


def distributed(rank: int) -> Callable[[Dataset], dict[str, Any]]:
    def make(ds: Dataset) -> dict[str, Any]:
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True)
        sampler.set_epoch(3)
        return {"sampler": sampler, "batch_size": 3}
    return make


# Each case makes its loader's arguments afresh, for a new dataset object.
CASES: dict[str, Callable[[Dataset], dict[str, Any]]] = {
    "random": lambda ds: {"batch_size": 3, "shuffle": True},
    "random-generator": lambda ds: {"batch_size": 3, "sampler": RandomSampler(
        ds, generator=torch.Generator().manual_seed(11))},
    "random-replacement": lambda ds: {"batch_size": 3, "sampler": RandomSampler(ds, replacement=True)},
    "random-num-samples": lambda ds: {"batch_size": 2, "sampler": RandomSampler(ds, num_samples=7)},
    "sequential": lambda ds: {"batch_size": 4, "sampler": SequentialSampler(ds)},
    "batch-sampler": lambda ds: {"batch_sampler": BatchSampler(RandomSampler(ds), 4, drop_last=True)},
    "subset-random": lambda ds: {"batch_size": 3, "sampler": SubsetRandomSampler(range(3, 20))},
    "weighted-unbatched": lambda ds: {"batch_size": None, "sampler": WeightedRandomSampler(
        torch.arange(1.0, N + 1), 15)},
    "distributed-rank0": distributed(0),
    "distributed-rank1": distributed(1),
    "stateful": lambda ds: {"batch_size": 3, "sampler": StatefulSampler(N)},
}


def make_loader(case: str, num_workers: int) -> ResumingLoader:
    ds = Indices()
    return ResumingLoader(ds, num_workers=num_workers, **CASES[case](ds))


def as_list(batch: Any) -> list[int] | int:
    return torch.as_tensor(batch).tolist()


@pytest.mark.parametrize("save_workers, load_workers", [(0, 2), (2, 0)])
@pytest.mark.parametrize("case", list(CASES))
def test_resume_yields_the_rest_of_the_pass_then_the_next(case, save_workers, load_workers):
    torch.manual_seed(1)
    saver = make_loader(case, save_workers)
    list(saver)  # the measured pass is the second: its sampler's generator is not where it began
    length = len(saver)
    positions = sorted({0, 1, length // 2, length - 1, length})
    # One uninterrupted pass, saving (as a checkpoint would: the loader's state and torch's RNG)
    # after each position; taking a state must not change what the pass yields.
    saved: dict[int, tuple[dict[str, Any], torch.Tensor]] = {}
    passed: list[Any] = []
    it = iter(saver)
    for k in range(length + 1):
        if k in positions:
            saved[k] = json.loads(json.dumps(saver._resumable.state(k))), torch.get_rng_state()
        if k < length:
            passed.append(as_list(next(it)))
    assert next(it, None) is None
    following = [as_list(b) for b in saver]

    for k in positions:
        state, rng = saved[k]
        torch.manual_seed(99)  # the resumed run's global RNG is another: the state decides the order
        resumed = make_loader(case, load_workers)
        if isinstance(resumed.sampler, DistributedSampler):
            resumed.sampler.set_epoch(0)  # the state sets the epoch of the pass it resumes
        resumed._index_sampler.load(state)
        # torch's meaning: a whole pass, while the resumed one yields the rest (a sampler that
        # resumes itself says its own len(), as this one does: the rest)
        assert len(resumed) == (length - k if case == "stateful" and k < length else length)
        rest = [as_list(b) for b in resumed] if k < length else []  # complete: the next pass is next
        assert passed[:k] + rest == passed, f"resumed after {k} of {length}"
        torch.set_rng_state(rng)  # the checkpoint's global RNG, restored by the user
        assert [as_list(b) for b in resumed] == following, f"the pass after resuming at {k}"


@pytest.mark.parametrize("case", ["random", "random-replacement", "weighted-unbatched", "stateful"])
def test_resuming_leaves_the_global_rng_alone(case):
    torch.manual_seed(1)
    saver = make_loader(case, 0)
    it = iter(saver)
    next(it)
    state = saver._resumable.state(1)
    resumed = make_loader(case, 0)._index_sampler  # the ResumableSampler alone: no loader draws
    torch.manual_seed(99)
    before = torch.get_rng_state()
    resumed.load(state)
    drawn = list(resumed)
    assert torch.equal(torch.get_rng_state(), before)
    assert len(drawn) == len(saver) - 1


def test_no_pass_yet_resumes_as_a_fresh_pass():
    torch.manual_seed(3)
    expected = [as_list(b) for b in make_loader("random", 0)]
    state = make_loader("random", 0)._index_sampler.state(0)
    assert state["pass"] is None
    torch.manual_seed(3)
    resumed = make_loader("random", 0)
    resumed._index_sampler.load(state)
    assert [as_list(b) for b in resumed] == expected


def test_a_state_from_another_sampler_is_refused():
    saver = make_loader("random", 0)
    next(iter(saver))
    state = saver._resumable.state(1)
    refused = r"saved from \['BatchSampler', 'RandomSampler'\].*SequentialSampler"
    with pytest.raises(ValueError, match=refused):
        make_loader("sequential", 0)._index_sampler.load(state)
    other = ResumingLoader(Indices(), batch_size=4, shuffle=True)  # 6 batches, not 8
    with pytest.raises(ValueError, match="the saved pass has 8 items, this sampler's has 6"):
        other._index_sampler.load(state)
    with pytest.raises(ValueError, match="state holds 0 generator states, this sampler uses 1"):
        make_loader("random-generator", 0)._index_sampler.load(state)


class Stream(IterableDataset):
    """0, 1, 2, ... up to ``n``, from where ``load_state_dict`` put it."""

    def __init__(self, n: int = 10) -> None:
        self.n, self.next = n, 0

    def __iter__(self) -> Iterator[int]:
        while self.next < self.n:
            self.next += 1
            yield self.next - 1

    def state_dict(self) -> dict[str, int]:
        return {"next": self.next}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next = state["next"]


class PlainStream(IterableDataset):
    def __iter__(self) -> Iterator[int]:
        return iter(range(4))


def test_an_iterable_dataset_resumes_through_its_own_state():
    saver_ds = Stream()
    it = iter(DataLoader(saver_ds, batch_size=3, num_workers=0))
    first = [as_list(next(it)), as_list(next(it))]
    state = json.loads(json.dumps(iterable_state(saver_ds, num_workers=0)))
    resumed_ds = Stream()
    load_iterable_state(resumed_ds, state, num_workers=0)
    rest = [as_list(b) for b in DataLoader(resumed_ds, batch_size=3, num_workers=0)]
    assert first + rest == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


def test_an_iterable_dataset_that_cannot_resume_is_refused():
    with pytest.raises(TypeError, match="PlainStream is an IterableDataset without state_dict"):
        iterable_state(PlainStream(), num_workers=0)
    with pytest.raises(TypeError, match="give it those two methods"):
        load_iterable_state(PlainStream(), {"kind": "iterable", "dataset": {}}, num_workers=0)
    with pytest.raises(ValueError, match="num_workers=2 workers.*resume it with num_workers=0"):
        iterable_state(Stream(), num_workers=2)
