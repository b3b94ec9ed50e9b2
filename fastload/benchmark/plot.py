"""The report as a bar chart (PNG) for pasting into a report; needs matplotlib (``fastload[plot]``)."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastload.optional import require

if TYPE_CHECKING:
    from fastload.benchmark.report import BenchReport

_COLOURS = {"baseline": "#9e9e9e", "fastload": "#1f77b4", "dali": "#2ca02c", "raw": "#ff7f0e"}


def write_plot(report: BenchReport, path: str | os.PathLike[str]) -> Path:
    """Horizontal bars: decoded samples/s, raw-read MB/s and (doctor) each stage's samples/s;
    with repeats, each bar is the median and its whisker the range (min–max) over the repeats.
    Dashed lines mark the decode ceiling and, under a model step, the step's headspace: a bar
    short of that line is a loader holding training back."""
    require("matplotlib", "the benchmark chart (--plot)")
    # The object API: no pyplot, so no GUI backend and no global figure state.
    figure_cls = importlib.import_module("matplotlib.figure").Figure
    panels = _panels(report)
    if not panels:
        panels = [("nothing was measured", [], [], False)]
    height = sum(1.0 + 0.38 * max(1, len(p[1])) for p in panels)
    fig = figure_cls(figsize=(9, max(2.5, height)), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (title, bars, marks, log) in zip(axes, panels):
        names = [b[0] for b in bars][::-1]
        values = [b[1] for b in bars][::-1]
        colours = [_COLOURS.get(b[2], "#1f77b4") for b in bars][::-1]
        spans = [b[3] for b in bars][::-1]
        whiskers = [[v - lo for v, (lo, _) in zip(values, spans)], [hi - v for v, (_, hi) in zip(values, spans)]]
        ax.barh(names, values, color=colours,
                xerr=whiskers if any(lo != hi for lo, hi in spans) else None, capsize=3)
        for y, (v, (lo, hi)) in enumerate(zip(values, spans)):
            span = f" ({_num(lo)}–{_num(hi)})" if lo != hi else ""
            ax.text(max(v, hi), y, f" {_num(v)}{span}", va="center", fontsize=8)
        for k, (label, value, colour) in enumerate(marks):
            ax.axvline(value, color=colour, linestyle="--", linewidth=1)
            ax.text(value, -0.5 + 0.35 * k, f" {label}", color=colour, fontsize=8, va="bottom")
        if log:  # stage rates span orders of magnitude (collate is nearly free)
            ax.set_xscale("log")
        ax.set_title(title, fontsize=10, loc="left")
        ax.margins(x=0.2)
        ax.tick_params(labelsize=8)
    c = report.config
    repeats = c.get("repeats", 1)
    fig.suptitle(f"fastload {report.command}: {Path(c['source']).name}, batch {c['batch_size']}, "
                 f"{'cold' if c['cold'] else 'warm'} cache, {report.machine['cores']} cores"
                 + (f"; median and range of {repeats} runs" if repeats > 1 else ""),
                 fontsize=10)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=120)
    return out


Bar = tuple[str, float, str, tuple[float, float]]  # name, value (median), kind, (min, max)
Mark = tuple[str, float, str]  # a dashed line: label, value, colour
Panel = tuple[str, list[Bar], list[Mark], bool]  # title, bars, marked lines, log scale


def _panels(report: BenchReport) -> list[Panel]:
    decoded = [(r.name, r.samples_per_s, r.kind, _span(r.per_repeat, r.samples_per_s))
               for r in report.measured() if r.kind != "raw"]
    raw = [(r.name, r.mb_per_s, r.kind, _span(r.per_repeat_mb_s, r.mb_per_s)) for r in report.measured("raw")]
    c: dict[str, Any] = report.ceilings or {}
    panels: list[Panel] = []
    if decoded:
        marks: list[Mark] = [("decode ceiling", c["decode_ceiling"], "#d62728")] if c.get("decode_ceiling") else []
        title = "train pipeline, samples/s (higher is better)"
        if report.headspace is not None:
            marks.append((f"model headspace ({report.headspace.step})", report.headspace.samples_per_s, "#9467bd"))
            title = "training under the model step, samples/s (the headspace: the step alone)"
        panels.append((title, decoded, marks, False))
    if raw:
        disk: list[Mark] = ([("sequential disk", c["disk_sequential_mb_s"], "#d62728")]
                            if c.get("disk_sequential_mb_s") else [])
        panels.append(("raw shuffled reads, MB/s", raw, disk, False))
    if report.stages:
        bars = [(f"{s.name} ×{s.parallel}", rate, "fastload", (rate, rate))
                for s in report.stages if s.seconds_per_sample > 0 for rate in [s.parallel / s.seconds_per_sample]]
        panels.append(("stages alone, samples/s at this loader's parallelism (log scale)", bars, [], True))
    return panels


def _span(values: list[float], value: float) -> tuple[float, float]:
    return (min(values), max(values)) if values else (value, value)


def _num(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.1f}"
