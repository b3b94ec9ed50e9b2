"""The worker processes' side of a split batch: one persistent torch DataLoader makes both parts.

Each batch of the sampler's keys is cut in two (:mod:`fastload.backends.decode_split`). In the
worker processes, the CPU part is decoded as the torch backend decodes it, and the GPU part is
read and planned (:mod:`fastload.backends.planned_part`), so the training process only decodes it:
its Python threads leave the GIL to the training loop. One torch DataLoader, whose batch sampler
hands out tagged parts, serves both; the router gives each side its parts in the sampler's order,
whichever side asks first. A GPU part goes out with a payload slot leased to it, if one is free
(:mod:`fastload.backends.payload_slots`), and comes back with that slot's lease attached.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from typing import Any, Literal, NamedTuple

import torch

from fastload.backends.decode_split import DecodeSplit
from fastload.backends.payload_slots import PayloadPool
from fastload.backends.pipeline_stage import settle
from fastload.backends.planned_part import plan_part
from fastload.errors import CorruptRecordError
from fastload.samples.collate import collate_images, keep_skips

Side = Literal["cpu", "gpu"]


class Part(NamedTuple):
    """One side's share of one batch, as the workers' batch sampler hands it out (a GPU part with
    the payload slot leased to it and its lease's generation; -1: none)."""

    side: Side
    keys: list[Any]
    slot: int = -1
    generation: int = 0


class FailedPart(NamedTuple):
    """A CPU part a damaged record stopped (``on_error="raise"``): its error, naming the record,
    raised in the training process in the batch's place, as num_workers=0 raises it."""

    error: str

    def pin_memory(self) -> FailedPart:
        """Itself: nothing to pin."""
        return self


class TaggedParts:
    """The batch sampler of the workers' torch DataLoader: each batch's CPU part, then its GPU part.

    One object for the loader's life, so its worker processes persist across epochs; each epoch
    points it at that epoch's split (:meth:`start`). The parts it hands out are noted, in order,
    for the router: a worker's exception replaces a part without saying whose it was.

    Args:
        pool: the payload slots leased to GPU parts, if any.
    """

    def __init__(self, pool: PayloadPool | None = None) -> None:
        self.split: DecodeSplit | None = None
        self.sent: deque[Part] = deque()
        self.pool = pool

    def start(self, split: DecodeSplit) -> deque[Part]:
        """Hand out ``split``'s parts from the next iteration; returns where their sides are noted."""
        self.split, self.sent = split, deque()
        return self.sent

    def __iter__(self) -> Iterator[Part]:
        split, sent, pool = self.split, self.sent, self.pool  # this epoch's, whatever the next epoch sets
        if pool is not None:
            # torch runs this first after every worker has finished the earlier epoch's parts (its
            # reset waits for them): the slots of those it dropped unread are free to fill again.
            pool.reclaim_dispatched()
        b = 0
        while split is not None and (cut := split.cut(b)) is not None:
            for side, keys in (("cpu", cut.cpu), ("gpu", cut.gpu)):
                if keys:
                    slot, generation = pool.lease() if pool is not None and side == "gpu" else (-1, 0)
                    part = Part(side, keys, slot, generation)  # type: ignore[arg-type]
                    sent.append(part)
                    yield part
            b += 1


class PartMaker(torch.utils.data.Dataset):
    """The workers' dataset: a CPU part decoded and collated as the torch backend's batch, a GPU
    part read and planned (its payloads into its slot of ``pool``'s, if leased one). torch's
    fetcher calls ``__getitems__`` with the sampler's Part."""

    def __init__(self, dataset: Any, pool: PayloadPool | None = None) -> None:
        self.dataset = dataset
        self.slots = pool.slots if pool is not None else None  # shared memory, mapped before the workers start
        skip = dataset.on_error == "skip"  # each part carries its skips, as the loader's batches
        self.collate = keep_skips(collate_images) if skip else collate_images

    def __getitems__(self, part: Part) -> Any:
        if part.side == "cpu":
            try:
                return self.collate(self.dataset.__getitems__(part.keys))
            except CorruptRecordError as exc:  # not torch's "Caught ... in DataLoader worker" wrapper
                return FailedPart(str(exc))
        return plan_part(self.dataset, part.keys, skip=self.dataset.on_error == "skip", slots=self.slots,
                         slot=part.slot, generation=part.generation)

    def __getitem__(self, key: Any) -> Any:
        raise TypeError("PartMaker makes whole parts (__getitems__); its loader's batch sampler is TaggedParts")

    def __len__(self) -> int:
        return len(self.dataset)


def as_made(part: Any) -> Any:
    """The workers' collate_fn: a part comes out of :class:`PartMaker` finished."""
    return part


class WorkerParts:
    """The persistent torch DataLoader of the worker processes, and one epoch's router at a time.

    Args:
        dataset: the PackedDataset the parts are made of.
        num_workers, prefetch_factor: the loader's.
        pin_memory: pin the CPU parts (a GPU's batches); planned parts are never pinned.
        pool: payload slots for the GPU parts (made here, before the workers start); None: each
            part's payloads in a fresh buffer.
    """

    def __init__(self, dataset: Any, *, num_workers: int, prefetch_factor: int | None, pin_memory: bool,
                 pool: PayloadPool | None = None) -> None:
        self.pool = pool
        self.sampler = TaggedParts(pool)
        self.loader = torch.utils.data.DataLoader(
            PartMaker(dataset, pool), batch_sampler=self.sampler, num_workers=num_workers, collate_fn=as_made,
            pin_memory=pin_memory, persistent_workers=True, prefetch_factor=prefetch_factor)
        self._reading = threading.Lock()  # torch's iterator: one reader at a time, and no reset meanwhile
        # The epoch now read (a number: a router held here would make a reference cycle through
        # torch's iterator, and an iterator freed by the cycle collector waits 5 s per worker).
        self._epoch = 0

    def epoch(self, split: DecodeSplit) -> PartRouter:
        """The router of ``split``'s parts; a router of an earlier epoch reads no more."""
        with self._reading:
            sent = self.sampler.start(split)
            self._epoch += 1
            if self._epoch == 1:  # the first iterator forks the workers: not in the middle of a decode
                settle()
            return PartRouter(self, iter(self.loader), sent, self._epoch)

    def read(self, router: PartRouter) -> tuple[bool, Any] | None:
        """The next item of ``router``'s epoch: ``(True, part)``, ``(False, a worker's exception)``,
        or None when the epoch has ended, or was closed or followed by another."""
        with self._reading:
            if router.epoch != self._epoch or router.closed:
                return None
            try:
                read: tuple[bool, Any] = True, next(router.source)
            except StopIteration:
                return None
            except Exception as exc:  # noqa: BLE001 - a part's error, raised on its side in its place
                read = False, exc
            # Its lease attached before the next epoch's sampler may reclaim the slot: the part
            # is the first noted and not yet routed (one reader at a time).
            return self.received(read, router.noted())

    def received(self, read: tuple[bool, Any], part: Part) -> tuple[bool, Any]:
        """What came back for ``part``, with its payload slot's lease if its payloads are in it
        (otherwise the slot is released now: the worker is done with it)."""
        if self.pool is None or part.slot < 0:
            return read
        ok, item = read
        if not ok:
            # Perhaps not this part's own error (a worker that died): its slot stays out until
            # torch's reset for the next epoch has waited for every worker.
            return read
        if (item.slot, item.generation) != (part.slot, part.generation):
            raise RuntimeError(f"fastload: the part handed out with payload slot {part.slot} generation "
                               f"{part.generation} came back as slot {item.slot} generation {item.generation} "
                               "(a bug in fastload: please report it)")
        counted = None if item.error is not None else "pooled" if item.pooled else "oversize"
        lease = self.pool.received(part.slot, part.generation, counted)
        if not item.pooled:
            lease.release()
            return read
        return True, item._replace(lease=lease)


class PartRouter:
    """One epoch's parts to the side each belongs to, in the sampler's order.

    A side takes its next part; when none is waiting, it reads the loader on (one reader at a
    time, outside the lock the other side takes parts with), keeping the other side's parts it
    passes. A worker's exception is raised on the side whose part it replaced, in that part's place.
    """

    def __init__(self, owner: WorkerParts, source: Iterator[Any], sent: deque[Part], epoch: int = 0) -> None:
        self.owner = owner
        self.source = source
        self.epoch = epoch
        self.closed = False
        self._sent = sent
        self._waiting: dict[str, deque[tuple[bool, Any]]] = {"cpu": deque(), "gpu": deque()}
        self._changed = threading.Condition()
        self._reader = False  # a side is reading the loader now
        self._ended = False

    def take(self, side: Side) -> Any:
        """``side``'s next part; StopIteration when the epoch has no more."""
        waiting = self._waiting[side]
        while True:
            with self._changed:
                while not waiting and self._reader:
                    self._changed.wait()
                if waiting:
                    ok, item = waiting.popleft()
                    break
                if self._ended:
                    raise StopIteration
                self._reader = True
            read = None
            try:
                read = self.owner.read(self)
            finally:
                with self._changed:
                    self._reader = False
                    if read is None:
                        self._ended = True
                    else:
                        self._waiting[self._sent.popleft().side].append(read)
                    self._changed.notify_all()
                if self.closed:  # closed while it read: what it received goes back at once
                    self._let_go_waiting()
        if not ok:
            raise item
        return item

    def noted(self) -> Part:
        """The sampler's part whose item the reader has just received (routed next)."""
        return self._sent[0]

    def parts(self, side: Side) -> Iterator[Any]:
        """``side``'s parts, in order, until the epoch ends (or a part's error is raised)."""
        while True:
            try:
                part = self.take(side)
            except StopIteration:
                return
            yield part

    def close(self) -> None:
        """Read no more (a side inside a read finishes it), and give back the payload slots of the
        parts received and not taken (a pass given up, or ended by an error)."""
        self.closed = True
        self._let_go_waiting()

    def _let_go_waiting(self) -> None:
        with self._changed:
            dropped = [item for waiting in self._waiting.values() for ok, item in waiting if ok]
            for waiting in self._waiting.values():
                waiting.clear()
            self._changed.notify_all()
        for item in dropped:
            if getattr(item, "lease", None) is not None:
                item.lease.release()
