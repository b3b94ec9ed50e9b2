"""Exact-once sharding across DDP ranks: two spawned ranks in a gloo group, two workers each."""

from __future__ import annotations

import itertools
import json
import multiprocessing
from collections import Counter

import pytest

from .helpers import ID_RECORDS, ddp_rank

WORLD = 2


@pytest.fixture(scope="module")
def delivered(id_packed, tmp_path_factory) -> list[dict]:
    """What each rank delivered, per loader: ``result[rank][case][epoch]`` is a list of batches of ids."""
    base = tmp_path_factory.mktemp("ddp")
    context = multiprocessing.get_context("spawn")
    outs = [base / f"rank{rank}.json" for rank in range(WORLD)]
    ranks = [context.Process(target=ddp_rank, args=(rank, WORLD, str(base / "group"), str(id_packed("lmdb")),
                                                    str(outs[rank])))
             for rank in range(WORLD)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout=240)
    for p in ranks:
        if p.is_alive():
            p.kill()
            p.join()
    results = [json.loads(out.read_text()) if out.exists() else {"error": "no output"} for out in outs]
    for rank, (p, result) in enumerate(zip(ranks, results)):
        assert "error" not in result, f"rank {rank} failed:\n{result['error']}"
        assert p.exitcode == 0, f"rank {rank} exited with {p.exitcode}"
    return results


def flat(batches: list[list[int]]) -> list[int]:
    return list(itertools.chain.from_iterable(batches))


def test_ranks_know_their_place(delivered):
    for rank, result in enumerate(delivered):
        assert result["sampler-drop_last=True"] == [rank, WORLD]


def test_drop_last_each_sample_at_most_once_and_equal_batches(delivered):
    for epoch in range(2):
        per_rank = [result["packed-drop_last=True"][epoch] for result in delivered]
        assert len({len(batches) for batches in per_rank}) == 1  # same number of batches on every rank
        assert all(len(b) == 4 for batches in per_rank for b in batches)
        union = flat(flat(per_rank))
        assert len(union) == len(set(union))  # no record twice across ranks and workers
        # Each rank's share is truncated to 18, then its batches to 4 x 4.
        assert len(union) == WORLD * (ID_RECORDS // WORLD // 4 * 4)
    epochs = [flat(delivered[0]["packed-drop_last=True"][e]) for e in range(2)]
    assert epochs[0] != epochs[1]  # each epoch has its own order


def test_padding_reads_every_sample_at_least_once(delivered):
    for epoch in range(2):
        per_rank = [flat(result["packed-drop_last=False"][epoch]) for result in delivered]
        assert len({len(ids) for ids in per_rank}) == 1 and len(per_rank[0]) == -(-ID_RECORDS // WORLD)
        counts = Counter(flat(per_rank))
        assert set(counts) == set(range(ID_RECORDS))
        assert sum(counts.values()) - ID_RECORDS == WORLD * len(per_rank[0]) - ID_RECORDS  # the padding
        assert max(counts.values()) == 2
    batches = [len(result["packed-drop_last=False"][0]) for result in delivered]
    assert batches[0] == batches[1]


def test_distributed_true_shards_a_plain_dataset(delivered):
    for epoch in range(2):
        per_rank = [flat(result["plain-distributed"][epoch]) for result in delivered]
        assert len(per_rank[0]) == len(per_rank[1]) == 12
        assert set(flat(per_rank)) == set(range(23))


def test_plain_dataset_is_not_sharded_unless_asked(delivered):
    for result in delivered:
        assert flat(result["plain-default"][0]) == list(range(23))
        assert sorted(flat(result["packed-not-distributed"][0])) == list(range(ID_RECORDS))


def test_an_explicit_distributed_sampler_is_not_sharded_twice(delivered):
    per_rank = [flat(result["explicit-sampler"][0]) for result in delivered]
    for ids, result in zip(per_rank, delivered):
        assert ids == result["explicit-sampler-order"]  # exactly the sampler's share, in its order
        assert len(ids) == -(-ID_RECORDS // WORLD)
    assert set(flat(per_rank)) == set(range(ID_RECORDS))
