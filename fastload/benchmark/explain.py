"""Why the verdict says what it says: the sentences of its reason, from the same numbers.

Each function turns :class:`~fastload.benchmark.verdict.Evidence` and the stage model
(:mod:`fastload.benchmark.capacity`) into the words ``doctor`` and ``bench`` print.
"""

from __future__ import annotations

from fastload.benchmark.capacity import StageLike, parallel_of
from fastload.benchmark.evidence import Evidence

WHAT = {"io": "reading", "cpu": "CPU work", "transfer": "the copy to the GPU"}
"""Each stage group in words."""
SHARED_SLOWDOWN = 1.2
"""A step this many times slower beside the loader than alone is slowed by the loader's work."""


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"


def label(group: str, stage: str) -> str:
    if group == "io":
        return "I/O-bound"
    if group == "transfer":
        return "transfer-bound"
    return "CPU-decode-bound" if stage.startswith("decode") else f"CPU-bound ({stage})"


def reason(e: Evidence, group: str, worst: StageLike, load: dict[str, float], predicted: float | None) -> str:
    share = load[group] / sum(load.values())
    text = (f"{WHAT[group]} is {share:.0%} of a sample's cost; {worst.name} takes "
            f"{ms(worst.seconds_per_sample)} per sample on one "
            f"{'core' if worst.kind == 'cpu' else 'thread'}, {parallel_of(worst, e.cores)} at a time in this loader")
    if predicted is not None:
        text += f" (timed alone, the stages allow about {predicted:.0f} samples/s"
        text += f"; the loader delivered {e.loader_rate:.0f})" if e.loader_rate else ")"
    if e.model_step_s and e.wait_fraction is not None and not e.loader_rate:  # else loader_bound says it
        text += f"; the training loop waits for data {e.wait_fraction:.0%} of the time"
    return text


def model_reason(e: Evidence, wait: float | None, data_rate: float, model_rate: float) -> str:
    if e.headspace_rate and e.loader_rate:
        step = (f"under the step the loop trains at {e.loader_rate:.0f} samples/s, "
                f"{e.loader_rate / e.headspace_rate:.2f}x the step's headspace ({e.headspace_rate:.0f} "
                "samples/s on a batch already on the device)")
    else:
        step = f"the {ms(e.model_step_s or 0)} step consumes {model_rate:.0f} samples/s"
    if wait is not None:
        return f"the model bounds training: the loop waits for data only {wait:.0%} of the time; {step}{sharing(e)}"
    return f"the model bounds training: the data arrives at {data_rate:.0f} samples/s, {step}{sharing(e)}"


def loader_bound(e: Evidence, model_rate: float) -> str:
    """How much the loader holds training back: the rate under the step against the headspace."""
    rate = e.loader_rate or 0.0
    what = "the step's headspace" if e.headspace_rate else "what the stand-in step takes"
    text = (f"the loader bounds training: under the step the loop trains at {rate:.0f} samples/s, "
            f"{rate / model_rate:.2f}x {what} ({model_rate:.0f} samples/s)")
    if e.wait_fraction is not None:
        text += f" and waits for data {e.wait_fraction:.0%} of the time"
    if rate > 0:
        text += f"; a loader that kept up would train up to {model_rate / rate:.1f}x faster"
    return text + sharing(e)


def slowed(e: Evidence) -> float | None:
    """How many times longer the step took beside the loader than alone (None: not measured)."""
    if not e.headspace_rate or not e.model_step_s:
        return None
    return e.model_step_s / (e.batch_size / e.headspace_rate)


def sharing(e: Evidence) -> str:
    times = slowed(e)
    if times is None or times < SHARED_SLOWDOWN:
        return ""
    return (f" (the step took {ms(e.model_step_s or 0)} a batch beside the loader against "
            f"{ms(e.batch_size / (e.headspace_rate or 1))} alone, {times:.1f}x: they share the CPU, "
            "the device and Python)")


def doubt(e: Evidence, capacities: dict[str, float], predicted: float | None, margin: float) -> str | None:
    """Why the verdict is unsure: a stage whose measured limit is below the rate the loader
    delivered end to end cannot be what held it back, so the stage timings contradict the run;
    nor can stages that together allow less than it delivered."""
    if not e.loader_rate:
        return None
    below = {g: c for g, c in capacities.items() if c < e.loader_rate / margin}
    if below:
        group, limit = min(below.items(), key=lambda item: item[1])
        return (f"unsure: timed alone, {group} allows {limit:.0f} samples/s, yet the loader delivered "
                f"{e.loader_rate:.0f}: the stage timings do not add up (a busy machine, or stages that overlap "
                "more than assumed); re-run on a quiet machine, and take this verdict as a hint")
    if predicted is not None and predicted < e.loader_rate:
        return (f"unsure: timed alone, the stages together allow about {predicted:.0f} samples/s, yet the "
                f"loader delivered {e.loader_rate:.0f} ({e.loader_rate / predicted:.2f}x that): the stage "
                "timings are estimates (they overlap more than their sum assumes, or the machine's load "
                "changed between the timings); take the stage named as a hint")
    return None
