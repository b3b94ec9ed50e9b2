"""mode="ray": the sampler's key batches decoded by actors on a Ray cluster, delivered in order.

    sampler keys ─► batches of keys ─► actor.decode (a node's CPUs: read, decode, collate)
                 ─► object store ─► this process: one copy into pinned (or own) memory ─► device

Nothing here decides what a batch holds: the sampler does, as in every mode, so the batches, their
order and ``state_dict()`` are the threads mode's. What this module adds is where the work runs and
that none of it is lost: a batch whose actor (or node) is lost is sent again to another actor and
still delivered in its place. With ``ray_min_workers`` the actors are elastic: started while the
loop waits, retired when idle (``ray_scaling`` decides how many; only an actor holding no batch
is ended, so none is lost or moved). With ``ray_local_workers`` some of them decode on this
machine's own node (its cores, no network) beside those elsewhere.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from fastload.loading.prefetch import ThreadPrefetcher
from fastload.loading.ray_actor import CONTROL, DecodeActor, to_tensors
from fastload.loading.ray_connect import connect
from fastload.loading.ray_scaling import WINDOW, Seen, bounds, target

ACTOR_CPUS = 1  # what each decode actor asks of the cluster; it decodes with as many threads
TRIES = 3  # a batch lost with this many actors in a row is an error, not a lost node
HANDOVER = 2  # batches copied out of the object store ahead of the loop, in a background thread
START_WAIT_S = 600.0  # no actor at all started within this: the cluster cannot place one; say so
POLL_S = 0.2  # how often a pass waiting on its actors looks whether it was given up
DROP_WAIT_S = 10.0  # a pass given up waits this long at most for its actors to note it


@dataclass
class _Job:
    """One batch of keys sent to one actor."""

    keys: list[Any]
    actor: Any
    ref: Any
    tries: int = 1


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
        self.ray = connect(address)
        self.dataset, self.collate_fn = dataset, collate_fn
        self.in_order = in_order
        self.pin = pin_memory and torch.cuda.is_available()  # as torch's: no CUDA, nothing to pin for
        self.depth = num_workers * (prefetch_factor or 2)  # at the most actors; fewer queue more each
        self.low, self.high = bounds(min_workers, num_workers)
        if isinstance(local_workers, bool) or not isinstance(local_workers, int) or not 0 <= local_workers <= self.low:
            raise ValueError(f"ray_local_workers={local_workers!r} with num_workers={num_workers} and ray_min_workers="
                             f"{min_workers!r}: give an int from 0 to {self.low} (the actors kept on this machine "
                             "are never retired, so they are at most the fewest actors)")
        self.local_workers = local_workers
        self.local: set[Any] = set()  # the actors (starting or started) placed on this process's node
        self.policy = partial(target, low=self.low, high=self.high)  # (recent, actors) → actors wanted
        self.recent: deque[Seen] = deque(maxlen=WINDOW)
        self.retiring: list[Any] = []  # given no new batch; ended once none of theirs is in flight
        self.retired = 0  # actors retired as idle
        self.actors: list[Any] = []  # started, dataset open
        self.nodes: dict[Any, str] = {}  # actor → the id of the node it runs on
        self.starting: dict[Any, Any] = {}  # ready() call → actor
        self.replaced = 0  # actors lost and replaced
        self.resent = 0  # batches sent again because their actor was lost
        self.cancelled = 0  # batches of passes given up, still at the actors when they were
        self.passes = itertools.count()  # each pass's id: the actors drop a given-up pass's batches
        self._remote: Any = None
        self._dataset_ref: Any = None
        # A pass broken off still finishes its batch in its prefetch thread while the next pass runs:
        # the pool (actors, starting, retiring, recent) changes under this lock only.
        self._pool_lock = threading.RLock()

    def batches(self, key_batches: Iterable[Sequence[Any]]) -> Iterator[Any]:
        """Each batch of keys as the threads mode makes it, on the CPU, in order."""
        self.start()
        return _Pass(_Flight(self, iter(key_batches)))

    # --- the actors --------------------------------------------------------------------------------

    def start(self, wait: bool = False) -> None:
        """Start the actors if none runs (the first iteration does); with ``wait``, return once
        every one has started (or was replaced): a benchmark's warm-up, a test's known state."""
        with self._pool_lock:
            if not self.actors and not self.starting:
                self._start(self.low)
            while wait and self.starting:
                self._admit(wait=True)

    def _start(self, count: int) -> None:
        """Start ``count`` actors: on this node while fewer than ``local_workers`` are, else spread."""
        if self._remote is None:
            self._remote = self.ray.remote(num_cpus=ACTOR_CPUS, max_restarts=0, scheduling_strategy="SPREAD",
                                           concurrency_groups={CONTROL: 1})(DecodeActor)
            self._dataset_ref = self.ray.put(self.dataset)  # pickled once for every actor
        for _ in range(count):
            here = len(self.local) < self.local_workers
            remote = self._remote.options(scheduling_strategy=self._here()) if here else self._remote
            actor = remote.remote(self._dataset_ref, self.collate_fn, ACTOR_CPUS)
            self.starting[actor.ready.remote()] = actor
            if here:
                self.local.add(actor)

    def _here(self) -> Any:
        """The scheduling that keeps an actor on this process's node, which must have the CPUs."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = self.ray.get_runtime_context().get_node_id()
        cpus = next((n["Resources"].get("CPU", 0) for n in self.ray.nodes() if n["NodeID"] == node and n["Alive"]), 0)
        if cpus < self.local_workers * ACTOR_CPUS:
            raise ValueError(f"ray_local_workers={self.local_workers}: this machine's Ray node has {cpus:g} CPU(s) for "
                             f"actors and each asks for {ACTOR_CPUS}; start it with more (ray start --num-cpus=N) "
                             "or lower ray_local_workers")
        return NodeAffinitySchedulingStrategy(node_id=node, soft=False)

    def pick(self, jobs: Iterable[_Job]) -> Any:
        """The started actor with the fewest batches of ``jobs`` (waiting for one to start if none has)."""
        with self._pool_lock:
            self._admit(wait=not self.actors)
            load = Counter(job.actor for job in jobs)
            return min(self.actors, key=lambda actor: load[actor])

    def _admit(self, wait: bool) -> None:
        """Move the actors that have started into the pool; with ``wait``, until one has."""
        ray = self.ray
        while self.starting:
            done, _ = ray.wait(list(self.starting), num_returns=1, timeout=START_WAIT_S if wait else 0)
            if not done:
                if wait:
                    raise RuntimeError(f"mode='ray': none of the decode actors started within {START_WAIT_S:.0f} s; "
                                       f"each asks for {ACTOR_CPUS} CPU and the cluster has "
                                       f"{ray.available_resources().get('CPU', 0)} free of "
                                       f"{ray.cluster_resources().get('CPU', 0)}: add nodes or lower num_workers")
                return
            actor = self.starting.pop(done[0])
            try:
                node = ray.get(done[0])
            except ray.exceptions.RayActorError as exc:
                if getattr(exc, "actor_init_failed", False):
                    raise RuntimeError(f"mode='ray': a decode actor could not open the dataset on its node "
                                       f"({exc}); the dataset must be at a path every node sees, or a "
                                       "store URL") from exc
                self.local.discard(actor)
                self.replaced += 1  # its node went while it started
                self._start(1)
                continue
            self.actors.append(actor)
            self.nodes[actor] = node
            wait = False

    def scale(self, jobs: Sequence[_Job], waited: float | None) -> None:
        """After each batch handed over (``jobs``: those still in flight; ``waited``: the share of
        the loop's time per batch it spent waiting for a batch, None when it has not taken one
        since the last call): end the retired actors
        that hold no batch any more, and start or retire actors to the policy's count."""
        with self._pool_lock:
            held = {job.actor for job in jobs}
            for actor in [actor for actor in self.retiring if actor not in held]:
                self.retiring.remove(actor)
                self._kill(actor)
            if self.low == self.high or waited is None:
                return
            self._admit(wait=False)
            if self.starting:  # decide on batches decoded by every actor asked for
                self.recent.clear()
                return
            refs = [job.ref for job in jobs]
            done = set(self.ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
            busy = {job.actor for job in jobs if job.ref not in done}
            self.recent.append(Seen(waited, sum(actor not in busy for actor in self.actors)))
            count = len(self.actors)
            wanted = self.policy(list(self.recent), count)
            if wanted != count:
                self.recent.clear()
            if wanted > count:
                self._start(wanted - count)  # used once they run (pick admits them)
            for _ in range(count - wanted):
                self._retire(jobs)

    def _retire(self, jobs: Sequence[_Job]) -> None:
        """The actor holding the fewest of ``jobs`` gets no new batch; its own are still delivered
        in their place, and it is ended (by ``scale``) once none is in flight."""
        load = Counter(job.actor for job in jobs)
        elsewhere = [actor for actor in self.actors if actor not in self.local]
        if not elsewhere:  # only this node's: kept (the policy keeps at least local_workers)
            return
        actor = min(elsewhere, key=lambda actor: load[actor])
        self.actors.remove(actor)
        self.nodes.pop(actor, None)
        self.retiring.append(actor)
        self.retired += 1

    def lost(self, actor: Any) -> None:
        """``actor`` (or its node) is gone: a new one is started in its place, used once it runs."""
        with self._pool_lock:
            if actor in self.retiring:  # its batches go to the others; none replaces it
                self.retiring.remove(actor)
            if actor in self.actors:
                self.actors.remove(actor)
                self.nodes.pop(actor, None)
                self.local.discard(actor)  # its replacement goes where it was wanted
                self.replaced += 1
                self._kill(actor)
                self._start(1)

    def close(self) -> None:
        """Stop every actor (a later iteration starts new ones)."""
        for actor in [*self.actors, *self.starting.values(), *self.retiring]:
            self._kill(actor)
        self.actors, self.starting, self.nodes, self.retiring, self.local = [], {}, {}, [], set()

    def _kill(self, actor: Any) -> None:
        with contextlib.suppress(Exception):  # already dead, or Ray already shut down
            self.ray.kill(actor, no_restart=True)

    def __del__(self) -> None:
        # No module global here: at interpreter exit they may be gone (and Ray ends the job's actors).
        try:
            if self.ray.is_initialized():
                self.close()
        except Exception:  # noqa: BLE001, S110 - nothing to tell at exit
            pass


class _Flight:
    """One pass: keeps up to ``depth`` batches at the actors and hands them over in order.

    An iterator object, not a generator: a batch whose decoding raised (a damaged record) raises
    in its place, and the next ``next()`` carries on with the following batch, as torch's does.
    A pass given up (``given_up``: the loop broke off, its iterator was dropped) takes back its
    batches the actors have not started, so that the next pass's do not queue behind them.
    """

    def __init__(self, pool: RayDecode, key_batches: Iterator[Sequence[Any]]) -> None:
        self.pool, self.key_batches = pool, key_batches
        self.jobs: deque[_Job] = deque()  # in the sampler's order
        self.exhausted = False
        # The loop's waits, each a share of its time per batch: measured where the loop takes its
        # batches (``_Pass``), not here, in the thread that runs ahead of it and waits when the loop does not.
        self.loop_waited: deque[float] = deque()
        self.given_up = threading.Event()
        self.id = next(pool.passes)

    def __iter__(self) -> _Flight:
        return self

    def __next__(self) -> Any:
        ray = self.pool.ray
        self._submit()
        if not self.jobs:
            raise StopIteration
        while True:
            job = self._next_done()
            if job is None:  # given up: nothing more is delivered
                self._cancel()
                raise StopIteration
            try:
                batch = ray.get(job.ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
                self._resend(job.actor, exc)  # every batch it held, to the others
                continue
            except ray.exceptions.RayTaskError as exc:
                self.jobs.remove(job)
                raise exc.as_instanceof_cause() from None  # the dataset's own error, with the actor's traceback
            self.jobs.remove(job)
            self.pool.scale(self.jobs, None)  # the retired actors' last batches may be out
            while self.loop_waited:
                self.pool.scale(self.jobs, self.loop_waited.popleft())
            return to_tensors(batch, self.pool.pin)

    def _submit(self) -> None:
        while not self.exhausted and not self.given_up.is_set() and len(self.jobs) < self.pool.depth:
            try:
                keys = list(next(self.key_batches))
            except StopIteration:
                self.exhausted = True
                return
            actor = self.pool.pick(self.jobs)
            self.jobs.append(_Job(keys, actor, actor.decode.remote(keys, self.id)))

    def _next_done(self) -> _Job | None:
        """The next batch to hand over once it is decoded (the oldest, or with ``in_order=False``
        the first done), or None when the pass is given up meanwhile."""
        jobs = [self.jobs[0]] if self.pool.in_order else list(self.jobs)
        while not self.given_up.is_set():
            done, _ = self.pool.ray.wait([job.ref for job in jobs], num_returns=1, timeout=POLL_S)
            if done:
                return next(job for job in jobs if job.ref == done[0])
        return None

    def _cancel(self) -> None:
        """Give back every batch still at the actors: those queued are never made (one being made
        is finished; its result dropped)."""
        ray = self.pool.ray
        drops = [actor.drop.options(concurrency_group=CONTROL).remote(self.id)
                 for actor in {job.actor for job in self.jobs}]
        with contextlib.suppress(Exception):  # an actor gone: nothing of it to drop
            if drops:
                ray.wait(drops, num_returns=len(drops), timeout=DROP_WAIT_S)
        self.pool.cancelled += len(self.jobs)
        self.jobs.clear()
        self.exhausted = True

    def _resend(self, dead: Any, exc: Exception) -> None:
        self.pool.lost(dead)
        for job in self.jobs:
            if job.actor != dead:
                continue
            if job.tries >= TRIES:
                shown = ", ".join(str(key[0] if isinstance(key, tuple) else key) for key in job.keys[:8])
                raise RuntimeError(f"mode='ray': the batch of records {shown}{', …' if len(job.keys) > 8 else ''} "
                                   f"was lost with {TRIES} decode actors in a row (the last: {exc}); a record "
                                   "that crashes or exhausts the process decoding it? Run this epoch with "
                                   "mode='threads' to see the error") from exc
            job.tries += 1
            self.pool.resent += 1
            job.actor = self.pool.pick(self.jobs)
            job.ref = job.actor.decode.remote(job.keys, self.id)


class _Pass(ThreadPrefetcher):
    """A pass's batches copied out of the object store ``HANDOVER`` ahead of the loop, in a
    thread; the loop's wait for each is noted for the elastic actors; closing it (the loader's
    iterator does when dropped) gives the pass up."""

    def __init__(self, flight: _Flight) -> None:
        self.flight = flight
        self.taken: float | None = None  # when the loop took its last batch
        super().__init__(flight, HANDOVER)

    def __next__(self) -> Any:
        asked = time.perf_counter()
        try:
            return super().__next__()
        finally:
            got = time.perf_counter()
            if self.taken is not None:  # the pass's first batch waits for the actors' start: not a rate
                self.flight.loop_waited.append((got - asked) / max(got - self.taken, 1e-9))
            self.taken = got

    def close(self) -> None:
        self.flight.given_up.set()
        super().close()

    def _given_up(self) -> None:
        self.flight._cancel()

    def __del__(self) -> None:
        self.close()
