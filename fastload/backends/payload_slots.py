"""Where planned parts' payloads travel: buffers made in shared memory once, reused part after part.

A worker process that plans a GPU part (:mod:`fastload.backends.planned_part`) copies the records'
bytes back to back into a payload buffer the training process reads them from. A fresh shared-memory
buffer per part costs the worker its allocation and page faults (~11 ms a batch of 256, against
~0.85 ms for the copy) and the training process its receipt and free. Here the training process
makes ``count`` slots once, before the workers start (forked workers inherit them, spawned ones
receive them in the dataset's pickle): the sampler leases a free slot to each GPU part it hands out,
the worker copies into it, and the training process releases it when nothing reads it any more
(after the part's decode has finished, on the GPU after the decode stream's work). No free slot,
or a part bigger than its slot: that part takes a fresh buffer, as before (counted).

The slots take their whole size in ``/dev/shm`` when they are made (torch reserves shared memory
whole, so that a full ``/dev/shm`` fails there and then, not as a crash mid-epoch); where it has
no room for them, the error says so, with the slots' size and the way out.

Each lease has a generation, stamped in shared memory beside the slot (who holds it, whose bytes
are in it) and checked by both sides, so that a slot written while leased to another part is an
error, never another record's bytes.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from typing import Any

import numpy as np
import torch

from fastload.config import format_size
from fastload.errors import SharedMemoryError

LEASED, FILLED = 0, 1
"""The columns of :attr:`SlotBuffers.stamps`: the generation a slot is leased to (0: free), and the
generation whose payloads it holds."""
PAGE = 4096
SHARED_MEMORY = "/dev/shm"


class SlotBuffers:
    """``count`` payload buffers of ``nbytes`` each in shared memory, and their stamps: what both
    sides hold (it pickles to a spawned worker as shared memory, not as a copy).

    Args:
        count: the number of slots.
        nbytes: the bytes of each slot.
        why: what decided ``count``, for the error when ``/dev/shm`` has no room.

    Raises:
        SharedMemoryError: ``/dev/shm`` has no room for ``count × nbytes``.
    """

    def __init__(self, count: int, nbytes: int, why: str = "") -> None:
        self.count, self.nbytes = count, nbytes
        room = free_shared_memory()
        if room is not None and count * nbytes > room:
            raise no_room(count, nbytes, f"{SHARED_MEMORY} has {format_size(room)} free", why)
        try:  # straight into shared memory, reserved whole
            storage = torch.empty(0, dtype=torch.uint8)._typed_storage()._new_shared(count * nbytes)
        except RuntimeError as exc:
            if "shared memory" not in str(exc):
                raise
            raise no_room(count, nbytes, str(exc), why) from exc
        self.memory = torch.empty(0, dtype=torch.uint8).new(storage).view(count, nbytes)
        self.stamps = torch.zeros((count, 2), dtype=torch.int64).share_memory_()

    def check(self, slot: int, generation: int, column: int, doing: str) -> None:
        """Raise unless slot ``slot``'s ``column`` stamp is ``generation``: a bug, shown as one."""
        found = int(self.stamps[slot, column])
        if found != generation:
            what = "leased to" if column == LEASED else "holding the payloads of"
            raise RuntimeError(f"fastload: payload slot {slot} is {what} generation {found}, not {generation}, "
                               f"while {doing}; a slot was reused while in use (a bug in fastload: please "
                               "report it; DataLoader(..., num_workers=0) avoids the slots)")

    def fill(self, slot: int, generation: int, payloads: list[Any], offsets: np.ndarray) -> None:
        """Copy ``payloads`` back to back into slot ``slot`` (in a worker), leased to ``generation``."""
        self.check(slot, generation, LEASED, "a worker fills it")
        flat = self.memory[slot].numpy()
        for k, payload in enumerate(payloads):
            flat[offsets[k]:offsets[k + 1]] = np.frombuffer(payload, dtype=np.uint8)
        self.check(slot, generation, LEASED, "a worker filled it")  # not released meanwhile
        self.stamps[slot, FILLED] = generation


def free_shared_memory() -> int | None:
    """Bytes free in ``/dev/shm`` now (None where it cannot be read)."""
    try:
        stats = os.statvfs(SHARED_MEMORY)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def no_room(count: int, nbytes: int, found: str, why: str) -> SharedMemoryError:
    """The error for payload slots that do not fit in shared memory, with the ways out."""
    because = f" ({why})" if why else ""
    return SharedMemoryError(
        f"backend='nvimgcodec': its payload slots need {count} × {format_size(nbytes)} = "
        f"{format_size(count * nbytes)} of shared memory{because}, taken whole when the worker processes "
        f"start, and {found}; give {SHARED_MEMORY} more room (a container: docker run --shm-size=...), "
        "or lower num_workers or prefetch_factor, or pass num_workers=0 (no slots, no worker processes)")


class Lease:
    """One slot leased to one GPU part, in the training process; released once (explicitly, or
    when the last reference to it goes: a part dropped mid-pipeline), after the event nothing
    reads the slot after, if one was recorded."""

    def __init__(self, pool: PayloadPool, slot: int, generation: int) -> None:
        self.pool, self.slot, self.generation = pool, slot, generation
        self._after: list[Any] = [None]  # the decode's event, once recorded
        self._release = weakref.finalize(self, pool._release, slot, generation, self._after)
        self._release.atexit = False

    def payloads(self, nbytes: int) -> np.ndarray:
        """The first ``nbytes`` of the slot, which a worker filled for this lease."""
        self.pool.slots.check(self.slot, self.generation, FILLED, "the training process reads it")
        return self.pool.slots.memory[self.slot, :nbytes].numpy()

    def read_until(self, event: Any) -> None:
        """Nothing reads the slot once ``event`` (a CUDA event of the decode) has completed."""
        self._after[0] = event

    def release(self) -> None:
        """Give the slot back (once; later calls do nothing)."""
        self._release()


class PayloadPool:
    """The training process's side of the slots: leases, releases and counts.

    Args:
        count: the number of slots (at least what can be in flight, or parts take fresh buffers).
        nbytes: the bytes of each slot (a part bigger than that takes a fresh buffer).

    Attributes:
        counts: parts ``"pooled"`` (in a slot), and those in a fresh buffer because no slot was
            free (``"no_slot"``) or the part was bigger than a slot (``"oversize"``).
    """

    def __init__(self, count: int, nbytes: int, why: str = "") -> None:
        self.slots = SlotBuffers(count, nbytes, why)
        self.counts = {"pooled": 0, "no_slot": 0, "oversize": 0}
        self._lock = threading.RLock()  # a lease freed by the cycle collector may release inside lease()
        self._free = deque(range(count))
        self._generation = 0
        self._dispatched: dict[int, int] = {}  # slot → generation, leased to parts not received yet

    @classmethod
    def sized_for(cls, dataset: Any, batch_size: int, count: int, why: str = "") -> PayloadPool:
        """``count`` slots, each half again a whole batch of ``dataset``'s mean record (a GPU part
        is at most a batch; a bigger one takes a fresh buffer)."""
        mean = float(np.mean(dataset.index.size)) if len(dataset.index.size) else 0.0
        nbytes = max(PAGE, -(-int(1.5 * batch_size * mean) // PAGE) * PAGE)
        return cls(count, nbytes, why)

    def lease(self) -> tuple[int, int]:
        """A free slot and its new generation for a part handed out now; ``(-1, 0)`` when none is free."""
        with self._lock:
            if not self._free:
                self.counts["no_slot"] += 1
                return -1, 0
            slot = self._free.popleft()
            self._generation += 1
            self.slots.stamps[slot, FILLED] = 0
            self.slots.stamps[slot, LEASED] = self._generation
            self._dispatched[slot] = self._generation
            return slot, self._generation

    def received(self, slot: int, generation: int, counted: str | None) -> Lease:
        """The part leased ``slot`` has come back: its lease. ``counted``: ``"pooled"`` (filled),
        ``"oversize"`` (in a fresh buffer), or None (a part's error)."""
        with self._lock:
            if self._dispatched.pop(slot, None) != generation:
                raise RuntimeError(f"fastload: a part came back with payload slot {slot} generation {generation}, "
                                   "which was not handed out (a bug in fastload: please report it)")
            if counted is not None:
                self.counts[counted] += 1
        return Lease(self, slot, generation)

    def reclaim_dispatched(self) -> None:
        """Release the slots of parts handed out but never received (an epoch given up): call
        only once the workers are done with them (torch's loader has reset for the next epoch)."""
        with self._lock:
            dispatched, self._dispatched = self._dispatched, {}
        for slot, generation in dispatched.items():
            self._release(slot, generation, [None])

    def free(self) -> int:
        """Slots free now."""
        with self._lock:
            return len(self._free)

    def _release(self, slot: int, generation: int, after: list[Any]) -> None:
        if after[0] is not None:
            after[0].synchronize()  # the GPU's decode has read the slot
        with self._lock:
            self.slots.check(slot, generation, LEASED, "the training process releases it")
            self.slots.stamps[slot, LEASED] = 0
            self._free.append(slot)
