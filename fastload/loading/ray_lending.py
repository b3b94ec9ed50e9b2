"""mode="ray": the cluster's CPUs shared by this process's loaders, so that a second loader never
waits in silence for CPUs the first one's idle actors hold (a notebook cell run again, a resume in
one process, a validation loader).

A loader keeps its decode actors between passes. One that starts its actors takes, first, those
of this process's loaders between passes that decode the same dataset the same way (the same
pickled dataset and collate: they serve it as they are, no start), then ends as many more of
theirs as the cluster's free CPUs fall short of; their next pass starts new ones. A loader whose
pass is running keeps its actors.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

from fastload.loading.ray_actor import ACTOR_CPUS

log = logging.getLogger(__name__)
_pools: weakref.WeakSet[Any] = weakref.WeakSet()  # every ActorPool of this process
_lock = threading.Lock()
_TRY_S = 2.0  # how long a pool busy in another thread (or ending its pass) is waited for before it is passed over


def register(pool: Any) -> None:
    with _lock:
        _pools.add(pool)


def _idle(pool: Any) -> list[Any]:
    """This process's other pools on the same Ray, holding actors, with no pass running (a pass
    given up a moment ago, its iterator just dropped, is waited for: its thread is ending it)."""
    with _lock:
        others = [other for other in _pools if other is not pool and other.calls.job == pool.calls.job
                  and (other.actors or other.starting or other.retiring)]
    deadline = time.monotonic() + _TRY_S
    while any(other.running() and other.ending() for other in others) and time.monotonic() < deadline:
        time.sleep(0.01)
    return [other for other in others if not other.running()]


def adopt(pool: Any, wanted: int) -> int:
    """Up to ``wanted`` started actors of idle pools decoding ``pool``'s dataset the same way,
    moved to ``pool`` (a pool that keeps actors on this node places its own). Returns how many."""
    taken = 0
    for other in _idle(pool) if pool.local_workers == 0 else ():
        if taken >= wanted:
            break
        if other.digest == pool.digest and other.lock.acquire(timeout=_TRY_S):
            try:
                given = other.give_back(wanted - taken)
            finally:
                other.lock.release()
            pool.adopt(given)
            taken += len(given)
    if taken:
        log.info("mode='ray': %d decode actor(s) of an idle loader of the same dataset taken over", taken)
    return taken


def make_room(pool: Any, actors: int) -> bool:
    """End idle pools' actors while the cluster's free CPUs are fewer than ``actors`` of ``pool``'s
    need (their CPUs come free as Ray ends them). Returns whether any was ended."""
    if actors <= 0:
        return False
    free, _ = pool.calls.cpus()
    short = actors * ACTOR_CPUS - free
    if short <= 0:
        return False
    ended = 0
    for other in _idle(pool):
        if ended * ACTOR_CPUS >= short:
            break
        if other.lock.acquire(timeout=_TRY_S):
            try:
                ended += len(other.actors)  # those holding CPUs: started ones
                other.close()
            finally:
                other.lock.release()
    if ended:
        log.info("mode='ray': %d decode actor(s) of idle loaders of this process ended for a new loader's", ended)
    return ended > 0


def holders(pool: Any) -> tuple[int, int]:
    """This process's other loaders whose pass is running, and the actors they hold."""
    with _lock:
        others = [other for other in _pools if other is not pool and other.calls.job == pool.calls.job]
    busy = [other for other in others if other.running()]
    return len(busy), sum(len(other.actors) + len(other.starting) + len(other.retiring) for other in busy)
