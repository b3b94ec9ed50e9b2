"""The verdict: from stage timings and a loader run to the bottleneck and what to change.

A pure function of numbers (``diagnose(Evidence) -> Verdict``), so it is testable on made-up
cases. The model: a loader runs each sample through its stages; a stage that takes ``s``
seconds per sample and runs ``p`` at once can deliver ``p / s`` samples/s (CPU stages at most
one per core). The stage group (I/O, CPU, transfer) that can deliver the fewest samples/s is the
bottleneck, unless a training step is given and the loop barely waits for data: then the model is.
With a step, the verdict also says which one bounds training and by how much: the rate under the
step against the step's headspace (its own rate on batches already on the device).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from fastload.benchmark.pixel_row import pixel_cache_advice

Bottleneck = Literal["io", "cpu", "transfer", "model"]
MODEL_BOUND_WAIT = 0.10
"""The loop waiting for data at most this fraction of its time is model-bound."""
DECODE_SHARE = 0.4
"""CPU-bound with decoding at least this share of the CPU time is CPU-decode-bound."""
DOUBT_MARGIN = 1.25
"""A stage timed alone allowing this much less than the loader delivered contradicts the run."""


class StageLike(Protocol):
    name: str
    kind: str  # "io", "cpu" or "transfer"
    seconds_per_sample: float
    parallel: int


@dataclass(frozen=True)
class Evidence:
    """What the verdict is drawn from.

    Attributes:
        stages: per-stage seconds per sample on one thread, and how many the loader runs at once.
        cores: cores available to the loader.
        batch_size: samples per batch (turns a model step into samples/s).
        source: ``"folder"`` (small files) or ``"packed"`` (fastload shards).
        loader_rate: samples/s the loader delivered end to end (None: not run); under a step, the
            training loop's rate.
        wait_fraction: share of the loop's time spent waiting for data, measured with the step.
        model_step_s: the training step's time per batch in the loop (None: none given).
        headspace_rate: samples/s of the step alone on batches already on its device (None: not
            measured; a slept stand-in's is ``batch_size / model_step_s``).
        reduced_decode: the loader already decodes JPEGs at reduced scale.
        reduced_decode_s: seconds per sample of fastload's reduced-scale decode + crop on these
            images (None: not measured); advised only when faster than decode + transform now.
        pinned: the loader pins batches (None: no CUDA, transfer not measured).
        dali_installed: ``import nvidia.dali`` works here, so DALI advice needs no install hint.
        store_bound: the data is in an object store whose round trips (``"latency"``) or bytes
            (``"bandwidth"``) limit the reads (None: not in a store).
        store_latency_s, store_mb_s: one request's latency and the store's bandwidth here.
        cached: a dataset in a store is read through a node cache.
        dataset_bytes: the data's size (what a cache needs to hold it all).
        cache_limit: the bytes the node cache may hold (None: no cache, or not in a store).
        cuda: a CUDA device is here (GPU decode is advice only then).
        nvimgcodec_installed: nvImageCodec imports here: GPU decode is ``backend='nvimgcodec'``.
        pixel_cache: a packed dataset's ``(bytes its pixel cache would take, bytes free there, side)``.
    """

    stages: Sequence[StageLike]
    cores: int
    batch_size: int
    source: Literal["folder", "packed"] = "folder"
    loader_rate: float | None = None
    wait_fraction: float | None = None
    model_step_s: float | None = None
    headspace_rate: float | None = None
    reduced_decode: bool = False
    reduced_decode_s: float | None = None
    pinned: bool | None = None
    dali_installed: bool = False
    store_bound: Literal["latency", "bandwidth"] | None = None
    store_latency_s: float | None = None
    store_mb_s: float | None = None
    cached: bool = True
    dataset_bytes: int | None = None
    cache_limit: int | None = None
    cuda: bool = False
    nvimgcodec_installed: bool = False
    pixel_cache: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class Verdict:
    """The bottleneck, the stage behind it, why, and concrete changes, most effective first."""

    bottleneck: Bottleneck
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
    load = {g: _load(e, g) for g in ("io", "cpu", "transfer")}  # seconds per sample of each group
    capacities = {g: 1.0 / s for g, s in load.items() if s > 0}
    total = sum(load.values())
    predicted = 1.0 / total if total > 0 else None
    group = max(load, key=lambda g: load[g])
    worst = max((s for s in e.stages if s.kind == group), key=lambda s: s.seconds_per_sample / _par(e, s))
    decode = [s for s in e.stages if s.kind == "cpu" and s.name.startswith("decode")]
    if group == "cpu" and decode and sum(s.seconds_per_sample / _par(e, s) for s in decode) >= \
            DECODE_SHARE * load["cpu"]:
        worst = decode[0]  # a resize of the full-size image is decode's cost too: draft fixes both
    wait = e.wait_fraction
    model_rate = e.headspace_rate or (e.batch_size / e.model_step_s if e.model_step_s else None)
    if model_rate:
        data_rate = e.loader_rate or predicted or 0.0
        waits_little = wait <= MODEL_BOUND_WAIT if wait is not None else data_rate >= 1.1 * model_rate
        if waits_little:
            slowed = _slowed(e)
            label = ("model-bound, the step slowed by the loader" if slowed and slowed >= SHARED_SLOWDOWN
                     else "model-bound")
            return Verdict("model", label, None, _model_reason(e, wait, data_rate, model_rate),
                           _model_advice(e), capacities, predicted, wait)
    reason = _reason(e, group, worst, load, predicted)
    if model_rate and e.loader_rate:
        reason = _loader_bound(e, model_rate) + "; " + reason
    label = (f"I/O-bound (object store, {e.store_bound}-bound)" if group == "io" and e.store_bound
             else _label(group, worst.name))
    return Verdict(group, label, worst.name, reason,  # type: ignore[arg-type]
                   _advice(e, group, worst), capacities, predicted, wait,
                   doubt=_doubt(e, capacities, predicted))


def _doubt(e: Evidence, capacities: dict[str, float], predicted: float | None) -> str | None:
    """Why the verdict is unsure: a stage whose measured limit is below the rate the loader
    delivered end to end cannot be what held it back, so the stage timings contradict the run;
    nor can stages that together allow less than it delivered."""
    if not e.loader_rate:
        return None
    below = {g: c for g, c in capacities.items() if c < e.loader_rate / DOUBT_MARGIN}
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


def _par(e: Evidence, stage: StageLike) -> int:
    p = max(1, int(stage.parallel))
    return min(p, max(1, e.cores)) if stage.kind == "cpu" else p


def _load(e: Evidence, group: str) -> float:
    return sum(s.seconds_per_sample / _par(e, s) for s in e.stages if s.kind == group)


def _label(group: str, stage: str) -> str:
    if group == "io":
        return "I/O-bound"
    if group == "transfer":
        return "transfer-bound"
    return "CPU-decode-bound" if stage.startswith("decode") else f"CPU-bound ({stage})"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 0.1 else f"{seconds * 1e3:.0f} ms"


def _reason(e: Evidence, group: str, worst: StageLike, load: dict[str, float],
            predicted: float | None) -> str:
    share = load[group] / sum(load.values())
    what = {"io": "reading", "cpu": "CPU work", "transfer": "the copy to the GPU"}[group]
    text = (f"{what} is {share:.0%} of a sample's cost; {worst.name} takes "
            f"{_ms(worst.seconds_per_sample)} per sample on one "
            f"{'core' if worst.kind == 'cpu' else 'thread'}, {_par(e, worst)} at a time in this loader")
    if predicted is not None:
        text += f" (timed alone, the stages allow about {predicted:.0f} samples/s"
        text += f"; the loader delivered {e.loader_rate:.0f})" if e.loader_rate else ")"
    if e.model_step_s and e.wait_fraction is not None and not e.loader_rate:  # else _loader_bound says it
        text += f"; the training loop waits for data {e.wait_fraction:.0%} of the time"
    return text


def _model_reason(e: Evidence, wait: float | None, data_rate: float, model_rate: float) -> str:
    if e.headspace_rate and e.loader_rate:
        step = (f"under the step the loop trains at {e.loader_rate:.0f} samples/s, "
                f"{e.loader_rate / e.headspace_rate:.2f}x the step's headspace ({e.headspace_rate:.0f} "
                "samples/s on a batch already on the device)")
    else:
        step = f"the {_ms(e.model_step_s or 0)} step consumes {model_rate:.0f} samples/s"
    if wait is not None:
        return f"the model bounds training: the loop waits for data only {wait:.0%} of the time; {step}{_sharing(e)}"
    return f"the model bounds training: the data arrives at {data_rate:.0f} samples/s, {step}{_sharing(e)}"


def _loader_bound(e: Evidence, model_rate: float) -> str:
    """How much the loader holds training back: the rate under the step against the headspace."""
    rate = e.loader_rate or 0.0
    what = "the step's headspace" if e.headspace_rate else "what the stand-in step takes"
    text = (f"the loader bounds training: under the step the loop trains at {rate:.0f} samples/s, "
            f"{rate / model_rate:.2f}x {what} ({model_rate:.0f} samples/s)")
    if e.wait_fraction is not None:
        text += f" and waits for data {e.wait_fraction:.0%} of the time"
    if rate > 0:
        text += f"; a loader that kept up would train up to {model_rate / rate:.1f}x faster"
    return text + _sharing(e)


def _slowed(e: Evidence) -> float | None:
    """How many times longer the step took beside the loader than alone (None: not measured)."""
    if not e.headspace_rate or not e.model_step_s:
        return None
    return e.model_step_s / (e.batch_size / e.headspace_rate)


def _sharing(e: Evidence) -> str:
    slowed = _slowed(e)
    if slowed is None or slowed < SHARED_SLOWDOWN:
        return ""
    return (f" (the step took {_ms(e.model_step_s or 0)} a batch beside the loader against "
            f"{_ms(e.batch_size / (e.headspace_rate or 1))} alone, {slowed:.1f}x: they share the CPU, "
            "the device and Python)")


_MODEL_ADVICE = [
    "the loader is not the problem: a faster one would not speed up training",
    "speed up the step itself: mixed precision, channels_last, torch.compile, a larger batch per GPU",
]
SHARED_SLOWDOWN = 1.2
"""A step this many times slower beside the loader than alone is slowed by the loader's work."""


def _model_advice(e: Evidence) -> list[str]:
    """The step bounds training; if the loader's work slows the step, that is the loader's cost."""
    slowed = _slowed(e)
    if slowed is None or slowed < SHARED_SLOWDOWN:
        return list(_MODEL_ADVICE)
    gpu = _gpu_decode_advice(e)
    return [f"the loop does not wait for data, but the step runs {slowed:.1f}x slower beside the loader "
            "than alone: the loader's decode competes with it for the CPU and the GIL",
            "leave the step cores: fewer loader workers or decode threads (num_workers=, or "
            "PackedDataset(decode_threads=)), or worker processes rather than threads"
            + (f"; or {gpu[0].lower()}{gpu[1:]}" if gpu else ""),
            _MODEL_ADVICE[1]]


def _advice(e: Evidence, group: str, worst: StageLike) -> list[str]:
    cpu_par = max((_par(e, s) for s in e.stages if s.kind == "cpu"), default=1)
    more_workers = (f"use every core: num_workers={e.cores} (this loader runs {cpu_par} at a time)"
                    if cpu_par < e.cores else None)
    out: list[str | None]
    if group == "io" and e.store_bound:
        out = _store_advice(e)
    elif group == "io":
        out = ["pack the files into shards: `fastload pack SRC`, then `fastload bench SRC --packed "
               "SRC.fl` shows the gain (one large file instead of an open/read/close per sample)"
               if e.source == "folder" else
               "re-pack smaller (`fastload pack SRC --max-side 500`): fewer bytes to read per sample",
               "put the data on a local disk (local NVMe, or enough RAM for the page cache) rather than "
               f"a network share: a read costs {_ms(worst.seconds_per_sample)} here",
               "keep more reads in flight: more loader workers than cores help, since reads wait on "
               f"the disk, not the CPU (now {_par(e, worst)} at a time)"]
    elif group == "transfer":
        out = [None if e.pinned else "pin_memory=True: pinned pages copy asynchronously and faster",
               "ship uint8 and normalise on the GPU: fastload.DataLoader(..., device='cuda', mean=..., "
               "std=...) copies 4× fewer bytes than float32",
               "copy on a side stream one batch ahead (fastload.DataLoader(device='cuda'))"]
    elif worst.name.startswith("decode"):
        out = [more_workers, None if e.reduced_decode else _reduced_advice(e), pixel_cache_advice(e.pixel_cache),
               "pre-resize at pack time: `fastload pack SRC --max-side 320` (smaller JPEGs decode faster; "
               "lossy, recorded in the manifest)",
               _gpu_decode_advice(e)]
    else:
        out = [more_workers,
               f"{worst.name} costs {_ms(worst.seconds_per_sample)} per sample: make it cheaper, or run "
               "augmentations on the GPU on uint8 batches"]
    return [a for a in out if a]


def _gpu_decode_advice(e: Evidence) -> str | None:
    """GPU decode, where there is a GPU: nvImageCodec's when it imports here, else DALI's."""
    if not e.cuda:
        return None
    if e.nvimgcodec_installed:
        return ("decode on the GPU: fastload.DataLoader(..., backend='nvimgcodec', device='cuda') (the "
                "hardware JPEG engines where the GPU has them; same batches, order and labels)")
    return ("decode on the GPU with DALI: fastload.DataLoader(..., backend='dali')"
            + ("" if e.dali_installed else " (pip install nvidia-dali-cuda120)"))


def _store_advice(e: Evidence) -> list[str | None]:
    """Far storage: what fixes reads that wait on round trips, or on the store's bandwidth."""
    from fastload.config import format_size

    wait = _ms(e.store_latency_s or 0.0)
    room = f"cache_limit='{format_size(e.dataset_bytes * 1.1)}'" if e.dataset_bytes else "cache_limit="
    holds = e.cached and e.cache_limit is not None and e.dataset_bytes is not None and e.cache_limit >= e.dataset_bytes
    cache = None if holds else (f"give the node cache room for the whole dataset (PackedDataset(url, {room})): "
                                "epochs after the first read the local disk, not the store")
    if e.source == "folder":
        return [f"pack the objects into shards in the store: `fastload pack SRC -o SRC.fl`; a batch's "
                f"records then come in one round of ranged GETs (4 MiB pieces with the node cache) "
                f"instead of a {wait} round trip per object", cache,
                "until then, more requests in flight: more loader workers than cores (they wait on the "
                "network, not the CPU)" if e.store_bound == "latency" else None]
    if e.store_bound == "latency":
        return [None if e.cached else "turn the node cache on (the default: cache_limit=0 turns it off): "
                "records then come in 4 MiB pieces, dozens a request, not one round trip each",
                cache, f"run next to the store (same region or zone): a request waits {wait} here"]
    return [cache,  # (None when the cache holds the dataset already)
            f"the store delivers {e.store_mb_s or 0:.0f} MB/s here: re-pack smaller (`fastload pack SRC "
            "--max-side 500`) to move fewer bytes a sample",
            "run next to the store (same region or zone) or on a faster network"]


def _reduced_advice(e: Evidence) -> str | None:
    text = ("decode at reduced scale: fastload.PackedDataset(path, image_size=224) lets libjpeg decode "
            "at 1/2–1/8 scale whenever the crop allows (pack first: `fastload pack SRC`)")
    if e.reduced_decode_s is None:
        return text
    now = sum(s.seconds_per_sample for s in e.stages
              if s.kind == "cpu" and (s.name.startswith("decode") or s.name == "transform"))
    if e.reduced_decode_s >= 0.9 * now:
        return None  # measured: these images are too small for a reduced decode to pay
    return text + f"; measured here: {_ms(e.reduced_decode_s)} per sample against {_ms(now)} now"
