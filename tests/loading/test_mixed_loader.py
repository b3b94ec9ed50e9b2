"""A real DataLoader over a MixedDataset of two small packed datasets: shares, resume, two ranks."""

from __future__ import annotations

import json
import multiprocessing
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload.sampling.mixing import mixed_order

from .helpers import write_id_list

SIZES = (20, 7)  # source b's labels are 1000 + its record number: a batch says where each sample came from


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> tuple[str, str]:
    base = tmp_path_factory.mktemp("mixed")
    outs = []
    for name, size, first in (("a", SIZES[0], 0), ("b", SIZES[1], 1000)):
        listing = write_id_list(base / name, size)
        head, *rows = listing.read_text().splitlines()
        listing.write_text("\n".join([head, *(f"{r.split(',')[0]},{first + k}" for k, r in enumerate(rows))]) + "\n")
        fastload.pack(listing, base / f"{name}.fl", format="lmdb", progress=False)
        outs.append(str(base / f"{name}.fl"))
    return outs[0], outs[1]


def mixed(packed, **shares) -> fastload.MixedDataset:
    return fastload.MixedDataset([fastload.PackedDataset(p, image_size=16, train=True) for p in packed], **shares)


def labels(batches) -> list[int]:
    return [y for _, labels_ in batches for y in labels_.tolist()]


def test_an_epoch_holds_each_source_its_share(packed):
    loader = fastload.DataLoader(mixed(packed, weights=[0.7, 0.3], epoch_length=20), batch_size=4,
                                 shuffle=True, seed=1, num_workers=2)
    assert len(loader) == 5
    epochs = [labels(loader) for _ in range(2)]
    for ys in epochs:
        a, b = [y for y in ys if y < 1000], [y for y in ys if y >= 1000]
        assert (len(a), len(b)) == (14, 6)
        assert len(set(a)) == 14 and len(set(b)) == 6  # no record twice within its share
    # every record once before any again: two epochs of shares cover both sources
    assert set(epochs[0] + epochs[1]) == set(range(20)) | set(range(1000, 1007))
    assert epochs[0] != epochs[1]


def test_resume_mid_epoch_gives_the_rest_of_it(packed):
    def loader():
        return fastload.DataLoader(mixed(packed, repeat=[0.5, 2]), batch_size=3, shuffle=True, seed=7,
                                   num_workers=2)

    whole = list(loader())  # 10 + 14 draws; source b's records twice each, with two crops
    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = first.state_dict()
    del it
    again = loader()
    again.load_state_dict(state)
    rest = list(again)
    assert labels(head + rest) == labels(whole)
    for (x, _), (y, _) in zip(head + rest, whole):
        assert torch.equal(x, y)  # the same crops after the resume
    assert Counter(labels(whole))[1003] == 2


def test_a_resume_from_another_mix_is_refused(packed):
    saved = fastload.DataLoader(mixed(packed, samples_per_epoch=[4, 5]), batch_size=3, shuffle=True, seed=0)
    other = fastload.DataLoader(mixed(packed, samples_per_epoch=[5, 4]), batch_size=3, shuffle=True, seed=0)
    with pytest.raises(ValueError, match="the same sources and shares"):
        other.load_state_dict(saved.state_dict())


def test_sources_that_would_not_collate_are_refused_by_name(packed):
    a = fastload.PackedDataset(packed[0], image_size=16, train=True)
    b = fastload.PackedDataset(packed[1], image_size=24, train=True)
    with pytest.raises(ValueError, match=r"source 0 \(.*a\.fl\) has image_size=\(16, 16\) but source 1 \(.*b\.fl\)"):
        fastload.MixedDataset([a, b])
    with pytest.raises(TypeError, match="source 1 is a list"):
        fastload.MixedDataset([a, [1, 2]])  # type: ignore[list-item]


def test_dict_samples_and_single_reads(packed):
    sources = [fastload.PackedDataset(p, image_size=16, train=True, fields=("image", "label")) for p in packed]
    ds = fastload.MixedDataset(sources, samples_per_epoch=[5, 5])
    assert len(ds) == 27 and ds.epoch_length == 10 and ds.locate(21) == (1, 1)
    assert ds[21]["label"] == 1001
    batches = list(fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=0, num_workers=0))
    assert [tuple(b["image"].shape) for b in batches] == [(4, 3, 16, 16), (4, 3, 16, 16), (2, 3, 16, 16)]
    assert sorted(y >= 1000 for b in batches for y in b["label"].tolist()) == [False] * 5 + [True] * 5


def mixed_rank(rank: int, world_size: int, init_file: str, packed: list[str], out: str) -> None:
    """One DDP rank (a spawned process): a mixed loader with two workers, one epoch's labels to ``out``."""
    import traceback

    import torch.distributed as dist

    multiprocessing.set_start_method("fork", force=True)
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
        loader = fastload.DataLoader(mixed(packed, samples_per_epoch=[13, 7]), batch_size=3, shuffle=True,
                                     seed=5, num_workers=2)
        result = {"labels": labels(loader), "batches": len(loader), "rank": loader.epoch_sampler.rank}
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - carried to the test, which shows it
        result = {"error": traceback.format_exc()}
    Path(out).write_text(json.dumps(result))


def test_two_ranks_cover_the_epoch_disjointly(packed, tmp_path):
    context = multiprocessing.get_context("spawn")
    outs = [tmp_path / f"rank{r}.json" for r in range(2)]
    ranks = [context.Process(target=mixed_rank, args=(r, 2, str(tmp_path / "group"), list(packed), str(outs[r])))
             for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout=120)
        if p.is_alive():
            p.kill()
    results = [json.loads(out.read_text()) for out in outs]
    for result in results:
        assert "error" not in result, result["error"]
    assert [r["rank"] for r in results] == [0, 1] and results[0]["batches"] == results[1]["batches"] == 4
    indices, _ = mixed_order(SIZES, [13, 7], seed=5, epoch=0, shuffle=True)
    expected = np.where(indices < 20, indices, indices - 20 + 1000).tolist()
    per_rank = [r["labels"] for r in results]
    assert len(per_rank[0]) == len(per_rank[1]) == 10
    assert not set(per_rank[0]) & set(per_rank[1])  # counts ≤ sizes: every label in the epoch is one draw
    assert sorted(per_rank[0] + per_rank[1]) == sorted(expected)
