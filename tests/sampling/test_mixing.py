"""Mixing several datasets into an epoch: the pure functions' invariants (fastload.sampling.mixing)."""

from __future__ import annotations

import numpy as np
import pytest

from fastload.sampling.epoch_sampler import EpochSampler, SampleKey
from fastload.sampling.mixing import MixPlan, mixed_order, source_counts, source_draws
from fastload.sampling.order import rank_share

# (size, count): below, at, and above the size; dividing it and not
SHAPES = [(10, 3), (10, 5), (10, 7), (10, 10), (10, 15), (10, 23), (7, 4), (1, 3), (12, 0)]


def test_counts_equal_the_weights_when_they_divide():
    assert source_counts([50, 80], weights=[0.7, 0.3], epoch_length=100) == [70, 30]
    assert source_counts([50, 80], weights=[3, 1]) == [98, 32]  # epoch: every record, 130
    assert source_counts([10, 20, 30], weights=[1, 1, 2], epoch_length=40) == [10, 10, 20]


@pytest.mark.parametrize("weights", [[1, 1, 1], [0.7, 0.2, 0.1], [5, 3, 0.5], [1e-3, 1, 0]])
@pytest.mark.parametrize("length", [1, 7, 100, 1001])
def test_counts_within_one_of_the_weights_otherwise(weights, length):
    counts = source_counts([5, 5, 5], weights=weights, epoch_length=length)
    exact = [length * w / sum(weights) for w in weights]
    assert sum(counts) == length
    assert all(abs(c - e) < 1 for c, e in zip(counts, exact)), (counts, exact)


def test_the_other_ways_of_sizing_shares():
    assert source_counts([10, 20]) == [10, 20]  # every record once
    assert source_counts([10, 20], samples_per_epoch=[3, 40]) == [3, 40]
    assert source_counts([10, 20], repeat=[2, 0.25]) == [20, 5]


@pytest.mark.parametrize("bad, match", [
    ({"weights": [1, 1], "repeat": [1, 1]}, "weights and repeat"),
    ({"weights": [1]}, "1 values for 2 sources"),
    ({"weights": [0, 0]}, "at least one must be > 0"),
    ({"weights": [1, -1]}, r"weights\[1\]=-1"),
    ({"samples_per_epoch": [1, 2.5]}, r"samples_per_epoch\[1\]"),
    ({"repeat": [1, 1], "epoch_length": 5}, "epoch_length"),
    ({"weights": [1, 1], "epoch_length": 0}, "epoch_length makes an epoch of 0 draws"),
    ({"samples_per_epoch": [0, 0]}, "samples_per_epoch makes an epoch of 0 draws"),
    ({"weights": [1, 1], "epoch_length": 10**13}, r"epoch_length makes an epoch of 10000000000000 draws, over the 2147483648"),
    ({"repeat": [10**12, 1]}, r"repeat makes an epoch of 10000000000020 draws"),
])
def test_bad_shares_are_refused_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        source_counts([10, 20], **bad)


def test_an_empty_source_with_a_share_is_refused():
    with pytest.raises(ValueError, match="source 1 has no records"):
        source_counts([10, 0], weights=[1, 1])


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("size, count", SHAPES)
def test_a_source_repeats_nothing_in_an_epoch_until_its_share_exceeds_its_size(size, count, shuffle):
    for epoch in range(15):
        records, _ = source_draws(size, count, seed=4, source=1, epoch=epoch, shuffle=shuffle)
        assert len(records) == count
        drawn = np.bincount(records, minlength=size)
        if count <= size:
            assert drawn.max(initial=0) <= 1
        else:  # every record count // size or count // size + 1 times
            assert drawn.min() == count // size and drawn.max() <= count // size + 1


@pytest.mark.parametrize("size, count", SHAPES)
def test_across_epochs_every_record_once_before_any_again(size, count):
    stream, passes = zip(*(source_draws(size, count, seed=9, source=0, epoch=e, shuffle=True)
                           for e in range(15)))
    stream, passes = np.concatenate(stream), np.concatenate(passes)
    for p in range(len(stream) // size):  # each whole pass of the stream holds every record once
        assert sorted(stream[p * size:(p + 1) * size]) == list(range(size))
        assert set(passes[p * size:(p + 1) * size]) == {p}


def test_a_source_draws_each_record_with_a_new_pass_each_time():
    stream, passes = zip(*(source_draws(4, 10, seed=0, source=0, epoch=e, shuffle=True) for e in range(3)))
    pairs = list(zip(np.concatenate(passes).tolist(), np.concatenate(stream).tolist()))
    assert len(pairs) == len(set(pairs))  # (pass, record) names a draw: augmentations never repeat


def test_same_inputs_same_order_and_epochs_differ():
    sizes, counts = [30, 8, 50], [20, 12, 9]
    first = mixed_order(sizes, counts, seed=5, epoch=3, shuffle=True)
    again = mixed_order(sizes, counts, seed=5, epoch=3, shuffle=True)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    other = mixed_order(sizes, counts, seed=5, epoch=4, shuffle=True)[0]
    reseeded = mixed_order(sizes, counts, seed=6, epoch=3, shuffle=True)[0]
    assert not np.array_equal(first[0], other) and not np.array_equal(first[0], reseeded)


def test_an_epoch_holds_each_source_its_count():
    sizes, counts = [30, 8, 50], [20, 12, 9]
    offsets = np.cumsum([0, *sizes])
    for shuffle in (True, False):
        indices, _ = mixed_order(sizes, counts, seed=1, epoch=2, shuffle=shuffle)
        assert len(indices) == sum(counts)
        assert np.histogram(indices, bins=offsets)[0].tolist() == counts


def test_unshuffled_mix_is_spread_evenly():
    indices, _ = mixed_order([100, 100], [50, 25], seed=0, epoch=0, shuffle=False)
    from_second = np.flatnonzero(indices >= 100)
    assert np.diff(from_second).max() <= 3  # one of the second source every 3 draws
    assert indices[indices < 100].tolist() == list(range(50))  # in stream order


def test_a_plan_gives_any_epoch_as_a_fresh_one_does():
    plan = MixPlan([13, 40], [17, 22])
    for epoch in (4, 5, 2, 9, 0):  # forwards, back, and a jump: the streams rewind when they must
        mine = plan.order(11, epoch, True)
        fresh = mixed_order([13, 40], [17, 22], seed=11, epoch=epoch, shuffle=True)
        assert all(np.array_equal(a, b) for a, b in zip(mine, fresh))


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_ranks_shares_are_disjoint_and_cover_the_epoch(world_size, drop_last):
    plan = MixPlan([30, 8], [20, 13])  # 33 draws: no rank count above 1 divides it
    order = plan.order(2, 1, True)[0]
    samplers = [EpochSampler(33, shuffle=True, seed=2, rank=r, world_size=world_size,
                             drop_last=drop_last, mix=plan) for r in range(world_size)]
    for sampler in samplers:
        sampler.set_epoch(1)
    positions = [rank_share(33, seed=0, epoch=0, shuffle=False, rank=r, world_size=world_size,
                            drop_last=drop_last) for r in range(world_size)]
    shares = [list(s) for s in samplers]
    assert len({len(s) for s in shares}) == 1 and len(shares[0]) == len(samplers[0])
    assert [s for s in shares] == [order[p].tolist() for p in positions]
    taken = np.concatenate(positions)
    if drop_last:
        assert len(set(taken.tolist())) == len(taken) == 33 // world_size * world_size
    else:
        assert set(taken.tolist()) == set(range(33))


def test_keyed_samples_carry_their_pass():
    plan = MixPlan([3, 5], [7, 2])
    sampler = EpochSampler(9, shuffle=True, seed=0, keyed=True, mix=plan)
    keys = list(sampler)
    indices, passes = plan.order(0, 0, True)
    assert keys == [SampleKey(i, p, 0) for i, p in zip(indices.tolist(), passes.tolist())]
    assert len(set(keys)) == len(keys)  # a record drawn twice this epoch, with another crop


def test_a_sampler_refuses_a_mix_of_another_length():
    with pytest.raises(ValueError, match="the mix draws 9"):
        EpochSampler(10, shuffle=True, mix=MixPlan([3, 5], [7, 2]))
