"""A planned batch as tensors: what a worker process hands the training process for the GPU to decode.

A worker process reads and plans the GPU's part of a batch (:func:`~fastload.backends.planned.read_and_plan`,
the same records, checks and crop draws as in the training process). torch's worker pipeline moves
each tensor through shared memory and pickles everything else, so the payloads travel back to back
in one uint8 tensor, made in shared memory; the numbers (offsets, indices, plans, sizes: a few KB)
are pickled with the part as NumPy arrays, which costs the training process less than a shared
memory file each (measured: ``bench/nvimgcodec_parent_cpu.py``). The training process rebuilds the
:class:`~fastload.backends.planned.PlannedBatch` with each payload a view of that buffer, not a copy.
With a pool of payload slots (:mod:`fastload.backends.payload_slots`) the buffer is the slot the
sampler leased to the part, made once and reused, and only its number travels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from fastload.backends.payload_slots import Lease, SlotBuffers
from fastload.backends.planned import PlannedBatch, read_and_plan
from fastload.decode.transforms import CropPlan
from fastload.errors import CorruptRecordError
from fastload.samples.collate import new_batch_tensor

PLAN_COLUMNS = ("left", "top", "width", "height", "out_height", "out_width", "flip", "crop_first")
"""The columns of :attr:`PlannedPart.plans`: a CropPlan's fields, in float64 (exact for its ints)."""
_NO_PLANS = np.zeros((0, len(PLAN_COLUMNS)), dtype=np.float64)
_EMPTY = torch.zeros(0, dtype=torch.uint8)  # no buffer of its own (torch sends an empty tensor as no file)


class PlannedPart(NamedTuple):
    """One part of a batch read and planned in a worker process, nothing decoded yet.

    Attributes:
        payloads: uint8 tensor: the records' encoded bytes, back to back (checked against their checksums).
        offsets: int64 ``N + 1``: record ``k``'s bytes are ``payloads[offsets[k]:offsets[k + 1]]``.
        indices: int64 ``N``: record indices, in the sampler's order.
        plans: float64 ``N × 8``: each record's crop plan (:data:`PLAN_COLUMNS`).
        sizes: int64 ``N × 2``: each record's ``(width, height)``.
        failed: records left out under ``on_error="skip"`` (the training process counts them).
        messages: the error of each record in ``failed``, naming it.
        error: under ``on_error="raise"``, the error that stopped the part (naming the record), else None.
        slot, generation: the payload slot leased to the part and its lease's generation (-1: none).
        pooled: the payloads are in that slot (``payloads`` is empty), not in a fresh buffer.
        lease: in the training process, the slot's :class:`~fastload.backends.payload_slots.Lease`.
    """

    payloads: torch.Tensor
    offsets: np.ndarray
    indices: np.ndarray
    plans: np.ndarray
    sizes: np.ndarray
    failed: tuple[int, ...] = ()
    messages: tuple[str, ...] = ()
    error: str | None = None
    slot: int = -1
    generation: int = 0
    pooled: bool = False
    lease: Lease | None = None

    def pin_memory(self) -> PlannedPart:
        """Itself: nvImageCodec reads the payloads from ordinary host memory (torch's pin-memory
        thread calls this instead of copying the buffer into pinned memory)."""
        return self


def plan_part(dataset: Any, keys: Sequence[Any], *, skip: bool, slots: SlotBuffers | None = None, slot: int = -1,
              generation: int = 0) -> PlannedPart:
    """Read records ``keys`` and plan their crops (in a worker process) as a PlannedPart, its
    payloads in ``slots``' slot ``slot`` if leased one and they fit; a damaged record's
    CorruptRecordError travels in it, to be raised in the batch's place."""
    try:
        batch = read_and_plan(dataset, keys, skip=skip)
    except CorruptRecordError as exc:
        return PlannedPart(_EMPTY, np.zeros(1, dtype=np.int64), np.zeros(0, dtype=np.int64), _NO_PLANS,
                           np.zeros((0, 2), dtype=np.int64), error=str(exc), slot=slot, generation=generation)
    return as_part(batch, slots, slot, generation)


def as_part(batch: PlannedBatch, slots: SlotBuffers | None = None, slot: int = -1, generation: int = 0) -> PlannedPart:
    """``batch`` as tensors: its payloads in ``slots``' slot ``slot`` (leased to ``generation``) if
    they fit, else in a new buffer (in a worker process, made in shared memory)."""
    lengths = np.array([len(p) for p in batch.payloads], dtype=np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    pooled = slots is not None and slot >= 0 and int(offsets[-1]) <= slots.nbytes
    if pooled:
        slots.fill(slot, generation, batch.payloads, offsets)  # type: ignore[union-attr]
        buffer = _EMPTY
    else:
        buffer = new_batch_tensor((int(offsets[-1]),))
        flat = buffer.numpy()
        for k, payload in enumerate(batch.payloads):
            flat[offsets[k]:offsets[k + 1]] = np.frombuffer(payload, dtype=np.uint8)
    plans = np.array([(*p.box, *p.out_size, p.flip, p.crop_first) for p in batch.plans],
                     dtype=np.float64).reshape(-1, len(PLAN_COLUMNS))
    return PlannedPart(buffer, offsets, np.array(batch.indices, dtype=np.int64), plans,
                       np.array(batch.sizes, dtype=np.int64).reshape(-1, 2), tuple(batch.failed),
                       tuple(str(exc) for exc in batch.failed.values()), slot=slot, generation=generation,
                       pooled=pooled)


def as_batch(part: PlannedPart) -> PlannedBatch:
    """The PlannedBatch ``part`` was made from; each payload a read-only view of its buffer (or
    of its slot, whose lease the batch then holds).

    Raises:
        CorruptRecordError: the part's own error (``on_error="raise"``), naming the record.
    """
    if part.error is not None:
        if part.lease is not None:
            part.lease.release()
        raise CorruptRecordError(part.error)
    if part.pooled:
        if part.lease is None:
            raise RuntimeError("fastload: a pooled planned part reached as_batch without its lease "
                               "(WorkerParts' router attaches it); a bug in fastload: please report it")
        flat = part.lease.payloads(int(part.offsets[-1]))
    else:
        flat = part.payloads.numpy()
    whole = memoryview(flat).toreadonly()
    offsets = part.offsets.tolist()
    payloads = [whole[offsets[k]:offsets[k + 1]] for k in range(len(offsets) - 1)]
    plans = [CropPlan(box=(left, top, width, height), out_size=(int(out_h), int(out_w)), flip=bool(flip),
                      crop_first=bool(crop_first))
             for left, top, width, height, out_h, out_w, flip, crop_first in part.plans.tolist()]
    failed = {i: CorruptRecordError(message) for i, message in zip(part.failed, part.messages)}
    return PlannedBatch(part.indices.tolist(), payloads, plans, [tuple(s) for s in part.sizes.tolist()], failed,
                        part.lease)
