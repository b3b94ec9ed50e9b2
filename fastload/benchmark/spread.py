"""Repeated measurements and the one rule for comparing them: a difference smaller than the
spread of either side is not a difference.

``bench`` (a row against the reference), ``doctor`` (the bottleneck against the next stage
group) and ``tune`` (the fastest settings against the rest) all decide through :func:`differs`,
so none of them chooses on noise: on a busy machine the repeats spread out, and the answer is
"too noisy to choose", not a wrong one.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """A measurement repeated: its median, and the lowest and highest repeat."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("Spread.of: no values; measure at least once")
        return cls(statistics.median(values), min(values), max(values))

    @property
    def width(self) -> float:
        return self.high - self.low

    def text(self, digits: int = 0) -> str:
        """``300 (268–332)``; one value alone when the repeats agree exactly (or there was one)."""
        if self.width == 0:
            return f"{self.median:.{digits}f}"
        return f"{self.median:.{digits}f} ({self.low:.{digits}f}–{self.high:.{digits}f})"


def differs(a: Spread, b: Spread) -> bool:
    """Whether ``a`` and ``b`` differ: every repeat of one beat every repeat of the other.

    A difference smaller than the spread on either side is not a difference: when the higher
    one's slowest repeat does not clear the lower one's fastest, the ranges overlap and the
    medians' order is noise. One measurement each (no spread) differs when the values do: nothing
    says they are noise; a caller that measured once says so where it reports them.
    """
    return a.low > b.high or b.low > a.high
