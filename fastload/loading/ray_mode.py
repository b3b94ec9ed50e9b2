"""mode="ray": the sampler's key batches decoded by actors on a Ray cluster, delivered in order.

    sampler keys ─► batches of keys ─► actor.decode (a node's CPUs: read, decode, collate)
                 ─► object store ─► this process: one copy into pinned (or own) memory ─► device

Nothing here decides what a batch holds: the sampler does, as in every mode, so the batches, their
order and ``state_dict()`` are the threads mode's. What this mode adds is where the work runs and
that none of it is lost: a batch whose actor (or node) is lost is sent again to another actor and
still delivered in its place (``ray_pass``). The actors (``ray_pool``) are kept across passes, lent
to this process's other loaders between them (``ray_lending``), and elastic with
``ray_min_workers`` (``ray_scaling``); with ``ray_local_workers`` some of them decode on this
machine's own node. Every call on Ray goes through ``ray_session``: none starts Ray, and a Ray
shut down mid-pass is an error in the loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from fastload.loading.ray_connect import connect
from fastload.loading.ray_pass import Flight, RayPass
from fastload.loading.ray_pool import ActorPool
from fastload.loading.ray_scaling import bounds
from fastload.loading.ray_session import RayCalls


class RayDecode:
    """The tail of ``DataLoader(mode="ray", num_workers=N)``: ``N`` decode actors, started at the
    first iteration and kept across epochs (as persistent workers are), each asking for
    ``ACTOR_CPUS`` of the cluster, spread over its nodes.

    Args:
        dataset: a map-style dataset the actors can open (a PackedDataset at a path every node
            sees, or a store URL).
        backend: must be ``"torch"``: the actors run the CPU pipeline.
        collate_fn, batched: the loader's; batches are made whole on the actors.
        num_workers: decode actors (the most, with ``min_workers``).
        min_workers: the fewest: the actors start this many, more are started while the loop
            waits on them and idle ones are retired (see :mod:`~fastload.loading.ray_scaling`);
            None keeps ``num_workers`` all along.
        local_workers: of the actors, this many run on this process's own Ray node (local decode:
            its cores, batches through its shared memory), the first started and never retired
            (at most the fewest actors); the others wherever the cluster has CPUs.
        prefetch_factor: batches in flight per actor (``num_workers * prefetch_factor`` in all).
        pin_memory: batches are copied out of the object store into pinned memory.
        in_order: deliver in the sampler's order (else as they come).
        address: the cluster (see :func:`fastload.loading.ray_connect.connect`).
        batch_size, device, mean, std: the loader's; the sampler makes the batches, and the
            loader's DeviceFeed moves and normalises them, as in the local modes.
    """

    on_device = False  # the loader's DeviceFeed moves (and normalises) the batches

    def __init__(self, dataset: Any, *, backend: str, collate_fn: Any, batched: bool, num_workers: int,
                 prefetch_factor: int | None, pin_memory: bool, in_order: bool, address: str | None,
                 min_workers: int | None = None, local_workers: int = 0, batch_size: int | None = None,
                 device: Any = None, mean: Any = None, std: Any = None) -> None:
        if backend != "torch":
            raise ValueError(f"mode='ray' with backend={backend!r}: the decode actors run the CPU "
                             "pipeline (backend='torch'); use one or the other")
        if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__getitem__"):
            raise ValueError(f"mode='ray': {type(dataset).__name__} is not a map-style dataset; the "
                             "actors fetch batches of the sampler's indices, which needs __getitem__")
        if not batched:
            raise ValueError("mode='ray' with batch_size=None: the actors make whole batches; pass a batch_size")
        low, high = bounds(min_workers, num_workers)
        if isinstance(local_workers, bool) or not isinstance(local_workers, int) or not 0 <= local_workers <= low:
            raise ValueError(f"ray_local_workers={local_workers!r} with num_workers={num_workers} and ray_min_workers="
                             f"{min_workers!r}: give an int from 0 to {low} (the actors kept on this machine "
                             "are never retired, so they are at most the fewest actors)")
        self.calls = RayCalls(connect(address))
        self.pool = ActorPool(self.calls, dataset, collate_fn, low=low, high=high, local_workers=local_workers)
        self.in_order = in_order
        self.pin = pin_memory and torch.cuda.is_available()  # as torch's: no CUDA, nothing to pin for
        self.depth = num_workers * (prefetch_factor or 2)  # at the most actors; fewer queue more each

    @property
    def actors(self) -> list[Any]:
        """The decode actors started and taking batches now."""
        return self.pool.actors

    def batches(self, key_batches: Iterable[Sequence[Any]]) -> Iterator[Any]:
        """Each batch of keys as the threads mode makes it, on the CPU, in order."""
        if self.calls.renew():  # Ray was started again since the last pass: its actors went with the old one
            self.pool.forget()
        flight = Flight(self.pool, iter(key_batches), depth=self.depth, in_order=self.in_order, pin=self.pin)
        try:  # the pass counts as running from here: this process's other loaders leave its actors alone
            self.pool.start()
        except BaseException:
            flight.done = True
            raise
        return RayPass(flight)

    def start(self, wait: bool = False) -> None:
        """Start the actors if none runs (the first iteration does); with ``wait``, return once
        every one has started (or was replaced): a benchmark's warm-up, a test's known state."""
        self.pool.start(wait)

    def close(self) -> None:
        """Stop every actor (a later iteration starts new ones)."""
        self.pool.close()

    def __del__(self) -> None:
        # No module global here: at interpreter exit they may be gone (and Ray ends the job's actors).
        try:
            if self.calls.ray.is_initialized():
                self.close()
        except Exception:  # noqa: BLE001, S110 - nothing to tell at exit
            pass
