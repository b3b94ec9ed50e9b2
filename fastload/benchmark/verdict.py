"""The verdict: from stage timings and a loader run to the bottleneck, or to "too noisy to say".

A pure function of numbers (``diagnose(Evidence) -> Verdict``), so it is testable on made-up
cases. The model (:mod:`.capacity`): the stage group (I/O, CPU, transfer) that can deliver the
fewest samples/s is the bottleneck, unless a training step is given and the loop barely waits
for data: then the model is. With a step, the verdict also says which one bounds training and by
how much (the rate under the step against the step's headspace). A bottleneck, or the stage
behind it, is named only where the timings' spread allows (:func:`.spread.differs`); the words
are :mod:`.explain`'s, the changes to make :mod:`.advice`'s; what it is drawn from, :mod:`.evidence`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fastload.benchmark import advice as advise
from fastload.benchmark import explain
from fastload.benchmark.capacity import GROUPS, StageLike, group_load, group_spread, parallel_of
from fastload.benchmark.evidence import Evidence
from fastload.benchmark.spread import Spread, differs

Bottleneck = Literal["io", "cpu", "transfer", "model"]
MODEL_BOUND_WAIT = 0.10
"""The loop waiting for data at most this fraction of its time is model-bound."""
DECODE_SHARE = 0.4
"""CPU-bound with decoding at least this share of the CPU time is CPU-decode-bound."""
DOUBT_MARGIN = 1.25
"""A stage timed alone allowing this much less than the loader delivered contradicts the run."""
RERUN = "rerun on a quiet machine (the machine load line says what else ran) to tell them apart"


@dataclass(frozen=True)
class Verdict:
    """The bottleneck, the stage behind it, why, and concrete changes, most effective first.
    ``bottleneck`` is None (and ``stage`` with it) when the timings were too noisy to name one;
    ``stage`` alone is None when the group is clear but its stages too close to tell apart."""

    bottleneck: Bottleneck | None
    label: str
    stage: str | None
    reason: str
    advice: list[str]
    capacities: dict[str, float] = field(default_factory=dict)  # stage group → samples/s it allows
    predicted_rate: float | None = None  # samples/s all stages together allow
    wait_fraction: float | None = None
    loader: str | None = None  # the row whose loader this is about (set by the caller)
    doubt: str | None = None  # the measurements contradict each other: why this verdict is a hint

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)

    def __str__(self) -> str:
        about = f" ({self.loader})" if self.loader else ""
        lines = [f"verdict: {self.label}{about} — {self.reason}"]
        if self.doubt:
            lines.append(f"  ! {self.doubt}")
        lines += [f"  - {a}" for a in self.advice]
        return "\n".join(lines)


def diagnose(e: Evidence) -> Verdict:
    """Name the bottleneck of the loader described by ``e``, and what to change."""
    if not e.stages:
        raise ValueError("diagnose: no stage timings; measure the stages first (fastload doctor)")
    load = {g: group_load(list(e.stages), e.cores, g) for g in GROUPS}  # seconds per sample of each group
    capacities = {g: 1.0 / s for g, s in load.items() if s > 0}
    total = sum(load.values())
    predicted = 1.0 / total if total > 0 else None
    group = max(load, key=lambda g: load[g])
    worst = max((s for s in e.stages if s.kind == group), key=lambda s: _cost(e, s))
    decode = [s for s in e.stages if s.kind == "cpu" and s.name.startswith("decode")]
    decode_led = group == "cpu" and bool(decode) and sum(_cost(e, s) for s in decode) >= DECODE_SHARE * load["cpu"]
    if decode_led:
        worst = decode[0]  # a resize of the full-size image is decode's cost too: draft fixes both
    wait = e.wait_fraction
    model_rate = e.headspace_rate or (e.batch_size / e.model_step_s if e.model_step_s else None)
    if model_rate:
        data_rate = e.loader_rate or predicted or 0.0
        waits_little = wait <= MODEL_BOUND_WAIT if wait is not None else data_rate >= 1.1 * model_rate
        if waits_little:
            times = explain.slowed(e)
            label = ("model-bound, the step slowed by the loader" if times and times >= explain.SHARED_SLOWDOWN
                     else "model-bound")
            return Verdict("model", label, None, explain.model_reason(e, wait, data_rate, model_rate),
                           advise.model_advice(e), capacities, predicted, wait, doubt=_busy(e))
    bound = explain.loader_bound(e, model_rate) + "; " if model_rate and e.loader_rate else ""
    reason = bound + explain.reason(e, group, worst, load, predicted)
    too_close = _groups_too_close(e, group, load)
    if too_close:
        return Verdict(None, "too noisy to name the bottleneck", None, bound + too_close, [RERUN], capacities,
                       predicted, wait, doubt=_busy(e))
    label = (f"I/O-bound (object store, {e.store_bound}-bound)" if group == "io" and e.store_bound
             else explain.label(group, worst.name))
    doubt = "; ".join(d for d in (explain.doubt(e, capacities, predicted, DOUBT_MARGIN), _busy(e)) if d) or None
    stages_close = _stages_too_close(e, group, worst, decode_led)
    if stages_close:
        return Verdict(group, f"{_BOUND[group]}, too noisy to name the stage", None,  # type: ignore[arg-type]
                       f"{stages_close}; {reason}", [a for a in [advise.more_workers(e), RERUN] if a],
                       capacities, predicted, wait, doubt=doubt)
    return Verdict(group, label, worst.name, reason,  # type: ignore[arg-type]
                   advise.advice(e, group, worst), capacities, predicted, wait, doubt=doubt)


def _cost(e: Evidence, stage: StageLike) -> float:
    return stage.seconds_per_sample / parallel_of(stage, e.cores)


def _stage_spread(e: Evidence, stage: StageLike) -> Spread:
    return group_spread([stage], e.cores, stage.kind)


def _ms_spread(s: Spread) -> str:
    return f"{s.median * 1e3:.3g} ms ({s.low * 1e3:.3g}–{s.high * 1e3:.3g})" if s.width else f"{s.median * 1e3:.3g} ms"


_BOUND = {"io": "I/O-bound", "cpu": "CPU-bound", "transfer": "transfer-bound"}


def _groups_too_close(e: Evidence, group: str, load: dict[str, float]) -> str | None:
    """Why the slowest stage group cannot be told from the next (None: it can)."""
    others = [g for g in GROUPS if g != group and load[g] > 0]
    if not others:
        return None
    second = max(others, key=lambda g: load[g])
    top, runner = group_spread(list(e.stages), e.cores, group), group_spread(list(e.stages), e.cores, second)
    if differs(top, runner):
        return None
    return (f"{explain.WHAT[group]} ({_ms_spread(top)} a sample) and {explain.WHAT[second]} ({_ms_spread(runner)}) "
            "overlap across their timing rounds (median, fastest–slowest): too close to tell which limits the loader")


def _stages_too_close(e: Evidence, group: str, worst: StageLike, decode_led: bool) -> str | None:
    """Why the stage named cannot be told from the next one of its group (None: it can). A
    decode-led group weighs decode with transform (the resize of a full-size decode)."""
    named = [s for s in e.stages if s.kind == group and (s is worst or (decode_led and s.name == "transform"))]
    rest = [s for s in e.stages if s.kind == group and s not in named]
    if not rest:
        return None
    nxt = max(rest, key=lambda s: _cost(e, s))
    mine = group_spread(named, e.cores, group)
    theirs = _stage_spread(e, nxt)
    if differs(mine, theirs):
        return None
    return (f"{worst.name} ({_ms_spread(mine)} a sample) and {nxt.name} ({_ms_spread(theirs)}) overlap across "
            "their timing rounds (median, fastest–slowest): too close to tell which costs more")


def _busy(e: Evidence) -> str | None:
    if not e.machine_busy:
        return None
    return ("measured on a busy machine (see the machine load line): other processes took CPU time the "
            "stages and the loader would have had; take this verdict as a hint and rerun on a quiet machine")
