"""collate_images in a worker process keeps the batch it sent until it has made the next one."""

from __future__ import annotations

import torch

from fastload.samples import collate
from fastload.samples.collate import ImageBatch, collate_images


def _batch(value: int) -> ImageBatch:
    return ImageBatch(torch.full((2, 3, 4, 4), value, dtype=torch.uint8), torch.tensor([value, value]))


def test_a_worker_keeps_the_batch_it_sent_until_the_next_and_no_older(monkeypatch):
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    monkeypatch.setattr(collate, "_sent", [])
    first = collate_images(_batch(1))
    assert [t.data_ptr() for t in collate._sent] == [t.data_ptr() for t in first]
    second = collate_images(_batch(2))
    assert [t.data_ptr() for t in collate._sent] == [t.data_ptr() for t in second]
    assert first[0].unique().tolist() == [1] and second[1].tolist() == [2, 2]  # what was sent is untouched


def test_the_training_process_keeps_nothing(monkeypatch):
    monkeypatch.setattr(collate, "_sent", [])
    collate_images(_batch(1))
    assert collate._sent == []
