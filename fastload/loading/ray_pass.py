"""mode="ray": one pass: batches of keys kept at the actors, handed over in the sampler's order,
sent again when their actor (or its node) is lost, given back when the loop breaks off.

    key batches ─► jobs at the actors (depth) ─► the next one done ─► one copy out ─► HANDOVER ahead ─► loop
                         ▲ actor lost: its jobs (a lost node's: all of its actors' jobs) sent to others
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastload.errors import ClusterLostError
from fastload.loading.prefetch import ThreadPrefetcher
from fastload.loading.ray_actor import CONTROL, to_tensors

TRIES = 3  # a batch whose decoding this many actors died in, one after another, is an error
HANDOVER = 2  # batches copied out of the object store ahead of the loop, in a background thread
POLL_S = 0.2  # how often a pass waiting on its actors looks whether it was given up
DROP_WAIT_S = 10.0  # a pass given up waits this long at most for its actors to note it
# Process-wide, not per loader: an actor taken over from another loader (ray_lending) has that
# loader's given-up passes among those it drops.
_pass_ids = itertools.count()
_sends = itertools.count()


@dataclass
class Job:
    """One batch of keys sent to one actor (``sent``: the order the actors were sent jobs in)."""

    keys: list[Any]
    actor: Any
    ref: Any
    sent: int
    deaths: int = 0  # actors that died while this was the oldest of their jobs: while decoding it


class Flight:
    """One pass: keeps up to ``depth`` batches at the actors and hands them over in order.

    An iterator object, not a generator: a batch whose decoding raised (a damaged record) raises
    in its place, and the next ``next()`` carries on with the following batch, as torch's does.
    A pass given up (``given_up``: the loop broke off, its iterator was dropped) takes back its
    batches the actors have not started, so that the next pass's do not queue behind them. A pass
    whose Ray went away raises ClusterLostError, then again at every later ``next()``.
    """

    def __init__(self, pool: Any, key_batches: Iterator[Sequence[Any]], *, depth: int, in_order: bool,
                 pin: bool) -> None:
        self.pool, self.calls, self.key_batches = pool, pool.calls, key_batches
        self.depth, self.in_order, self.pin = depth, in_order, pin
        self.jobs: deque[Job] = deque()  # in the sampler's order
        self.exhausted = self.done = False
        self.lost: ClusterLostError | None = None
        self.suspect: set[str] = set()  # nodes an actor of this pass was lost on: resent batches go elsewhere
        self.suspects: set[Any] = set()  # the actors on those nodes then: their deaths count against no batch
        # The loop's waits, each a share of its time per batch: measured where the loop takes its
        # batches (``RayPass``), not here, in the thread that runs ahead of it and waits when the loop does not.
        self.loop_waited: deque[float] = deque()
        self.given_up = threading.Event()
        self.id = next(_pass_ids)
        pool.flights.add(self)

    def __iter__(self) -> Flight:
        return self

    def __next__(self) -> Any:
        if self.lost is not None:
            raise ClusterLostError(str(self.lost))
        try:
            return self._next()
        except StopIteration:
            self.done = True
            raise
        except Exception as exc:
            lost = exc if isinstance(exc, ClusterLostError) else self._cluster_lost()
            if lost is None:
                raise
            self.lost, self.done = lost, True
            self.jobs.clear()
            if lost is exc:
                raise
            raise lost from exc

    def _cluster_lost(self) -> ClusterLostError | None:
        """The error to raise when Ray went away: a Ray shut down mid-call fails that call with
        whatever error it meets first."""
        try:
            self.calls.live()
        except ClusterLostError as lost:
            return lost
        return None

    def _next(self) -> Any:
        errors = self.calls.exceptions
        self._submit()
        if not self.jobs:
            raise StopIteration
        while True:
            job = self._next_done()
            if job is None:  # given up: nothing more is delivered
                self._cancel()
                raise StopIteration
            try:
                batch = self.calls.get(job.ref)
            except (errors.RayActorError, errors.ObjectLostError) as exc:
                self._resend(job.actor, exc)  # every batch it held, to the others
                continue
            except errors.RayTaskError as exc:
                self.jobs.remove(job)
                raise exc.as_instanceof_cause() from None  # the dataset's own error, with the actor's traceback
            self.jobs.remove(job)
            self.pool.scale(self.jobs, None)  # the retired actors' last batches may be out
            while self.loop_waited:
                self.pool.scale(self.jobs, self.loop_waited.popleft())
            return to_tensors(batch, self.pin)

    def _submit(self) -> None:
        while not self.exhausted and not self.given_up.is_set() and len(self.jobs) < self.depth:
            actor = self.pool.pick(self.jobs)  # first: when none can start, no batch of keys is drawn and lost
            try:
                keys = list(next(self.key_batches))
            except StopIteration:
                self.exhausted = True
                return
            self.jobs.append(self._send(Job(keys, None, None, 0), actor))

    def _send(self, job: Job, actor: Any) -> Job:
        job.actor, job.sent = actor, next(_sends)
        job.ref = self.calls.call(actor.decode, job.keys, self.id)
        return job

    def _next_done(self) -> Job | None:
        """The next batch to hand over once it is decoded (the oldest, or with ``in_order=False``
        the first done), or None when the pass is given up meanwhile."""
        jobs = [self.jobs[0]] if self.in_order else list(self.jobs)
        while not self.given_up.is_set():
            done, _ = self.calls.wait([job.ref for job in jobs], num_returns=1, timeout=POLL_S)
            if done:
                return next(job for job in jobs if job.ref == done[0])
        return None

    def _cancel(self) -> None:
        """Give back every batch still at the actors: those queued are never made (one being made
        is finished; its result dropped). Each actor is told alone: a dead one stops no other's."""
        drops = []
        for actor in {job.actor for job in self.jobs}:
            with contextlib.suppress(Exception):  # an actor gone, or Ray shut down: nothing of it to drop
                drops.append(self.calls.call(actor.drop.options(concurrency_group=CONTROL), self.id))
        with contextlib.suppress(Exception):
            if drops:
                self.calls.wait(drops, num_returns=len(drops), timeout=DROP_WAIT_S)
        self.pool.cancelled += len(self.jobs)
        self.jobs.clear()
        self.exhausted = self.done = True

    def _resend(self, dead: Any, exc: Exception) -> None:
        """``dead``'s call failed: its batches (and, its node gone, those of every actor of ours
        there) go to actors on other nodes. A try is counted against a batch only when an actor
        died while decoding it (its oldest) and nothing else explains the death: its node is up,
        and no actor of this pass had died on that node before (its neighbours of then may be
        dead with it, Ray not knowing yet). A batch that keeps killing actors is the fault, never
        a lost node, however many actors it had."""
        node = self.pool.nodes.get(dead)
        gone, node_gone = self.pool.lost(dead)
        moved = [job for job in self.jobs if job.actor in gone]
        decoding = min((job for job in moved if job.actor == dead), key=lambda job: job.sent, default=None)
        if decoding is not None and not node_gone and dead not in self.suspects:
            decoding.deaths += 1
            if decoding.deaths >= TRIES:
                shown = ", ".join(str(key[0] if isinstance(key, tuple) else key) for key in decoding.keys[:8])
                raise RuntimeError(f"mode='ray': the batch of records {shown}{', …' if len(decoding.keys) > 8 else ''} "
                                   f"was being decoded by each of {TRIES} decode actors when it died (the last: "
                                   f"{exc}); a record that crashes or exhausts the process decoding it? Run this "
                                   "epoch with mode='threads' to see the error") from exc
        if node is not None and node not in self.suspect:
            self.suspect.add(node)
            self.suspects.update(actor for actor, on in self.pool.nodes.items() if on == node)
        for job in moved:
            self.pool.resent += 1
            self._send(job, self.pool.pick(self.jobs, avoid=self.suspect))


class RayPass(ThreadPrefetcher):
    """A pass's batches copied out of the object store ``HANDOVER`` ahead of the loop, in a
    thread; the loop's wait for each is noted for the elastic actors; closing it (the loader's
    iterator does when dropped) gives the pass up."""

    def __init__(self, flight: Flight) -> None:
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
