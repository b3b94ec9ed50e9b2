"""Batch memory in the training process: recycled only once no tensor can see it any more."""

from __future__ import annotations

import gc
import multiprocessing

import torch

from fastload import batch_memory
from fastload.batch_memory import recycled_uint8
from fastload.collate import new_image_batch


def _free(nbytes: int) -> int:
    return len(batch_memory._free_list.free.get(nbytes, []))


def test_a_batch_is_reused_only_after_it_and_all_its_views_are_freed():
    shape = (4, 3, 8, 8)
    nbytes = 4 * 3 * 8 * 8
    batch = recycled_uint8(shape)
    batch.fill_(1)
    view = batch[2].permute(1, 2, 0)  # as the decoder writes a sample's slot
    address = batch.data_ptr()
    before = _free(nbytes)
    del batch
    gc.collect()
    assert _free(nbytes) == before  # the view still holds it
    other = recycled_uint8(shape)
    other.fill_(2)  # must not land in the memory the view sees
    assert other.data_ptr() != address and bool((view == 1).all())
    del view
    assert _free(nbytes) == before + 1
    again = recycled_uint8(shape)
    assert again.data_ptr() == address and again.shape == shape and again.dtype == torch.uint8
    assert again.is_contiguous() and address % 4096 == 0


def test_at_most_a_few_free_mappings_are_kept():
    shape = (batch_memory.KEEP_FREE + 3, 7)
    nbytes = shape[0] * shape[1]
    batches = [recycled_uint8(shape) for _ in range(batch_memory.KEEP_FREE + 3)]
    del batches
    assert _free(nbytes) == batch_memory.KEEP_FREE


def _write_inherited(batch: torch.Tensor) -> None:
    batch.fill_(9)
    recycled_uint8(tuple(batch.shape)).fill_(9)  # the child's own list starts empty


def test_a_forked_child_never_writes_its_parents_batches():
    batch = new_image_batch(2, 4, 4)  # outside a worker: recycled memory
    batch.fill_(1)
    spare = recycled_uint8(tuple(batch.shape))
    del spare  # on the free list, inherited by the child
    child = multiprocessing.get_context("fork").Process(target=_write_inherited, args=(batch,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert bool((batch == 1).all())
    assert bool((recycled_uint8(tuple(batch.shape)) != 9).all())
