"""The elastic actors' policy, without Ray: always within its bounds, unchanged until a window is
seen, more actors only while the loop waits and none idles, fewer only while one idles and the
loop does not wait, one at a time down; and the bounds a loader is given are checked."""

from __future__ import annotations

import itertools

import pytest

from fastload.loading.ray_scaling import GROW_AT, WINDOW, Seen, bounds, target

WAITS = [0.0, GROW_AT, GROW_AT + 0.01, 0.5, 0.75, 0.99, 1.0]
IDLES = [0, 1, 3]


def windows() -> list[list[Seen]]:
    """Every steady window (the same batch WINDOW times) and a few mixed ones."""
    steady = [[Seen(w, i)] * WINDOW for w in WAITS for i in IDLES]
    mixed = [[Seen(1.0, 0)] * (WINDOW - 1) + [Seen(0.0, 1)], [Seen(0.0, 2)] * (WINDOW - 1) + [Seen(0.0, 0)]]
    return steady + mixed


@pytest.mark.parametrize(("low", "high"), [(1, 1), (1, 4), (2, 5), (3, 3)])
def test_the_target_stays_within_its_bounds(low: int, high: int) -> None:
    for recent, actors in itertools.product(windows(), range(high + 3)):
        assert low <= target(recent, actors, low=low, high=high) <= high


def test_nothing_changes_before_a_window_is_seen() -> None:
    for n in range(WINDOW):
        assert target([Seen(1.0, 0)] * n, 2, low=1, high=8) == 2
        assert target([Seen(0.0, 2)] * n, 2, low=1, high=8) == 2


def test_more_actors_only_while_the_loop_waits_and_none_idles() -> None:
    for recent, actors in itertools.product(windows(), range(1, 6)):
        waited = sum(s.waited for s in recent) / len(recent)
        if target(recent, actors, low=1, high=16) > actors:
            assert waited > GROW_AT and min(s.idle for s in recent) == 0
    assert target([Seen(0.5, 0)] * WINDOW, 3, low=1, high=16) == 6  # half the time waiting: twice the decode
    assert target([Seen(1.0, 0)] * WINDOW, 1, low=1, high=16) == 4  # at most 4x a step
    assert target([Seen(GROW_AT + 0.01, 0)] * WINDOW, 8, low=1, high=16) == 9  # at least one more


def test_fewer_actors_only_while_one_idles_and_the_loop_does_not_wait_one_at_a_time() -> None:
    for recent, actors in itertools.product(windows(), range(1, 6)):
        got = target(recent, actors, low=1, high=16)
        if got < actors:
            assert got == actors - 1
            assert sum(s.waited for s in recent) / len(recent) <= GROW_AT and min(s.idle for s in recent) > 0
    assert target([Seen(0.0, 1)] * (WINDOW - 1) + [Seen(0.0, 0)], 3, low=1, high=4) == 3  # busy once: kept


def test_a_steady_load_settles_and_stays() -> None:
    """Fed the policy's own result, a loop that keeps waiting reaches the most actors, and a loop
    that never waits with an actor to spare comes down to the fewest, each in a few windows."""
    actors = 1
    for _ in range(4):
        actors = target([Seen(0.9, 0)] * WINDOW, actors, low=1, high=6)
    assert actors == 6
    for _ in range(8):
        actors = target([Seen(0.0, 1)] * WINDOW, actors, low=2, high=6)
    assert actors == 2


def test_bounds_none_keeps_num_workers_and_nonsense_is_refused() -> None:
    assert bounds(None, 3) == (3, 3)
    assert bounds(1, 3) == (1, 3)
    for bad in (0, 4, -1, True, 1.5, "1"):
        with pytest.raises(ValueError, match=rf"ray_min_workers={bad!r} with num_workers=3: give an int from 1"):
            bounds(bad, 3)  # type: ignore[arg-type]
