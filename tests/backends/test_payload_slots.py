"""The planned parts' payload slots (fastload/backends/payload_slots.py): made once, reused part after
part, released only when nothing reads them; the batches equal num_workers=0's to the bit."""

from __future__ import annotations

import io
import pickle
import threading
from collections import deque
from multiprocessing.reduction import ForkingPickler
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing  # registers the tensor reductions with ForkingPickler

import fastload
from fastload.backends.payload_slots import (
    FILLED,
    LEASED,
    PayloadPool,
    SlotBuffers,
    free_shared_memory,
)
from fastload.backends.pipeline_stage import PipelineStage
from fastload.backends.planned import PlannedBatch, read_and_plan
from fastload.backends.planned_part import as_batch, as_part
from fastload.backends.worker_parts import Part, PartRouter
from fastload.decode.transforms import CropPlan
from fastload.errors import CorruptRecordError, SharedMemoryError
from tests.backends.contract import SIZE, make, needs_nvimgcodec, run
from tests.backends.test_worker_parts import DAMAGED, _Parts, damaged_copy, fixed_share


def wait_until(check, limit_s: float = 120.0) -> bool:
    """Poll ``check`` until it holds (True), or give up after ``limit_s`` (False): what a thread
    of a pass given up still holds is let go when that thread next runs, on a busy machine later."""
    waited = threading.Event()
    for _ in range(int(limit_s / 0.05)):
        if check():
            return True
        waited.wait(0.05)
    return check()


def leased_parts(pool: PayloadPool, count: int) -> list[SimpleNamespace]:
    """``count`` received GPU parts, each holding a lease of ``pool``'s."""
    return [SimpleNamespace(lease=pool.received(*pool.lease(), "pooled")) for _ in range(count)]


def pooled(monkeypatch, loader, slots: int, share: float = 0.0, slot_bytes: int | None = None):
    """``loader`` (share held) whose workers' parts go through ``slots`` payload slots (of
    ``slot_bytes`` each, if given); returns it and a way to its pool once made."""
    fixed_share(monkeypatch, loader, share)
    loader._tail.payload_slots = slots
    if slot_bytes is not None:
        monkeypatch.setattr(PayloadPool, "sized_for", classmethod(lambda cls, ds, b, count, why="": cls(count, slot_bytes)))
    return loader, (lambda: loader._tail._worker_parts.pool)


# --- the slots themselves ----------------------------------------------------------------------------


def test_a_slot_is_refilled_only_under_a_new_lease_and_a_stale_one_is_an_error(packed):
    ds = fastload.PackedDataset(packed["lmdb"], image_size=SIZE, train=True)
    batch = read_and_plan(ds, [0, 1, 6])
    pool = PayloadPool(1, 1 << 16)
    slot, generation = pool.lease()
    assert pool.lease() == (-1, 0) and pool.counts["no_slot"] == 1  # the only slot is out
    part = as_part(batch, pool.slots, slot, generation)
    assert part.pooled and part.payloads.numel() == 0
    rebuilt = as_batch(part._replace(lease=pool.received(slot, generation, "pooled")))
    assert [bytes(p) for p in rebuilt.payloads] == batch.payloads
    rebuilt.lease.release()
    rebuilt.lease.release()  # once: a second call does nothing
    assert pool.free() == 1 and int(pool.slots.stamps[slot, LEASED]) == 0
    with pytest.raises(RuntimeError, match=f"slot {slot} is leased to generation 0, not {generation}"):
        as_part(batch, pool.slots, slot, generation)  # a worker filling a slot no longer leased to its part
    again, newer = pool.lease()
    assert again == slot and newer > generation
    with pytest.raises(RuntimeError, match="holding the payloads of generation 0"):
        pool.received(again, newer, "pooled").payloads(10)  # leased, not filled: never the last part's bytes


def test_a_part_bigger_than_its_slot_takes_a_fresh_buffer():
    pool = PayloadPool(1, 4096)
    slot, generation = pool.lease()
    plan = CropPlan(box=(0.0, 0.0, 1.0, 1.0), out_size=(1, 1), flip=False, crop_first=False)
    big = PlannedBatch([0, 1], [b"a" * 3000, b"b" * 3000], [plan, plan], [(1, 1), (1, 1)])
    part = as_part(big, pool.slots, slot, generation)
    assert not part.pooled and part.payloads.numel() == 6000
    lease = pool.received(slot, generation, "oversize")
    rebuilt = as_batch(part._replace(lease=lease))
    assert [bytes(p) for p in rebuilt.payloads] == big.payloads and pool.counts["oversize"] == 1
    del rebuilt, lease  # the last reference to the lease goes: its slot is released
    assert pool.free() == 1


def test_the_slots_travel_to_a_spawned_worker_as_shared_memory_not_a_copy():
    slots = SlotBuffers(2, 4096)
    buffer = io.BytesIO()
    ForkingPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(slots)  # as multiprocessing's spawn pickles the dataset
    there = pickle.loads(buffer.getvalue())
    there.memory[1, :3] = torch.tensor([7, 8, 9], dtype=torch.uint8)
    there.stamps[1, FILLED] = 42
    assert slots.memory[1, :3].tolist() == [7, 8, 9] and int(slots.stamps[1, FILLED]) == 42


def test_slots_that_do_not_fit_in_shared_memory_are_an_error_naming_them_and_the_way_out():
    room = free_shared_memory()
    with pytest.raises(SharedMemoryError, match=r"payload slots need 3 × .* of shared memory \(two workers\).*"
                                                r"/dev/shm has .* free.*--shm-size.*num_workers=0"):
        PayloadPool(3, room // 2, why="two workers")


@needs_nvimgcodec
def test_a_loader_whose_slots_do_not_fit_says_so_at_its_first_batch(packed):
    """Batches of ten million records (one batch of 37 here): slots sized for them cannot fit."""
    loader = make(packed["lmdb"], "nvimgcodec", batch_size=10_000_000, num_workers=2)
    with pytest.raises(SharedMemoryError, match=r"2 workers × prefetch_factor 2 \+ 7 in this process"):
        next(iter(loader))


# --- a pass given up gives its slots back --------------------------------------------------------------


def test_a_closed_router_gives_back_the_slots_of_the_parts_it_kept():
    """The CPU side read past two GPU parts (the router keeps them for the GPU side); the pass is
    given up: closing the router releases their slots at once, not when the garbage collector finds them."""
    pool = PayloadPool(2, 4096)
    g0, g1 = leased_parts(pool, 2)
    items = [(True, "c0"), (True, g0), (True, g1), (True, "c1")]
    router = PartRouter(_Parts(items), iter(()), deque(Part(side, []) for side in ["cpu", "gpu", "gpu", "cpu"]))
    assert [router.take("cpu"), router.take("cpu")] == ["c0", "c1"]
    assert pool.free() == 0
    router.close()
    assert pool.free() == 2 and list(router.parts("gpu")) == []


def test_a_closed_stage_gives_back_the_slots_of_the_batches_it_holds():
    """A pipeline stage two batches ahead, the loop holding the first: closing it releases the
    queued batches' slots at once, and the one in the stage's hands when it stops."""
    pool = PayloadPool(4, 4096)
    batches = leased_parts(pool, 4)
    stage = PipelineStage(iter(batches), depth=2)
    first = next(stage)
    assert wait_until(lambda: stage._queue.full())  # two queued, the fourth in the stage's hands
    del batches
    stage.close()
    assert pool.free() >= 2  # the queued ones, at once
    assert wait_until(lambda: pool.free() == 3)  # and the one in its hands (not the loop's own)
    first.lease.release()
    assert pool.free() == 4


# --- the loader: the same pixels, slots reused, none lost -------------------------------------------

@needs_nvimgcodec
def test_one_slot_reused_over_epochs_gives_num_workers_0s_pixels(packed, monkeypatch):
    alone = make(packed["hdf5"], "nvimgcodec", seed=5)
    expected = [run(alone) for _ in range(3)]
    loader, pool = pooled(monkeypatch, make(packed["hdf5"], "nvimgcodec", seed=5, num_workers=2), slots=1)
    for epoch in range(3):
        ids, images, sizes = run(loader)
        assert (ids, sizes) == expected[epoch][::2] and torch.equal(images, expected[epoch][1])
        assert pool().free() == 1  # every part's slot released by the epoch's end
    assert pool().counts["pooled"] >= 3 and pool().counts["oversize"] == 0


@needs_nvimgcodec
def test_a_pass_given_up_mid_epoch_then_a_full_pass_equal_and_no_slot_lost(packed, monkeypatch):
    alone = make(packed["lmdb"], "nvimgcodec", seed=2)
    expected = run(alone)
    loader, pool = pooled(monkeypatch, make(packed["lmdb"], "nvimgcodec", seed=2, num_workers=2), slots=3)
    for _ in range(2):
        it = iter(loader)
        next(it), next(it)  # the workers have parts ahead, the decode pipeline holds some
        del it
        loader.set_epoch(0)
        ids, images, sizes = run(loader)
        assert (ids, sizes) == expected[::2] and torch.equal(images, expected[1])
        assert wait_until(lambda: pool().free() == 3), pool().free()
    assert pool().counts["pooled"] >= 4  # each pass's first part at least (every slot is free then)


@needs_nvimgcodec
def test_parts_bigger_than_their_slot_fall_back_to_fresh_buffers(packed, monkeypatch):
    expected = run(make(packed["lmdb"], "nvimgcodec", seed=4))
    # 12 KB: a part of 5 of these 48-159 px records fits, or not (both happen); 16 slots: each of
    # the 8 parts gets one
    loader, pool = pooled(monkeypatch, make(packed["lmdb"], "nvimgcodec", seed=4, num_workers=2), slots=16,
                          slot_bytes=12 * 1024)
    ids, images, sizes = run(loader)
    assert (ids, sizes) == expected[::2] and torch.equal(images, expected[1])
    assert pool().counts["oversize"] > 0 and pool().counts["pooled"] > 0 and pool().free() == 16


@needs_nvimgcodec
@pytest.mark.filterwarnings("ignore::fastload.errors.SkippedRecordWarning")
@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_skips_and_errors_release_their_slots(packed, tmp_path, monkeypatch, on_error):
    """Every pass: the damaged record skipped, or its error raised (the pass ends there, parts still
    with the workers); each slot is then free, or out with a part torch drops unread, reclaimed when
    the next pass starts (whose first part always gets one)."""
    copy = damaged_copy(packed["lmdb"], tmp_path)
    ds = fastload.PackedDataset(copy, image_size=SIZE, train=False, on_error=on_error)
    # Batches of 1: records 0 and 1 are parts of their own before record 2's
    loader = fastload.DataLoader(ds, batch_size=1, shuffle=False, backend="nvimgcodec", num_workers=2)
    loader, pool = pooled(monkeypatch, loader, slots=2)
    for epoch in range(4):
        if on_error == "skip":
            ids, _, _ = run(loader)
            assert ids == [i for i in range(len(ds)) if i != DAMAGED]
        else:
            with pytest.raises(CorruptRecordError, match=rf"record {DAMAGED} "):
                run(loader)
        loader.set_epoch(0)
        assert wait_until(lambda: pool().free() + len(pool()._dispatched) == 2)  # none lost
        assert pool().counts["pooled"] >= 2 * (epoch + 1)  # at least records 0 and 1, in slots
    if on_error == "skip":
        assert pool().free() == 2 and loader.stats()["skipped"] == 4
