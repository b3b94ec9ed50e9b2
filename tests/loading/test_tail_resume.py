"""Resume through any sampler torch's DataLoader takes, in every tail: a pass saved after some
batches and resumed by new loader and sampler objects yields exactly the rest of it, then what the
uninterrupted run yields next. The tails of their own (``backend="dali"``, ``"nvimgcodec"``, and
``mode="ray"`` in tests/cluster) iterate the loader's resumable index sampler, as torch's iterator
does in the local modes (issue 44, item 1). DALI and nvImageCodec run their CPU operators here."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, Sampler, SequentialSampler

import fastload
from tests.backends.contract import needs_dali, needs_nvimgcodec
from tests.loading.helpers import ID_RECORDS
from tests.loading.test_resume_any_sampler import StatefulSampler


class Interleaved(Sampler[int]):
    """A user's own sampler: blocks of 4 indices in an order drawn from its own generator."""

    def __init__(self, n: int, generator: torch.Generator) -> None:
        self.n, self.generator = n, generator

    def __iter__(self) -> Iterator[int]:
        blocks = torch.randperm((self.n + 3) // 4, generator=self.generator).tolist()
        return (i for b in blocks for i in range(4 * b, min(4 * b + 4, self.n)))

    def __len__(self) -> int:
        return self.n


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# Each case makes its loader's sampling arguments afresh (new sampler and generator objects), as a
# job restarted from a checkpoint does; ``n`` is the dataset's length.
CASES: dict[str, Callable[[int], dict[str, Any]]] = {
    "random": lambda n: {"batch_size": 4, "sampler": RandomSampler(range(n))},  # torch's global RNG
    "random-generator": lambda n: {"batch_size": 4, "sampler": RandomSampler(range(n), generator=seeded(7))},
    "random-drop-last": lambda n: {"batch_size": 5, "drop_last": True,
                                   "sampler": RandomSampler(range(n), generator=seeded(7))},
    "shuffle-generator": lambda n: {"batch_size": 4, "shuffle": True, "generator": seeded(8)},
    "sequential-drop-last": lambda n: {"batch_size": 6, "drop_last": True, "sampler": SequentialSampler(range(n))},
    "batch-sampler": lambda n: {"batch_sampler": BatchSampler(RandomSampler(range(n), generator=seeded(9)), 5,
                                                              drop_last=False)},
    "user-sampler": lambda n: {"batch_size": 4, "sampler": Interleaved(n, seeded(10))},
    "user-stateful": lambda n: {"batch_size": 3, "sampler": StatefulSampler(n)},
}
STOP = 4  # batches delivered before the state is saved (the case: 4 batches of 4, then all 37 again)


def labels(batches: Any) -> list[int]:
    return [y for _, batch_labels in batches for y in batch_labels.tolist()]


def assert_resumes_exactly(make: Callable[[dict[str, Any]], Any], case: str) -> None:
    """``make(sampling arguments)`` → a loader of the tail under test; the record number is each
    sample's label. The uninterrupted run is the threads mode's: the tails' order is its order."""
    torch.manual_seed(1)  # what a sampler without a generator draws from
    reference = fastload.DataLoader(make({}).dataset, mode="threads", **CASES[case](ID_RECORDS))
    first, second = labels(reference), labels(reference)
    torch.manual_seed(1)
    saver = make(CASES[case](ID_RECORDS))
    it = iter(saver)
    head = labels(islice(it, STOP))
    state = json.loads(json.dumps(saver.state_dict()))  # as a checkpoint stores it, beside torch's RNG
    assert state.get("pass", state.get("epoch")) is not None, state  # a pass in progress was saved
    rng = torch.get_rng_state()
    del it
    torch.manual_seed(99)  # the resumed job's own: the state decides the rest of the pass
    resumed = make(CASES[case](ID_RECORDS))
    resumed.load_state_dict(state)
    rest = labels(resumed)
    assert head + rest == first, f"{case}: {len(head)} delivered, then {len(rest)} of {len(first) - len(head)}"
    torch.set_rng_state(rng)  # the checkpoint's RNG, restored by the job
    assert labels(resumed) == second  # and the next pass is the uninterrupted run's next


TAILS = {
    "threads": {"mode": "threads"},
    "dali": {"backend": "dali", "device": "cpu"},
    "nvimgcodec": {"backend": "nvimgcodec", "device": "cpu"},
}


@pytest.mark.parametrize("tail", [pytest.param("threads"), pytest.param("dali", marks=needs_dali),
                                  pytest.param("nvimgcodec", marks=needs_nvimgcodec)])
@pytest.mark.parametrize("case", list(CASES))
def test_a_resume_through_any_sampler_yields_exactly_the_rest(id_packed: Any, tail: str, case: str) -> None:
    dataset = fastload.PackedDataset(id_packed("lmdb"), image_size=16, train=False)
    assert_resumes_exactly(lambda sampling: fastload.DataLoader(dataset, **sampling, **TAILS[tail]), case)
