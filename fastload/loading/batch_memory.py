"""Memory for image batches built in the training process (the threads mode), recycled.

A 64×3×224×224 batch is 9.6 MB. Taken from malloc, such blocks end up in the heap of the
decode thread that made them (glibc raises its mmap threshold after the first free), where
freed batches stay as the process's memory: ~60 MB more peak memory than the batches in flight
need. Taken from a fresh mmap each time, every batch faults its pages in again while two decode
threads write it. So batches live in private anonymous mappings that go back to a small free
list when the batch tensor, and every view of it, is freed, and are reused from there. Such a
tensor is an ordinary CPU tensor except that ``resize_`` cannot grow it.
"""

from __future__ import annotations

import mmap
import os
import threading

import numpy as np
import torch

KEEP_FREE = 4  # free mappings kept, of any sizes (the oldest is unmapped first); ~38 MB at most
# for batches of 64×224²: in a steady loop a freed batch's mapping is taken again at once.


class _FreeList:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.free: list[mmap.mmap] = []

    def take(self, nbytes: int) -> mmap.mmap:
        with self.lock:
            for k in range(len(self.free) - 1, -1, -1):
                if len(self.free[k]) == nbytes:
                    return self.free.pop(k)
        # Private: a forked child writing a batch never reaches its parent's pages.
        return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)

    def give_back(self, memory: mmap.mmap) -> None:
        with self.lock:
            self.free.append(memory)
            unmapped = self.free[:-KEEP_FREE]
            del self.free[:-KEEP_FREE]
        for old in unmapped:
            old.close()

    def forget(self) -> None:
        """After a fork: the child starts with its own, empty list."""
        self.lock = threading.Lock()
        self.free = []


_free_list = _FreeList()
os.register_at_fork(after_in_child=_free_list.forget)


class _Lease:
    """One mapping lent to one batch; numpy's array over it keeps it, torch's tensor keeps the
    array, and the mapping goes back to the free list when the last of them is freed."""

    def __init__(self, memory: mmap.mmap, shape: tuple[int, ...]) -> None:
        self.memory = memory
        # Numpy reads this to build the array, with this object as the array's base.
        self.__array_interface__ = {"shape": shape, "typestr": "|u1", "version": 3,
                                    "data": (_address(memory), False)}

    def __del__(self) -> None:
        try:
            _free_list.give_back(self.memory)
        except Exception:  # noqa: BLE001 - interpreter exit: the mapping goes with the process
            pass


def _address(memory: mmap.mmap) -> int:
    view = np.frombuffer(memory, dtype=np.uint8)
    address = view.ctypes.data
    del view  # no export left: the mapping can still be closed when it is given back
    return address


def recycled_uint8(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised uint8 tensor of ``shape`` in recycled, page-aligned memory."""
    nbytes = int(np.prod(shape))
    if nbytes == 0:
        return torch.empty(shape, dtype=torch.uint8)
    return torch.from_numpy(np.asarray(_Lease(_free_list.take(nbytes), shape)))
