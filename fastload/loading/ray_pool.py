"""mode="ray": one loader's decode actors: started and placed, admitted once they run, scaled,
replaced when lost (a lost node's actors together), lent to this process's other loaders between
passes, ended.

    start ─► starting (ready() in flight) ─► actors (picked for batches) ─► retiring ─► ended
                 │ no CPU for seconds: this process's idle loaders make room, or an error names
                 │ who holds the CPUs                      lost ─► replaced (used once it runs)
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import weakref
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

from fastload.loading import ray_lending as lending
from fastload.loading import ray_placement as placement
from fastload.loading.ray_actor import ACTOR_CPUS, CONTROL, DecodeActor
from fastload.loading.ray_placement import NOTICE_S, SLOW_S, START_WAIT_S
from fastload.loading.ray_scaling import WINDOW, Seen, target
from fastload.loading.ray_session import RayCalls


class ActorPool:
    """The decode actors of one ``DataLoader(mode="ray")``, each asking for ``ACTOR_CPUS`` of the
    cluster, spread over its nodes; kept across passes (as persistent workers are).

    Args:
        calls: the Ray this loader joined.
        dataset, collate_fn: what every actor opens and batches with.
        low, high: the fewest and most actors (equal: no scaling; see ``ray_scaling``).
        local_workers: of the actors, this many on this process's own node, never retired.
    """

    def __init__(self, calls: RayCalls, dataset: Any, collate_fn: Any, *, low: int, high: int,
                 local_workers: int) -> None:
        self.calls, self.dataset, self.collate_fn = calls, dataset, collate_fn
        self.low, self.high, self.local_workers = low, high, local_workers
        self.policy = partial(target, low=low, high=high)  # (recent, actors) → actors wanted
        self.recent: deque[Seen] = deque(maxlen=WINDOW)
        self.actors: list[Any] = []  # started, dataset open
        self.nodes: dict[Any, str] = {}  # actor (started or retiring) → the id of its node
        self.starting: dict[Any, Any] = {}  # ready() call → actor
        self.retiring: list[Any] = []  # given no new batch; ended once none of theirs is in flight
        self.local: set[Any] = set()  # the actors (starting or started) placed on this process's node
        self.deferred = 0  # actors to start anywhere once this node's own run: else one may take its CPU first
        self.replaced = self.retired = self.resent = self.cancelled = 0
        self.flights: weakref.WeakSet[Any] = weakref.WeakSet()  # this loader's passes (running while not done)
        self.digest: bytes | None = None  # of what the actors are given: equal, another loader's serve this one
        self._remote: Any = None
        self._dataset_ref: Any = None
        # A pass broken off still finishes its batch in its prefetch thread while the next pass runs,
        # and another loader may take idle actors: the pool changes under this lock only.
        self.lock = threading.RLock()
        lending.register(self)

    def running(self) -> bool:
        """Whether a pass of this loader is under way (its actors are not to be lent)."""
        return any(not flight.done for flight in list(self.flights))

    def ending(self) -> bool:
        """Whether every pass under way was given up (the loop dropped it): idle in a moment."""
        return all(flight.done or flight.given_up.is_set() for flight in list(self.flights))

    def start(self, wait: bool = False) -> None:
        """Start the actors missing from the fewest (the first pass starts them all): taken from this
        process's idle loaders of the same dataset first. With ``wait``, return once every one has
        started (or was replaced): a benchmark's warm-up, a test's known state."""
        with self.lock:
            missing = self.low - len(self.actors) - len(self.starting) - self.deferred
            if missing > 0:
                if self.digest is None:
                    self.digest = hashlib.blake2b(self.calls.ray.cloudpickle.dumps((self.dataset, self.collate_fn))).digest()
                missing -= lending.adopt(self, missing)
                lending.make_room(self, missing)
                self._start(missing)
            while wait and (self.starting or self.deferred):
                self._admit(wait=True)

    def _start(self, count: int) -> None:
        """Start ``count`` actors: on this node while fewer than ``local_workers`` are (the others
        once those run), else spread over the cluster."""
        if count <= 0:
            return
        if self._remote is None:
            self._remote = self.calls.ray.remote(num_cpus=ACTOR_CPUS, max_restarts=0, scheduling_strategy="SPREAD",
                                                 concurrency_groups={CONTROL: 1})(DecodeActor)
            self._dataset_ref = self.calls.put(self.dataset)  # pickled once for every actor
        here = min(count, self.local_workers - len(self.local))
        if here > 0:  # this node's own first; the others once they run (_admit)
            self.deferred += count - here
        placed = self._remote.options(scheduling_strategy=self._here()) if here > 0 else None
        for k in range(count if here <= 0 else here):
            actor = self.calls.call(placed if k < here else self._remote, self._dataset_ref, self.collate_fn,
                                    ACTOR_CPUS)
            self.starting[self.calls.call(actor.ready)] = actor
            if k < here:
                self.local.add(actor)

    def _here(self) -> Any:
        """The scheduling that keeps an actor on this process's node, which must have the CPUs."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node = self.calls.node_id()
        cpus = next((n["Resources"].get("CPU", 0) for n in self.calls.nodes() if n["NodeID"] == node and n["Alive"]), 0)
        if cpus < self.local_workers * ACTOR_CPUS:
            raise ValueError(f"ray_local_workers={self.local_workers}: this machine's Ray node has {cpus:g} CPU(s) for "
                             f"actors and each asks for {ACTOR_CPUS}; start it with more (ray start --num-cpus=N) "
                             "or lower ray_local_workers")
        return NodeAffinitySchedulingStrategy(node_id=node, soft=False)

    def pick(self, jobs: Iterable[Any], avoid: set[str] | frozenset[str] = frozenset()) -> Any:
        """The started actor with the fewest batches of ``jobs``, off the nodes ``avoid`` while
        another has one (waiting for one to start if none has)."""
        with self.lock:
            if not self.actors and not self.starting and not self.deferred:  # given to another loader meanwhile
                self._start(self.low)
            self._admit(wait=not self.actors)
            load = Counter(job.actor for job in jobs)
            choice = [actor for actor in self.actors if self.nodes.get(actor) not in avoid] or self.actors
            return min(choice, key=lambda actor: load[actor])

    def _admit(self, wait: bool) -> None:
        """Move the actors that have started into the pool; with ``wait``, until one has (saying
        why, when none starts: see :mod:`~fastload.loading.ray_placement`)."""
        checks = iter(((NOTICE_S, placement.unplaced), (SLOW_S, placement.slow), (START_WAIT_S, placement.none_started)))
        until, check = next(checks)
        waited = 0.0
        while self.starting or self.deferred:
            if self.deferred and not self.local & set(self.starting.values()):
                count, self.deferred = self.deferred, 0
                self._start(count)
                continue
            done, _ = self.calls.wait(list(self.starting), num_returns=1, timeout=until - waited if wait else 0)
            if not done:
                if not wait:
                    return
                waited = until
                check(self)  # the last one raises
                until, check = next(checks)
                continue
            actor = self.starting.pop(done[0])
            try:
                node = self.calls.get(done[0])
            except self.calls.exceptions.RayActorError as exc:
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

    def scale(self, jobs: Sequence[Any], waited: float | None) -> None:
        """After each batch handed over (``jobs``: those still in flight; ``waited``: the share of
        the loop's time per batch it spent waiting for a batch, None when it has not taken one
        since the last call): end the retired actors that hold no batch any more, and start or
        retire actors to the policy's count."""
        with self.lock:
            held = {job.actor for job in jobs}
            for actor in [actor for actor in self.retiring if actor not in held]:
                self.retiring.remove(actor)
                self._kill(actor)
            if self.low == self.high or waited is None:
                return
            self._admit(wait=False)
            if self.starting or self.deferred:  # decide on batches decoded by every actor asked for
                self.recent.clear()
                return
            refs = [job.ref for job in jobs]
            done = set(self.calls.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
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

    def _retire(self, jobs: Sequence[Any]) -> None:
        """The actor holding the fewest of ``jobs`` gets no new batch; its own are still delivered
        in their place, and it is ended (by ``scale``) once none is in flight."""
        load = Counter(job.actor for job in jobs)
        elsewhere = [actor for actor in self.actors if actor not in self.local]
        if not elsewhere:  # only this node's: kept (the policy keeps at least local_workers)
            return
        actor = min(elsewhere, key=lambda actor: load[actor])
        self.actors.remove(actor)
        self.retiring.append(actor)
        self.retired += 1

    def lost(self, actor: Any) -> tuple[set[Any], bool]:
        """``actor``'s call failed: it is gone, and with it every actor of this pool on its node when
        that node is gone too. Each is replaced by a new one, used once it runs (a retiring one is
        not). Returns the actors lost and whether their node was."""
        with self.lock:
            node = self.nodes.get(actor)
            node_gone = node is not None and not any(n["NodeID"] == node and n["Alive"] for n in self.calls.nodes())
            gone = {actor, *(other for other, on in self.nodes.items() if node_gone and on == node)}
            for each in gone:
                replace = each in self.actors
                if replace:
                    self.actors.remove(each)
                    self.replaced += 1
                elif each in self.retiring:  # its batches go to the others; none replaces it
                    self.retiring.remove(each)
                self.local.discard(each)  # its replacement goes where it was wanted
                self._kill(each)
                if replace:
                    self._start(1)
            return gone, node_gone

    def give_back(self, count: int | None = None) -> list[tuple[Any, str]]:
        """Hand over up to ``count`` (None: all) of this idle pool's started actors with their
        nodes, those off this process's node first; end its actors still starting or retiring.
        Called for another loader of this process; this one's next pass starts what it misses."""
        with self.lock:
            for actor in [*self.starting.values(), *self.retiring]:
                self._kill(actor)
            self.starting, self.retiring, self.deferred = {}, [], 0
            ordered = sorted(self.actors, key=lambda actor: actor in self.local)
            given = ordered[: len(ordered) if count is None else count]
            for actor in given:
                self.actors.remove(actor)
                self.local.discard(actor)
            return [(actor, self.nodes.pop(actor, "")) for actor in given]

    def adopt(self, given: list[tuple[Any, str]]) -> None:
        """Take another loader's started actors (decoding this pool's dataset the same way) as ours."""
        with self.lock:
            for actor, node in given:
                self.actors.append(actor)
                self.nodes[actor] = node

    def forget(self) -> None:
        """Ray was started again: this pool's actors and dataset went with the Ray that ended."""
        with self.lock:
            self.actors, self.starting, self.nodes, self.retiring, self.local = [], {}, {}, [], set()
            self._remote = self._dataset_ref = None
            self.deferred = 0

    def close(self) -> None:
        """End every actor (a later pass starts new ones)."""
        for actor, _ in self.give_back():
            self._kill(actor)

    def _kill(self, actor: Any) -> None:
        self.nodes.pop(actor, None)
        with contextlib.suppress(Exception):  # already dead, or Ray already shut down
            self.calls.kill(actor)
