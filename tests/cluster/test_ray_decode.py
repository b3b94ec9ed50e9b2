"""DataLoader(mode="ray") on the package's real Ray cluster (two nodes of one CPU each): the
batches of mode="threads", pixels and labels, epoch after epoch; a resume mid-epoch with a new
loader delivers exactly the rest; two ranks' shares are the threads mode's, disjoint and complete;
a damaged record raises in its batch's place (the next batch follows) or is skipped and counted;
elastic actors are added while the loop waits and idle ones retired, losing and moving no batch.
Joining a cluster (or not) is tests/cluster/test_ray_connect.py's; a node lost under a pass and
Ray shut down mid-pass, test_ray_faults.py's; several loaders in one process, test_ray_loaders.py's."""

from __future__ import annotations

import gc
import itertools
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import flip_payload_byte
from tests.loading.helpers import write_id_list

ray = pytest.importorskip("ray", reason="the Ray tests need ray[data]: pip install -e '.[ray]'")

from fastload.converters import pack

import fastload
from fastload.errors import CorruptRecordError
from fastload.loading.ray_scaling import WINDOW, Seen, target
from fastload.sampling.epoch_sampler import EpochSampler

RECORDS = 37  # prime: no batch size or rank count divides it
BAD = 11  # the record the damaged copy breaks (a JPEG)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("ray-decode")
    listing = write_id_list(base / "pictures", RECORDS)
    pack(listing, base / "ids.fl", shard_size="64KB", workers=1, progress=False)
    return base / "ids.fl"


@pytest.fixture(autouse=True)
def no_actor_left() -> Iterator[None]:
    """Each test's loaders (and their actors) go with it: the next test needs the cluster's CPUs."""
    yield
    gc.collect()


def batches(loader: Any, limit: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(images.clone(), labels.clone()) for images, labels in itertools.islice(loader, limit)]


def assert_same(got: list[tuple[torch.Tensor, torch.Tensor]], want: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    assert [y.tolist() for _, y in got] == [y.tolist() for _, y in want]
    assert all(x.dtype == torch.uint8 and y.dtype == torch.int64 for x, y in got)
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got, want))


def test_batches_are_the_threads_modes(cluster: Any, packed: Path) -> None:
    ds = fastload.PackedDataset(packed, image_size=32, train=True)
    threads = fastload.DataLoader(ds, batch_size=5, shuffle=True, seed=3, mode="threads")
    remote = fastload.DataLoader(ds, batch_size=5, shuffle=True, seed=3, mode="ray", num_workers=2)
    assert (remote.settings.mode, remote.num_workers, remote.settings.prefetch_factor) == ("ray", 2, 2)
    assert_same(batches(remote), batches(threads))  # the first batches go to the first actor up
    remote._tail.start(wait=True)
    assert len(remote._tail.actors) == 2 and len(set(remote._tail.pool.nodes.values())) == 2  # one a node
    assert_same(batches(remote), batches(threads))  # the second epoch: another order, both actors
    assert remote._tail.pool.replaced == 0


def test_in_order_false_delivers_every_batch_once(cluster: Any, packed: Path) -> None:
    ds = fastload.PackedDataset(packed, image_size=32, train=True)
    remote = fastload.DataLoader(ds, batch_size=3, shuffle=True, seed=4, mode="ray", num_workers=2,
                                 in_order=False, pin_memory=True)  # pinned only where CUDA is
    want = {tuple(y.tolist()): x for x, y in batches(fastload.DataLoader(ds, batch_size=3, shuffle=True, seed=4,
                                                                          mode="threads"))}
    got = {tuple(y.tolist()): x for x, y in batches(remote)}
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_resume_mid_epoch_delivers_exactly_the_rest(cluster: Any, packed: Path) -> None:
    ds = fastload.PackedDataset(packed, image_size=32, train=True)
    want = batches(fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=9, mode="threads"))
    first = fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=9, mode="ray", num_workers=2)
    head = batches(first, limit=3)
    state = first.state_dict()
    assert (state["epoch"], state["position"]) == (0, 12)
    del first  # the job restarts: its actors go, new ones start
    gc.collect()
    second = fastload.DataLoader(ds, batch_size=4, shuffle=True, seed=9, mode="ray", num_workers=2)
    second.load_state_dict(state)
    assert_same(head + batches(second), want)


def test_two_ranks_get_the_threads_modes_shares_disjoint_and_complete(cluster: Any, packed: Path) -> None:
    ds = fastload.PackedDataset(packed, image_size=32, train=True)

    def loader(rank: int, mode: str, **extra: Any) -> Any:
        sampler = EpochSampler(len(ds), shuffle=True, seed=11, rank=rank, world_size=2, drop_last=True, keyed=True)
        return fastload.DataLoader(ds, batch_size=3, sampler=sampler, mode=mode, **extra)

    ranks = [loader(r, "ray", num_workers=1) for r in range(2)]
    got: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[], []]
    for pair in zip(*ranks):  # in step, as DDP ranks are
        for r, (images, labels) in enumerate(pair):
            got[r].append((images.clone(), labels.clone()))
    for r in range(2):
        assert_same(got[r], batches(loader(r, "threads")))
    ids = [[y for _, labels in rank for y in labels.tolist()] for rank in got]
    assert not set(ids[0]) & set(ids[1])
    assert len(ids[0]) == len(ids[1]) == RECORDS // 2 and len(set(ids[0]) | set(ids[1])) == RECORDS - 1


def test_a_damaged_record_raises_in_its_place_or_is_skipped_and_counted(cluster: Any, packed: Path,
                                                                       tmp_path: Path) -> None:
    damaged = shutil.copytree(packed, tmp_path / "damaged.fl")
    flip_payload_byte(damaged, BAD)

    raising = fastload.DataLoader(fastload.PackedDataset(damaged, image_size=32, train=True), batch_size=4,
                                  shuffle=False, mode="ray", num_workers=1)
    it = iter(raising)
    assert [y for _ in range(2) for y in next(it)[1].tolist()] == list(range(8))
    with pytest.raises(CorruptRecordError, match=rf"record {BAD} \(img{BAD:04d}.jpg\).*checksum"):
        next(it)
    assert next(it)[1].tolist() == [12, 13, 14, 15]  # the next batch follows, as in the local modes
    del it, raising

    skipping = fastload.DataLoader(fastload.PackedDataset(damaged, image_size=32, train=True, on_error="skip"),
                                   batch_size=4, shuffle=False, mode="ray", num_workers=1)
    assert [y for _, labels in skipping for y in labels.tolist()] == [i for i in range(RECORDS) if i != BAD]
    assert skipping.stats()["skipped"] == 1


def test_elastic_actors_are_added_while_the_loop_waits_and_idle_ones_retired(cluster: Any, packed: Path) -> None:
    ds = fastload.PackedDataset(packed, image_size=32, train=True)
    threads = fastload.DataLoader(ds, batch_size=2, shuffle=True, seed=6, mode="threads")
    remote = fastload.DataLoader(ds, batch_size=2, shuffle=True, seed=6, mode="ray", num_workers=2,
                                 ray_min_workers=1)
    tail = remote._tail
    shown = Seen(waited=1.0, idle=0)  # what the policy sees, whatever the timings: a loop held up by decoding
    tail.pool.policy = lambda recent, actors: target([shown] * WINDOW, actors, low=1, high=2)

    got, counts = [], []
    for images, labels in remote:
        got.append((images.clone(), labels.clone()))
        counts.append(len(tail.actors) + len(tail.pool.starting))
    assert counts[0] == 1 and counts[-1] == 2 and counts == sorted(counts)  # one actor, then a second asked for
    tail.start(wait=True)
    assert remote.stats()["actors"] == 2 and len(set(tail.pool.nodes.values())) == 2
    assert_same(got, batches(threads))

    shown = Seen(waited=0.0, idle=1)  # a loop that never waits, an actor with nothing to do
    got = batches(remote)
    assert (remote.stats()["actors"], tail.pool.retired, tail.pool.retiring, tail.pool.replaced) == (1, 1, [], 0)
    assert_same(got, batches(threads))  # the retired actor's last batches delivered in their place


def test_local_and_remote_actors_decode_together(cluster: Any, packed: Path) -> None:
    ds = fastload.PackedDataset(packed, image_size=32, train=True)
    both = fastload.DataLoader(ds, batch_size=3, shuffle=True, seed=8, mode="ray", num_workers=2,
                               ray_local_workers=1)
    both._tail.start(wait=True)
    here = ray.get_runtime_context().get_node_id()
    assert [both._tail.pool.nodes[actor] == here for actor in both._tail.actors].count(True) == 1
    assert len(set(both._tail.pool.nodes.values())) == 2  # the other on the other node
    assert both._tail.pool.local == {actor for actor in both._tail.actors if both._tail.pool.nodes[actor] == here}
    assert_same(batches(both), batches(fastload.DataLoader(ds, batch_size=3, shuffle=True, seed=8, mode="threads")))


def test_a_pass_given_up_takes_back_its_queued_batches(cluster: Any, packed: Path, tmp_path: Path) -> None:
    calls, gate = tmp_path / "calls", tmp_path / "gate"
    calls.mkdir()

    def gated(sample: Any, generator: Any) -> Any:  # runs on the actor: every sample past the first
        import os  # batch waits for the gate
        import time
        import uuid

        (calls / uuid.uuid4().hex).touch()
        while len(os.listdir(calls)) > 2 and not gate.exists():
            time.sleep(0.01)
        return sample

    ds = fastload.PackedDataset(packed, image_size=32, train=True, sample_transform=gated)
    remote = fastload.DataLoader(ds, batch_size=2, shuffle=False, seed=7, mode="ray", num_workers=1,
                                 prefetch_factor=4)
    it = iter(remote)
    assert next(it)[1].tolist() == [0, 1]  # four more batches sent meanwhile: one started, held at the gate
    del it  # the loop breaks off
    gc.collect()
    deadline = time.monotonic() + 60
    while remote._tail.pool.cancelled == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert remote._tail.pool.cancelled == 4  # taken back: the held batch and the three queued behind it
    gate.touch()
    ray.get(remote._tail.pool.actors[0].ready.remote())  # after the batch it had started
    assert len(list(calls.iterdir())) == 4  # the first batch and the started one: none of the queued ran
    want = fastload.DataLoader(ds, batch_size=2, shuffle=False, seed=7, mode="threads")
    batches(want, limit=1)  # the same pass given up: the next is epoch 1 (other crops)
    assert_same(batches(remote), batches(want))  # every batch of the next pass, none stale


def test_what_mode_ray_refuses(cluster: Any, packed: Path) -> None:
    ds = fastload.PackedDataset(packed, image_size=32, train=True)
    with pytest.raises(ValueError, match=r"mode='ray' needs num_workers >= 1 \(the decode actors"):
        fastload.DataLoader(ds, batch_size=4, mode="ray")
    with pytest.raises(ValueError, match="mode='ray' with batch_size=None"):
        fastload.DataLoader(ds, batch_size=None, mode="ray", num_workers=1)
    with pytest.raises(ValueError, match="ray_min_workers=3 with num_workers=2: give an int from 1 to num_workers"):
        fastload.DataLoader(ds, batch_size=4, mode="ray", num_workers=2, ray_min_workers=3)
    with pytest.raises(ValueError, match=r"ray_local_workers=2 with num_workers=3 and ray_min_workers=1: give an "
                                         r"int from 0 to 1 \(the actors kept on this machine are never retired"):
        fastload.DataLoader(ds, batch_size=4, mode="ray", num_workers=3, ray_min_workers=1, ray_local_workers=2)
    with pytest.raises(ValueError, match=r"ray_local_workers=2: this machine.s Ray node has 1 CPU\(s\) for actors"):
        next(iter(fastload.DataLoader(ds, batch_size=4, mode="ray", num_workers=2, ray_local_workers=2)))
    with pytest.raises(ValueError, match=r"ray_min_workers=1, ray_local_workers=1 apply to mode='ray' only, and "
                                         r"this loader's mode is 'threads': pass mode='ray' or drop them"):
        fastload.DataLoader(ds, batch_size=4, mode="threads", ray_min_workers=1, ray_local_workers=1)


def test_a_pixel_cache_fills_on_the_actors_and_its_counts_reach_the_loop(cluster: Any, packed: Path,
                                                                         tmp_path: Path) -> None:
    """The actors crop from the pixel cache on their nodes (one folder here: one machine), and its
    counts ride back in each batch to loader.stats(), as they do from worker processes."""
    ds = fastload.PackedDataset(packed, image_size=32, train=True, pixel_cache=tmp_path / "pixels")
    remote = fastload.DataLoader(ds, batch_size=5, shuffle=True, seed=3, mode="ray", num_workers=2)
    threads = fastload.DataLoader(fastload.PackedDataset(packed, image_size=32, train=True,
                                                         pixel_cache=tmp_path / "threads"),
                                  batch_size=5, shuffle=True, seed=3, mode="threads")
    assert_same(batches(remote), batches(threads))  # epoch 1: decoded, stored and cropped
    first = remote.stats(reset=True)["pixel_cache"]
    assert (first["stored"], first["hits"]) == (RECORDS, 0)
    assert_same(batches(remote), batches(threads))  # epoch 2: cropped from the stored pixels
    second = remote.stats()["pixel_cache"]
    assert (second["hits"], second["misses"]) == (RECORDS, 0)
