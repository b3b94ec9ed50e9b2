"""Which of ``tune``'s measured settings it may choose: the fastest only where the spread allows.

A pure function of the measurements (``choose``), so it is testable on made-up rates. Each
candidate ran several times, interleaved with the others; one is chosen over auto's settings
only when every run of it beat every run of the rest (:func:`fastload.benchmark.spread.differs`)
on a machine that was not busy. Otherwise ``tune`` keeps auto's settings and says why: "too
noisy to choose" is an answer, a pick on noise is not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastload.benchmark.spread import Spread, differs
from fastload.loading.settings import LoaderSettings


@dataclass(frozen=True)
class Measured:
    """One candidate of the grid: its resolved settings, the arguments that made them, and the
    samples/s of each of its runs."""

    settings: LoaderSettings
    candidate: dict[str, Any]
    rates: list[float] = field(default_factory=list)

    @property
    def spread(self) -> Spread:
        return Spread.of(self.rates)

    @property
    def name(self) -> str:
        return label(self.settings)


@dataclass(frozen=True)
class Choice:
    """What tune picked (None: it keeps auto's settings) and why, in words."""

    measured: Measured | None
    why: str


def label(s: LoaderSettings) -> str:
    """``threads/0w/pfNone``: a candidate's mode, worker processes and prefetch factor."""
    return f"{s.mode}/{s.num_workers}w/pf{s.prefetch_factor}"


def choose(measured: list[Measured], auto: LoaderSettings, *, main_allowed: bool = True,
           busy: str | None = None) -> Choice:
    """The candidate to use instead of ``auto``, if the measurements allow one.

    Args:
        measured: every candidate with its runs' rates.
        auto: what the loader resolves without tune (kept when nothing is known faster).
        main_allowed: ``mode='main'`` may be chosen (with a training step: it decodes between
            steps, so on data alone it would win for a reason training does not share).
        busy: what else ran, in words (:meth:`~fastload.benchmark.machine_load.MachineLoad.others`),
            when other processes took a share of the cores (None: quiet): what is fastest beside
            them need not be on a quiet machine, so nothing is chosen.
    """
    delivered = [m for m in measured if m.rates and max(m.rates) > 0]
    eligible = [m for m in delivered if main_allowed or m.settings.mode != "main"] or delivered
    if not eligible:
        return Choice(None, "kept auto's settings: no candidate delivered a batch")
    if busy:
        return Choice(None, f"too noisy to choose: the machine was busy ({busy}), and what is fastest beside "
                      "other processes need not be on a quiet machine; kept auto's settings; rerun tune on a "
                      "quiet machine")
    best = max(eligible, key=lambda m: m.spread.median)
    leaders = [m for m in eligible if not differs(m.spread, best.spread)]
    if len(leaders) == 1:
        rest = [m for m in eligible if m is not best]
        if not rest:
            return Choice(best, f"{best.name}, the one candidate measured")
        second = max(rest, key=lambda m: m.spread.median)
        return Choice(best, f"{best.name}: every run of it faster than every run of the next fastest, {second.name}")
    names = ", ".join(m.name for m in leaders)
    if any(m.settings == auto for m in leaders):
        return Choice(None, f"kept auto's settings ({label(auto)}): {names} overlap run for run, so none is known "
                      "faster, and auto's is among them")
    measured_auto = next((m for m in eligible if m.settings == auto), None)
    if measured_auto is not None and all(differs(m.spread, measured_auto.spread) for m in leaders):
        return Choice(best, f"{best.name}: {names} overlap run for run (too noisy to choose between them; rerun "
                      f"on a quiet machine to tell them apart), and every run of each beat every run of auto's "
                      f"{label(auto)}: the highest median of them")
    return Choice(None, f"too noisy to choose: {names} overlap run for run, so none is known faster; kept auto's "
                  f"settings ({label(auto)}); rerun tune on a quiet machine, or with more repeats")
