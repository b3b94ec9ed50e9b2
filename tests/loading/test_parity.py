"""Drop-in parity: with explicit torch arguments and a plain Dataset, fastload.DataLoader yields what
torch.utils.data.DataLoader yields (same batches, same order, same errors), built side by side."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler
from torch.utils.data import DataLoader as TorchLoader

import fastload

from .helpers import (
    ID_RECORDS, EveryThird, Failing, Numbers, RandomNumbers, Slow, Stream, UnevenBatches, WorkerTagged, epoch,
    pairs_collate, tag_worker,
)

N = 23


def seeded(seed: int = 7) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# Each case builds its keyword arguments afresh: the two loaders must not share a generator.
CASES: dict[str, Callable[[], dict[str, Any]]] = {
    "sequential": lambda: {"batch_size": 4},
    "shuffle-generator": lambda: {"batch_size": 4, "shuffle": True, "generator": seeded()},
    "shuffle-drop-last": lambda: {"batch_size": 5, "shuffle": True, "drop_last": True, "generator": seeded(3)},
    "drop-last": lambda: {"batch_size": 5, "drop_last": True},
    "shuffle-global-seed": lambda: {"batch_size": 3, "shuffle": True},
    "collate-fn": lambda: {"batch_size": 4, "shuffle": True, "generator": seeded(),
                           "collate_fn": pairs_collate},
    "sampler": lambda: {"batch_size": 4, "sampler": EveryThird(N)},
    "batch-sampler": lambda: {"batch_sampler": UnevenBatches(N)},
    "no-batching": lambda: {"batch_size": None, "shuffle": True, "generator": seeded(11)},
    "shuffle-false": lambda: {"batch_size": 6, "shuffle": False, "drop_last": False},
}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_same_batches_as_torch(case, num_workers):
    ds = Numbers(N)
    torch.manual_seed(1234)  # the cases without a generator draw from the global RNG
    expected = epoch(TorchLoader(ds, num_workers=num_workers, **CASES[case]()))
    torch.manual_seed(1234)
    got = epoch(fastload.DataLoader(ds, num_workers=num_workers, **CASES[case]()))
    assert got == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_random_draws_in_samples_match_torch(num_workers):
    """Workers are seeded from the loader's generator as torch seeds them; in the main process the
    samples draw from the global RNG, which the loader must not consume differently."""
    ds = RandomNumbers(N)
    kwargs = {"batch_size": 4, "shuffle": True, "num_workers": num_workers}
    torch.manual_seed(99)
    expected = epoch(TorchLoader(ds, generator=seeded(5), **kwargs))
    torch.manual_seed(99)
    got = epoch(fastload.DataLoader(ds, generator=seeded(5), **kwargs))
    assert got == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_worker_init_fn_and_get_worker_info(num_workers):
    ds = WorkerTagged(N)
    kwargs = {"batch_size": 3, "num_workers": num_workers, "worker_init_fn": tag_worker}
    expected = epoch(TorchLoader(ds, **kwargs))
    got = epoch(fastload.DataLoader(ds, **kwargs))
    assert got == expected
    if num_workers:  # the worker ids and init tags really came from two workers
        assert {tuple(b[3][2]) for b in got} == {(100 + 20,) * 3, (101 + 20,) * 3, (121,) * 2}


def test_persistent_workers_keep_order_across_epochs():
    ds = RandomNumbers(N)
    kwargs = {"batch_size": 4, "shuffle": True, "num_workers": 2, "persistent_workers": True}
    theirs = TorchLoader(ds, generator=seeded(2), **kwargs)
    ours = fastload.DataLoader(ds, generator=seeded(2), **kwargs)
    for _ in range(3):
        assert epoch(ours) == epoch(theirs)
    # The same worker processes served every epoch.
    assert ours._iterator is not None and len(ours._iterator._workers) == 2


@pytest.mark.parametrize("num_workers", [0, 2])
def test_in_order_false_delivers_the_same_batches(num_workers):
    ds = Numbers(N)
    kwargs = {"batch_size": 4, "shuffle": True, "num_workers": num_workers, "in_order": False}
    expected = epoch(TorchLoader(ds, generator=seeded(), **kwargs))
    got = epoch(fastload.DataLoader(ds, generator=seeded(), **kwargs))
    # Out of order, workers may hand batches back in any order: compare the batches as a set.
    assert sorted(map(repr, got)) == sorted(map(repr, expected))
    if num_workers == 0:
        assert got == expected


def test_prefetch_factor_and_pin_memory_given():
    ds = Numbers(N)
    kwargs = {"batch_size": 4, "num_workers": 2, "prefetch_factor": 4, "pin_memory": False}
    loader = fastload.DataLoader(ds, **kwargs)
    assert (loader.prefetch_factor, loader.pin_memory) == (4, False)
    assert epoch(loader) == epoch(TorchLoader(ds, **kwargs))


def test_spawn_context():
    ds = WorkerTagged(N)
    kwargs = {"batch_size": 4, "shuffle": True, "num_workers": 2, "multiprocessing_context": "spawn",
              "worker_init_fn": tag_worker}
    expected = epoch(TorchLoader(ds, generator=seeded(), **kwargs))
    got = epoch(fastload.DataLoader(ds, generator=seeded(), **kwargs))
    assert got == expected
    assert {worker for b in got for worker in b[2][2]} == {0, 1}  # both spawned workers delivered


def _raised(loader: Any) -> BaseException:
    """The exception an epoch of ``loader`` raises, with its workers already shut down."""
    it = iter(loader)
    try:
        for _ in it:
            pass
    except Exception as exc:
        # Drop the traceback: its frames hold the iterator, which would then shut its workers down
        # only in a later gc pass, after torch's 5 s join timeout per worker.
        error = exc.with_traceback(None)
    else:
        pytest.fail(f"{type(loader).__module__}.DataLoader raised nothing")
    del it
    return error


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataset_error_is_raised_as_torch_raises_it(num_workers):
    ds = Failing(N, bad=9)
    expected = _raised(TorchLoader(ds, batch_size=4, num_workers=num_workers))
    got = _raised(fastload.DataLoader(ds, batch_size=4, num_workers=num_workers))
    assert type(got) is type(expected) is KeyError
    assert str(got) == str(expected)
    assert "sample 9 is broken" in str(got)


def test_timeout_on_a_slow_worker_raises_as_torch():
    ds = Slow(4, delay=1.5)
    expected = _raised(TorchLoader(ds, batch_size=1, num_workers=1, timeout=0.3))
    got = _raised(fastload.DataLoader(ds, batch_size=1, num_workers=1, timeout=0.3))
    assert type(got) is type(expected) is RuntimeError
    assert str(got) == str(expected)
    assert "timed out" in str(got)


@pytest.mark.parametrize("kwargs", [
    {"batch_size": 4}, {"batch_size": 4, "drop_last": True}, {"batch_size": 1}, {"batch_size": None},
    {"batch_sampler": UnevenBatches(N)}, {"sampler": EveryThird(N), "batch_size": 5},
    {"batch_size": 5, "shuffle": True, "drop_last": True, "num_workers": 2},
], ids=repr)
def test_len_is_torch_len(kwargs):
    ds = Numbers(N)
    assert len(fastload.DataLoader(ds, **kwargs)) == len(TorchLoader(ds, **kwargs))


def test_len_of_an_iterable_dataset_raises_as_torch():
    with pytest.raises(TypeError) as theirs:
        len(TorchLoader(Stream(), batch_size=2))
    with pytest.raises(TypeError) as ours:
        len(fastload.DataLoader(Stream(), batch_size=2))
    assert str(ours.value) == str(theirs.value)
    assert epoch(fastload.DataLoader(Stream(), batch_size=3)) == epoch(TorchLoader(Stream(), batch_size=3))


@pytest.mark.parametrize("kwargs, message", [
    ({"sampler": EveryThird(N), "shuffle": True}, "mutually exclusive"),
    ({"batch_sampler": UnevenBatches(N), "batch_size": 4}, "mutually exclusive"),
    ({"num_workers": -1}, "num_workers"),
    ({"num_workers": 0, "prefetch_factor": 2}, "prefetch_factor"),
    ({"num_workers": 0, "persistent_workers": True}, "persistent_workers"),
], ids=repr)
def test_invalid_arguments_are_refused_like_torch(kwargs, message):
    with pytest.raises(ValueError) as theirs:
        TorchLoader(Numbers(N), **kwargs)
    with pytest.raises(ValueError) as ours:
        fastload.DataLoader(Numbers(N), **kwargs)
    assert message in str(theirs.value) and message in str(ours.value)


@pytest.mark.parametrize("shape", ["batch sampler over a sampler", "shuffle and a sampler",
                                   "a sampler beside a batch_sampler"])
def test_a_users_own_samplers_in_a_rebuilt_loaders_shapes_are_refused_like_torch(shape):
    """A loader rebuilt from its attributes (test_rebuild.py) passes back what torch made in
    shapes torch refuses, and fastload maps those back; the same shapes made of a user's own
    objects are the user's, and torch's refusal stands."""
    ds = Numbers(N)
    kwargs = {"batch sampler over a sampler": {"batch_size": 3, "batch_sampler": BatchSampler(SequentialSampler(ds), 3, False)},
              "shuffle and a sampler": {"shuffle": True, "sampler": RandomSampler(ds)},
              "a sampler beside a batch_sampler": {"batch_size": None, "sampler": SequentialSampler(ds),
                                                   "batch_sampler": [[0, 1], [2]]}}[shape]
    with pytest.raises(ValueError) as theirs:
        TorchLoader(ds, **kwargs)
    with pytest.raises(ValueError) as ours:
        fastload.DataLoader(ds, **kwargs)
    assert str(ours.value) == str(theirs.value)


def test_a_users_batch_sampler_is_kept_as_torch_keeps_it():
    batches = BatchSampler(SequentialSampler(range(N)), 1, False)
    ours, theirs = fastload.DataLoader(Numbers(N), batch_sampler=batches), TorchLoader(Numbers(N), batch_sampler=batches)
    assert (ours.batch_size, ours.batch_sampler) == (theirs.batch_size, theirs.batch_sampler) == (None, batches)
    assert epoch(ours) == epoch(theirs)


# --- a PackedDataset with explicit torch arguments -------------------------------------------------


def _pixels_equal(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x[0], y[0]) and torch.equal(torch.as_tensor(x[1]), torch.as_tensor(y[1]))
        for x, y in zip(a, b))


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kwargs", [
    {"batch_size": 4}, {"batch_size": 5, "drop_last": True}, {"batch_size": None},
    {"batch_size": 3, "sampler": EveryThird(ID_RECORDS)}, {"batch_sampler": UnevenBatches(ID_RECORDS)},
], ids=repr)
def test_packed_dataset_in_eval_mode_yields_torchs_batches(id_packed, kwargs, num_workers):
    """Unshuffled eval samples are the same whoever orders them: the loaders must agree exactly,
    including when no batching makes each sample go through collate on its own."""
    ds = fastload.PackedDataset(id_packed("lmdb"), image_size=24, train=False)
    expected = list(TorchLoader(ds, num_workers=num_workers, **kwargs))
    got = list(fastload.DataLoader(ds, num_workers=num_workers, **kwargs))
    assert _pixels_equal(got, expected)


def test_packed_dataset_with_a_custom_collate_fn_gets_the_samples(id_packed):
    ds = fastload.PackedDataset(id_packed("lmdb"), image_size=24, train=False)
    kwargs = {"batch_size": 4, "collate_fn": lambda samples: [(tuple(x.shape), y) for x, y in samples]}
    got = list(fastload.DataLoader(ds, num_workers=0, **kwargs))
    assert got == list(TorchLoader(ds, **kwargs))
    assert got[0] == [((3, 24, 24), 0), ((3, 24, 24), 1), ((3, 24, 24), 2), ((3, 24, 24), 3)]
