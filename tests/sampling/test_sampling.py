"""Sampling: each sample once per epoch across ranks and workers; same inputs, same order."""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.sampling.order import epoch_order, rank_share, resume_order, rewound_rng, sample_rng, take_part

sizes = st.integers(min_value=0, max_value=300)
world_sizes = st.integers(min_value=1, max_value=9)
worker_counts = st.integers(min_value=1, max_value=5)
seeds = st.integers(min_value=0, max_value=2**63)
epochs = st.integers(min_value=0, max_value=1000)


def all_shares(n, seed, epoch, world_size, num_workers, drop_last, shuffle=True):
    """Per rank, the list of per-worker index arrays."""
    return [
        [
            take_part(
                rank_share(n, seed=seed, epoch=epoch, shuffle=shuffle, rank=rank,
                           world_size=world_size, drop_last=drop_last),
                worker, num_workers,
            )
            for worker in range(num_workers)
        ]
        for rank in range(world_size)
    ]


def test_epoch_order_is_a_seeded_permutation():
    order = epoch_order(1000, seed=7, epoch=3, shuffle=True)
    assert order.dtype == np.int64
    assert sorted(order.tolist()) == list(range(1000))
    assert np.array_equal(order, epoch_order(1000, seed=7, epoch=3, shuffle=True))
    assert not np.array_equal(order, epoch_order(1000, seed=7, epoch=4, shuffle=True))
    assert not np.array_equal(order, epoch_order(1000, seed=8, epoch=3, shuffle=True))
    assert np.array_equal(epoch_order(5, seed=7, epoch=3, shuffle=False), np.arange(5))


@settings(max_examples=150, deadline=None)
@given(n=sizes, seed=seeds, epoch=epochs, world_size=world_sizes, num_workers=worker_counts)
def test_drop_last_reads_each_kept_sample_exactly_once(n, seed, epoch, world_size, num_workers):
    shares = all_shares(n, seed, epoch, world_size, num_workers, drop_last=True)
    flat = np.concatenate([part for rank in shares for part in rank])
    assert len(flat) == n // world_size * world_size
    assert len(np.unique(flat)) == len(flat)
    assert flat.min(initial=0) >= 0 and flat.max(initial=0) < max(n, 1)
    assert {sum(len(p) for p in rank) for rank in shares} <= {n // world_size}


@settings(max_examples=150, deadline=None)
@given(n=sizes, seed=seeds, epoch=epochs, world_size=world_sizes, num_workers=worker_counts)
def test_padding_reads_every_sample_at_least_once(n, seed, epoch, world_size, num_workers):
    shares = all_shares(n, seed, epoch, world_size, num_workers, drop_last=False)
    counts = Counter(np.concatenate([p for rank in shares for p in rank]).tolist())
    assert set(counts) == set(range(n))
    per_rank = -(-n // world_size)
    assert [sum(len(p) for p in rank) for rank in shares] == [per_rank] * world_size
    assert sum(counts.values()) - n < world_size


@settings(max_examples=100, deadline=None)
@given(n=sizes, seed=seeds, epoch=epochs, world_size=world_sizes, drop_last=st.booleans(),
       num_workers=worker_counts)
def test_worker_split_does_not_change_what_a_rank_reads(n, seed, epoch, world_size, drop_last,
                                                        num_workers):
    for rank in range(world_size):
        share = rank_share(n, seed=seed, epoch=epoch, shuffle=True, rank=rank,
                           world_size=world_size, drop_last=drop_last)
        parts = [take_part(share, w, num_workers) for w in range(num_workers)]
        # Dealing round-robin and collecting round-robin restores the rank's order.
        rebuilt = np.empty_like(share)
        for w, part in enumerate(parts):
            rebuilt[w::num_workers] = part
        assert np.array_equal(rebuilt, share)


@settings(max_examples=50, deadline=None)
@given(n=sizes, seed=seeds, epoch=epochs, world_size=world_sizes, drop_last=st.booleans())
def test_same_inputs_same_order(n, seed, epoch, world_size, drop_last):
    kwargs = dict(seed=seed, epoch=epoch, shuffle=True, rank=world_size - 1,
                  world_size=world_size, drop_last=drop_last)
    assert np.array_equal(rank_share(n, **kwargs), rank_share(n, **kwargs))


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("n,world_size", [(10, 3), (2, 5), (12, 4), (1, 3), (0, 2), (7, 1)])
def test_unshuffled_shares_match_torch_distributed_sampler(n, world_size, drop_last):
    for rank in range(world_size):
        torch_sampler = torch.utils.data.DistributedSampler(
            range(n), num_replicas=world_size, rank=rank, shuffle=False, drop_last=drop_last
        )
        ours = rank_share(n, seed=0, epoch=0, shuffle=False, rank=rank,
                          world_size=world_size, drop_last=drop_last)
        assert ours.tolist() == list(torch_sampler)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(rank=0, world_size=0), "world_size"),
        (dict(rank=2, world_size=2), "rank"),
        (dict(rank=-1, world_size=2), "rank"),
    ],
)
def test_rank_share_names_the_bad_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        rank_share(10, seed=0, epoch=0, shuffle=True, drop_last=True, **kwargs)


def test_negative_num_samples_is_refused():
    with pytest.raises(ValueError, match="num_samples"):
        rank_share(-1, seed=0, epoch=0, shuffle=True, rank=0, world_size=1, drop_last=True)


def test_take_part_refuses_a_part_out_of_range():
    with pytest.raises(ValueError, match="part=3"):
        take_part(np.arange(10), 3, 3)
    with pytest.raises(ValueError, match="num_parts"):
        take_part(np.arange(10), 0, 0)


@settings(max_examples=50, deadline=None)
@given(n=sizes, data=st.data())
def test_resume_order_continues_where_delivery_stopped(n, data):
    order = epoch_order(n, seed=1, epoch=2, shuffle=True)
    position = data.draw(st.integers(min_value=0, max_value=n))
    assert np.array_equal(np.concatenate([order[:position], resume_order(order, position)]), order)


def test_resume_order_refuses_a_position_past_the_end():
    with pytest.raises(ValueError, match="position=11"):
        resume_order(np.arange(10), 11)
    with pytest.raises(ValueError, match="position=-1"):
        resume_order(np.arange(10), -1)


def test_sample_rng_depends_only_on_seed_epoch_index():
    def draws(seed, epoch, index):
        return sample_rng(seed, epoch, index).random(4).tolist()

    assert draws(3, 1, 42) == draws(3, 1, np.int64(42))
    others = [draws(4, 1, 42), draws(3, 2, 42), draws(3, 1, 43), draws(3, 42, 1)]
    assert all(other != draws(3, 1, 42) for other in others)
    # Neighbouring streams are not shifted copies of each other.
    assert not set(draws(3, 1, 42)) & set(sample_rng(3, 1, 43).random(1000).tolist())


def test_sample_rng_is_the_same_whichever_worker_reads_the_record():
    share = rank_share(50, seed=5, epoch=1, shuffle=True, rank=0, world_size=1, drop_last=True)
    one_worker = {int(i): sample_rng(5, 1, int(i)).random() for i in share}
    for num_workers in (2, 3):
        for w in range(num_workers):
            for i in take_part(share, w, num_workers):
                assert sample_rng(5, 1, int(i)).random() == one_worker[int(i)]


def test_rewound_rng_draws_what_sample_rng_draws_in_any_thread():
    rng = np.random.default_rng(0)
    triples = [(int(rng.integers(2**63)) * (2**65 if k % 3 == 0 else 1), int(rng.integers(9)),
                int(rng.integers(2**63))) for k in range(60)]
    triples += [(0, 0, 0), (2**128 - 1, 2**64 - 1, 2**64 - 1), (5, 1, np.int64(7))]
    expected = [sample_rng(*t).random(6).tolist() for t in triples]

    def draw_all(out: list) -> None:
        for t in triples:
            generator = rewound_rng(*t)
            out.append(generator.random(3).tolist() + generator.random(3).tolist())

    outs: list[list] = [[] for _ in range(4)]
    threads = [threading.Thread(target=draw_all, args=(out,)) for out in outs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outs == [expected] * 4
    # A half-used draw (an odd number of 32-bit words) does not leak into the next stream.
    rewound_rng(1, 2, 3).integers(0, 7, dtype=np.uint32)
    assert rewound_rng(*triples[1]).random(6).tolist() == expected[1]


@pytest.mark.parametrize("make", [sample_rng, rewound_rng])
@pytest.mark.parametrize("args,name", [((-1, 0, 0), "seed"), ((0, -1, 0), "epoch"),
                                       ((0, 0, -1), "index"), ((0, 0, 2**64), "index"),
                                       ((2**128, 0, 0), "seed")])
def test_sample_rng_names_the_bad_argument(make, args, name):
    with pytest.raises(ValueError, match=name):
        make(*args)
