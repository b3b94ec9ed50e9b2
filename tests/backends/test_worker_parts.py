"""backend="nvimgcodec" with worker processes: the GPU's share of each batch is read and planned in
them (fastload/backends/worker_parts.py, planned_part.py), and the batches are those planned in the
training process: order, labels, pixels, skips, errors and resume."""

from __future__ import annotations

import gc
import json
import shutil
import threading
import weakref
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload.backends import decode_split
from fastload.backends.planned import read_and_plan
from fastload.backends.planned_part import as_batch, as_part, plan_part
from fastload.backends.worker_parts import Part, PartRouter
from fastload.errors import CorruptRecordError
from tests.backends.contract import BATCH, SIZE, make, needs_nvimgcodec, run
from tests.conftest import flip_payload_byte

DAMAGED = 2  # the record whose bytes damaged_copy makes fail their checksum


def damaged_copy(path: Path, tmp_path: Path) -> Path:
    """A copy of the dataset at ``path`` in which record DAMAGED's bytes fail their checksum."""
    copy = shutil.copytree(path, tmp_path / "damaged.fl")
    flip_payload_byte(copy, DAMAGED)
    return copy


def fixed_share(monkeypatch, loader, share: float):
    """``loader`` with its CPU share held at ``share`` (0: every record is planned in a worker for the
    GPU path), whatever the timing; planning in the training process would raise."""
    monkeypatch.setattr(decode_split, "STEP", 0.0)

    def in_the_training_process(*args, **kwargs):
        raise AssertionError("read_and_plan ran in the training process")

    monkeypatch.setattr("fastload.backends.nvimgcodec.read_and_plan", in_the_training_process)
    loader._tail.cpu_share = share
    return loader


# --- the planned part: tensors there, views here ---------------------------------------------------


def test_a_planned_part_rebuilds_its_batch_with_views_of_one_buffer(packed):
    ds = fastload.PackedDataset(packed["lmdb"], image_size=SIZE, train=True)
    keys = [(i, 3, 11) for i in (5, 0, 9, 0, 36)]  # a record twice, PNGs (5, 9) among JPEGs
    batch = read_and_plan(ds, keys)
    part = as_part(batch)
    assert isinstance(part.payloads, torch.Tensor) and all(isinstance(a, np.ndarray) for a in part[1:5])
    assert part.pin_memory() is part  # torch's pin-memory thread leaves the payloads where they are
    rebuilt = as_batch(part)
    assert (rebuilt.indices, rebuilt.plans, rebuilt.sizes) == (batch.indices, batch.plans, batch.sizes)
    assert [bytes(p) for p in rebuilt.payloads] == batch.payloads
    assert all(isinstance(p, memoryview) and p.readonly and p.obj is rebuilt.payloads[0].obj
               for p in rebuilt.payloads)


def test_a_planned_part_carries_skipped_records_and_errors_by_name(packed, tmp_path):
    copy = damaged_copy(packed["lmdb"], tmp_path)
    skipping = fastload.PackedDataset(copy, image_size=SIZE, train=True, on_error="skip")
    rebuilt = as_batch(as_part(read_and_plan(skipping, [1, DAMAGED, 3], skip=True)))
    assert rebuilt.indices == [1, 3] and list(rebuilt.failed) == [DAMAGED]
    assert f"record {DAMAGED} (img{DAMAGED:04d}" in str(rebuilt.failed[DAMAGED])
    raising = fastload.PackedDataset(copy, image_size=SIZE, train=True)
    with pytest.raises(CorruptRecordError) as planned_here:
        read_and_plan(raising, [1, DAMAGED, 3])
    with pytest.raises(CorruptRecordError) as planned_there:
        as_batch(plan_part(raising, [1, DAMAGED, 3], skip=False))
    assert str(planned_there.value) == str(planned_here.value)


# --- the router: each side its parts, in order, a worker's error in its part's place ---------------


class _Parts:
    """A stand-in for WorkerParts: hands out fixed items, as torch's iterator would."""

    def __init__(self, items):
        self.items = iter(items)

    def read(self, router):
        for ok, item in self.items:
            return ok, item
        return None


def test_the_router_gives_each_side_its_parts_and_a_workers_error_in_its_place():
    failure = RuntimeError("worker 1 failed on gpu part 1")
    sides = deque(Part(side, []) for side in ["cpu", "gpu", "cpu", "gpu", "gpu"])
    items = [(True, "c0"), (True, "g0"), (True, "c1"), (False, failure), (True, "g2")]
    router = PartRouter(_Parts(items), iter(()), sides)
    assert router.take("gpu") == "g0"  # c0 kept for the CPU side on the way
    assert router.take("cpu") == "c0"
    with pytest.raises(RuntimeError, match="gpu part 1"):
        router.take("gpu")
    assert router.take("cpu") == "c1"
    assert list(router.parts("gpu")) == ["g2"] and list(router.parts("cpu")) == []


# --- the loader: the same batches as without workers ------------------------------------------------

@needs_nvimgcodec
@pytest.mark.parametrize("train", [True, False])
def test_batches_planned_in_workers_equal_those_planned_in_the_training_process(packed, monkeypatch, train):
    """Share 0: every record read and planned in a worker process, decoded by nvImageCodec here; the
    batches equal num_workers=0's to the bit (order, labels, pixels), two epochs on the same workers."""
    alone = make(packed["hdf5"], "nvimgcodec", train=train, seed=3)
    expected = [run(alone) for _ in range(2)]
    loader = fixed_share(monkeypatch, make(packed["hdf5"], "nvimgcodec", train=train, seed=3, num_workers=2), 0.0)
    for epoch in range(2):
        ids, images, sizes = run(loader)
        assert (ids, sizes) == expected[epoch][::2] and torch.equal(images, expected[epoch][1])
    assert loader._tail.cpu_share == 0.0


@needs_nvimgcodec
@pytest.mark.parametrize(("batch_size", "share"), [(3, 0.0), (3, 0.5), (1, 0.0)])
def test_records_skipped_in_a_worker_are_counted_and_warned_of_here(packed, tmp_path, monkeypatch, batch_size,
                                                                    share):
    """A record failing its checksum while a worker plans it (share 0.5: batches of 3 cut 2 + 1, so
    record 2 is on the GPU's side): left out, counted once, warned of by name in the training process;
    a batch of it alone is delivered empty."""
    copy = damaged_copy(packed["lmdb"], tmp_path)
    skipping = fastload.PackedDataset(copy, image_size=SIZE, train=False, on_error="skip")
    loader = fixed_share(monkeypatch, fastload.DataLoader(skipping, batch_size=batch_size, shuffle=False,
                                                          backend="nvimgcodec", num_workers=2), share)
    with pytest.warns(fastload.errors.SkippedRecordWarning, match=rf"record {DAMAGED} \(img{DAMAGED:04d}"):
        ids, _, sizes = run(loader)
    n = len(skipping)
    assert ids == [i for i in range(n) if i != DAMAGED]
    assert sizes == [sum(i != DAMAGED for i in range(s, min(s + batch_size, n))) for s in range(0, n, batch_size)]
    assert loader.stats()["skipped"] == 1


@needs_nvimgcodec
@pytest.mark.parametrize("share", [0.0, 0.5])
def test_a_record_damaged_in_a_workers_part_fails_its_batch_naming_it(packed, tmp_path, monkeypatch, share):
    """on_error="raise": the batches before it, then the error num_workers=0 raises, word for word,
    whether the record is in a GPU part (share 0) or a CPU part (0.5: batches of 2 cut 1 + 1, so
    record 2 is decoded in a worker), not torch's "Caught ... in DataLoader worker" wrapper."""
    copy = damaged_copy(packed["lmdb"], tmp_path)
    messages, delivered = [], []
    for workers in (0, 2):
        loader = fastload.DataLoader(fastload.PackedDataset(copy, image_size=SIZE, train=False), batch_size=2,
                                     shuffle=False, backend="nvimgcodec", num_workers=workers)
        if workers:
            fixed_share(monkeypatch, loader, share)
        got = []
        with pytest.raises(CorruptRecordError, match=rf"record {DAMAGED} \(img{DAMAGED:04d}.jpg\)") as raised:
            for _, y in loader:
                got += y.tolist()
        messages.append(str(raised.value))
        delivered.append(got)
        loader.set_epoch(0)
        assert run(loader, limit=1)[0] == [0, 1]  # the next iteration starts afresh
    assert messages[0] == messages[1] and delivered == [[0, 1], [0, 1]]
    assert "DataLoader worker" not in messages[1]


@needs_nvimgcodec
def test_a_resume_planned_in_workers_yields_the_rest_to_the_pixel(packed, monkeypatch):
    path = packed["lmdb"]
    ids, images, _ = run(make(path, "nvimgcodec"))
    saver = fixed_share(monkeypatch, make(path, "nvimgcodec", num_workers=2), 0.0)
    it = iter(saver)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(saver.state_dict()))
    del it
    resumed = fixed_share(monkeypatch, make(path, "nvimgcodec", num_workers=2), 0.0)
    resumed.load_state_dict(state)
    rest_ids, rest, _ = run(resumed)
    assert rest_ids == ids[3 * BATCH:] and torch.equal(rest, images[3 * BATCH:])


@needs_nvimgcodec
def test_with_a_share_every_sample_is_one_of_the_two_decoders(packed, monkeypatch):
    """Share 0.5 held: each batch's first half decoded in a worker (the torch backend's pixels, to the
    bit), the rest planned in a worker and decoded here (num_workers=0's pixels, within its rounding)."""
    torch_ids, torch_images, _ = run(make(packed["lmdb"], "torch", shuffle=False))
    alone_ids, alone_images, _ = run(make(packed["lmdb"], "nvimgcodec", shuffle=False))
    loader = fixed_share(monkeypatch, make(packed["lmdb"], "nvimgcodec", shuffle=False, num_workers=2), 0.5)
    ids, images, sizes = run(loader)
    assert ids == torch_ids == alone_ids
    start = 0
    for size in sizes:
        cut = round(0.5 * size)
        assert torch.equal(images[start:start + cut], torch_images[start:start + cut])
        gpu = slice(start + cut, start + size)
        diff = (images[gpu].to(torch.int16) - alone_images[gpu].to(torch.int16)).abs()
        assert int(diff.max()) <= 1 and float(np.mean(diff.numpy())) < 0.05
        start += size


@needs_nvimgcodec
def test_a_dropped_loader_frees_its_workers_iterator_at_once(packed):
    """No reference cycle holds torch's iterator: one freed by the cycle collector (in whichever thread
    it runs) waits 5 s per worker process that has already lost its queue."""
    running = set(threading.enumerate())
    loader = make(packed["lmdb"], "nvimgcodec", num_workers=2)
    run(loader)
    iterator = weakref.ref(loader._tail._worker_parts.loader._iterator)
    gc.disable()
    try:
        del loader
        for thread in set(threading.enumerate()) - running:  # the epoch's threads drop what they held as they end
            if thread.name == "fastload-prefetch":
                thread.join(timeout=60)
        assert iterator() is None
    finally:
        gc.enable()
