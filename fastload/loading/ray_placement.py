"""mode="ray": a loader whose decode actors do not start, told why within seconds.

    none started after NOTICE_S ─► this process's loaders between passes make room (ray_lending);
                                   its running passes hold the CPUs: an error naming them
                       SLOW_S   ─► a warning: what is free, and what may hold the rest
                       START_WAIT_S ─► an error (an autoscaler adding nodes had its time)

Ray says no more than the cluster's free and total CPUs: an actor placed and still starting (its
worker imports torch, seconds on a busy machine) and one waiting for a CPU look the same, so the
certain cases are this process's own loaders, which it knows.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

from fastload.loading import ray_lending as lending
from fastload.loading.ray_actor import ACTOR_CPUS

NOTICE_S = 5.0  # no actor started within this: make room, or say that this process's passes hold the CPUs
SLOW_S = 30.0  # none yet: a warning naming what is free and what may hold the rest
START_WAIT_S = 600.0  # no actor at all started within this: an error


def unplaced(pool: Any) -> None:
    """No actor of ``pool`` started within ``NOTICE_S``: this process's loaders between passes
    (dropped ones too, once collected) give theirs back; where this process's running passes hold
    so many CPUs that none of ``pool``'s can be placed while they run, an error naming them."""
    gc.collect()  # a loader or iterator dropped in a reference cycle gives its actors back now
    if lending.make_room(pool, len(pool.starting)):
        return
    _, total = pool.calls.cpus()
    loaders, held = lending.holders(pool)
    if held and total - held * ACTOR_CPUS < ACTOR_CPUS:
        raise RuntimeError(f"mode='ray': this loader's {len(pool.starting)} decode actor(s) cannot start: each "
                           f"asks for {ACTOR_CPUS} CPU, and the cluster's {total:g} CPUs are held by the {held} "
                           f"decode actors of {loaders} other mode='ray' loader(s) of this process whose pass is "
                           "still running (an iterator neither finished nor dropped); finish or drop that "
                           "iteration (del it) before starting this one, give the loaders num_workers that fit "
                           "together, or add nodes")


def slow(pool: Any) -> None:
    """None started within ``SLOW_S``: say what is free and what may hold the rest, and wait on."""
    free, total = pool.calls.cpus()
    loaders, held = lending.holders(pool)
    warnings.warn(f"mode='ray': none of this loader's {len(pool.starting)} decode actors has started within "
                  f"{SLOW_S:.0f} s: each asks for {ACTOR_CPUS} CPU, and the cluster has {free:g} of {total:g} free "
                  f"({held} held by {loaders} other mode='ray' loader(s) of this process; the rest by these actors "
                  "if they are only slow to start, or by other Ray jobs, tasks or actors); waiting up to "
                  f"{START_WAIT_S:.0f} s in all (for CPUs to come free, or an autoscaler to add nodes): add nodes "
                  "or lower num_workers", RuntimeWarning, stacklevel=2)


def none_started(pool: Any) -> None:
    free, total = pool.calls.cpus()
    raise RuntimeError(f"mode='ray': none of the decode actors started within {START_WAIT_S:.0f} s; each asks for "
                       f"{ACTOR_CPUS} CPU and the cluster has {free:g} free of {total:g}: add nodes or lower "
                       "num_workers")
