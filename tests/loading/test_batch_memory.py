"""Batch memory in the training process: recycled only once no tensor can see it any more."""

from __future__ import annotations

import gc
import multiprocessing

import numpy as np
import torch

from fastload.loading import batch_memory
from fastload.loading.batch_memory import recycled_uint8
from fastload.samples.collate import new_image_batch


def _free(nbytes: int) -> int:
    return sum(len(memory) == nbytes for memory in batch_memory._free_list.free)


def _free_addresses() -> list[int]:
    return [np.frombuffer(memory, np.uint8).ctypes.data for memory in batch_memory._free_list.free]


def test_a_batch_is_reused_only_after_it_and_all_its_views_are_freed():
    shape = (4, 3, 8, 8)
    batch = recycled_uint8(shape)
    batch.fill_(1)
    view = batch[2].permute(1, 2, 0)  # as the decoder writes a sample's slot
    address = batch.data_ptr()
    del batch
    gc.collect()
    assert address not in _free_addresses()  # the view still holds it
    other = recycled_uint8(shape)
    other.fill_(2)  # must not land in the memory the view sees
    assert other.data_ptr() != address and bool((view == 1).all())
    del view
    assert address in _free_addresses()
    again = recycled_uint8(shape)
    assert again.data_ptr() == address and again.shape == shape and again.dtype == torch.uint8
    assert again.is_contiguous() and address % 4096 == 0


def test_at_most_a_few_free_mappings_are_kept_the_oldest_unmapped_first():
    sizes = [(batch_memory.KEEP_FREE + 3, 7), (5, 11)]
    batches = [recycled_uint8(shape) for shape in sizes for _ in range(batch_memory.KEEP_FREE)]
    while batches:
        batches.pop(0)  # freed in the order made: the (5, 11) ones last
    assert len(batch_memory._free_list.free) == batch_memory.KEEP_FREE
    assert _free(5 * 11) == batch_memory.KEEP_FREE  # the last freed are kept


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
