"""mode="ray", elastic: how many decode actors the next batches want, from what the last ones showed.

    each batch handed over ─► Seen(waited, idle) ─► the last WINDOW of them ─► target(...) ─► actors
                                                                                  started or retired

A pure function of the observations, so that the rule can be read and tested without a cluster:
the loop waiting on the actors while none of them idles means decoding is too slow (more actors);
an actor idle the whole window while the loop did not wait means one fewer still keeps up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

WINDOW = 4  # batches observed between two changes: one slow batch does not start an actor
GROW_AT = 0.1  # the loop waited more than this share of its time per batch: decoding holds it up
MAX_WAIT = 0.75  # a wait share above this is counted as this: at most 4× the actors in one step


@dataclass(frozen=True)
class Seen:
    """One batch handed to the loop.

    Args:
        waited: the share of the time per batch spent waiting for this batch's decode (0 to 1).
        idle: started actors that had every batch they were given decoded (nothing to do).
    """

    waited: float
    idle: int


def bounds(min_workers: int | None, num_workers: int) -> tuple[int, int]:
    """The least and most actors of ``DataLoader(mode="ray", num_workers=..., ray_min_workers=...)``:
    None keeps ``num_workers`` all along (no scaling)."""
    low = num_workers if min_workers is None else min_workers
    if isinstance(low, bool) or not isinstance(low, int) or not 1 <= low <= num_workers:
        raise ValueError(f"ray_min_workers={min_workers!r} with num_workers={num_workers}: give an int from 1 "
                         "to num_workers (the fewest decode actors kept), or None for num_workers all along")
    return low, num_workers


def target(recent: Sequence[Seen], actors: int, *, low: int, high: int) -> int:
    """The actor count for the next batches, between ``low`` and ``high``, given ``actors`` now
    (started or starting) and the ``recent`` batches (unchanged until ``WINDOW`` of them are seen).

    Growing aims at the decode rate the loop would take: with a share ``w`` of its time waiting,
    the loop would take ``1 / (1 - w)`` times the batches the actors make. Shrinking is one actor a
    window, so that a consumer briefly slower than usual does not retire the actors it needs next.
    """
    if len(recent) < WINDOW:
        return min(max(actors, low), high)
    waited = sum(seen.waited for seen in recent[-WINDOW:]) / WINDOW
    idle = min(seen.idle for seen in recent[-WINDOW:])
    if waited > GROW_AT and idle == 0:
        wanted = max(actors + 1, math.ceil(actors / (1 - min(waited, MAX_WAIT))))
    elif waited <= GROW_AT and idle > 0:
        wanted = actors - 1
    else:
        wanted = actors
    return min(max(wanted, low), high)
