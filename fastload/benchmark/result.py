"""One run's measurements: what a timed run of a contender delivered, and whether it finished."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

RunKind = Literal["baseline", "fastload", "dali", "raw"]
Status = Literal["ok", "partial", "skipped", "failed"]


@dataclass
class RunResult:
    """What one run measured; ``status`` says whether it finished, was cut short or never ran."""

    name: str
    kind: RunKind
    source: str
    status: Status = "ok"
    samples: int = 0
    batches: int = 0
    seconds: float = 0.0
    samples_per_s: float = 0.0
    mb_per_s: float = 0.0
    wait_fraction: float | None = None
    step_ms: float | None = None  # under a model step: its mean time per batch in this row's loop
    peak_rss_mb: float | None = None
    speedup: float | None = None
    settings: str = ""
    note: str | None = None
    median: float | None = None  # samples/s over the repeats that delivered (samples_per_s too)
    min: float | None = None
    max: float | None = None
    per_repeat: list[float] = field(default_factory=list)  # samples/s of each repeat, in order
    per_repeat_mb_s: list[float] = field(default_factory=list)
    loader: Any = field(default=None, repr=False, compare=False)  # kept for doctor, never serialised

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "loader"}
