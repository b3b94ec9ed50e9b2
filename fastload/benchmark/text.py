"""The report as text: the rows side by side, the machine's ceilings, the stages and the verdict.

Every line fits a terminal of :data:`WIDTH` columns: the table holds numbers only (each row's
settings, and why a row did not run, follow it as lines of their own), long names wrap in their
column, and prose wraps with its continuation indented.
"""

from __future__ import annotations

import textwrap
from typing import Any, Protocol

from fastload.benchmark.result import RunResult
from fastload.benchmark.spread import Spread, differs
from fastload.config import format_size

WIDTH = 100
"""Columns of the text report: a terminal's."""


class BenchReport(Protocol):
    """What the text is made from: :class:`fastload.benchmark.report.BenchReport`'s fields (which
    renders itself through this module, so this module does not import it)."""

    command: str
    config: dict[str, Any]
    runs: list[RunResult]
    ceilings: dict[str, Any] | None
    stages: list[Any]
    verdict: Any
    interrupted: bool
    notes: list[str]
    reference: dict[str, str | None]
    machine: dict[str, Any]
    headspace: Any  # training.Headspace or None
    load: Any  # machine_load.MachineLoad or None


def format_report(report: BenchReport, *, markdown: bool = False) -> str:
    """The whole report: header, rows (their settings under them, and what each ratio is of),
    ceilings, stages, verdict, notes."""
    parts = [_header(report), _rows(report, markdown), "" if markdown else _settings(report), _legend(report)]
    if report.ceilings:
        parts.append(_ceilings(report.ceilings))
    if report.stages:
        parts.append(_stages(report))
    if report.verdict is not None:
        parts.append(str(report.verdict))
    if report.interrupted:
        parts.append("interrupted: the table holds what was measured before Ctrl-C")
    parts += [f"note: {n}" for n in report.notes]
    return "\n\n".join(p if k == 1 else fit(p) for k, p in enumerate(parts) if p)


def fit(text: str, indent: str = "  ") -> str:
    """Each line of ``text`` wrapped to :data:`WIDTH` columns, its continuation lines indented by
    ``indent`` more than it is (a path or URL longer than a line stays whole)."""
    out = []
    for line in text.splitlines():
        lead = line[:len(line) - len(line.lstrip())]
        out += textwrap.wrap(line, WIDTH, subsequent_indent=lead + indent, break_long_words=False,
                             break_on_hyphens=False) or [""]
    return "\n".join(out)


def _header(report: BenchReport) -> str:
    c, m = report.config, report.machine
    cache = "cold page cache (one pass per row)" if c["cold"] else "warm page cache"
    bound = f"{c['duration_s']:g} s" + (f" or {c['samples']} samples" if c["samples"] else "")
    repeats = c.get("repeats", 1)
    bound += (f" per run, {repeats} runs per row interleaved (median, min–max)" if repeats > 1
              else " per row")
    headspace = report.headspace
    step = (f", model step {c['model_step_ms']:g} ms" if c.get("model_step_ms") else
            f", model step: {headspace.step}" if headspace is not None else
            ", model step: a callable" if c.get("model_step_callable") else "")
    return (f"fastload {report.command}: {c['source']}; batches of {c['batch_size']}, "
            f"{c['image_size']} px train crops, {cache}, {bound}{step}\n"
            f"machine: {m['cores']} cores ({m['cpu']}), torch {m['torch']}, Pillow {m['pillow']}, "
            f"CUDA {m['cuda'] or 'none'}\n"
            f"fastload JPEG decode: {m.get('jpeg_decoder', 'not recorded')}"
            + (f"\n{report.load}" if report.load is not None else ""))


def _rows(report: BenchReport, markdown: bool) -> str:
    waits = bool(report.config.get("model_step_ms") or report.config.get("model_step_callable"))
    headspace = report.headspace
    refs = {name for name in report.reference.values() if name}
    speeds = bool(refs)
    spread = report.config.get("repeats", 1) > 1
    head = ["run", "samples/s", *(["min–max"] if spread else []), "MB/s", *(["× ref"] if speeds else []),
            *(["data wait", "step ms"] if waits else []), *(["× headspace"] if headspace else []),
            "peak MB", *(["settings"] if markdown else [])]
    lines = [_cells(r, r.name in refs, speeds, waits, spread, headspace, _doubt(report, r) is not None)
             + ([_settings_of(r)] if markdown else []) for r in report.runs]
    if headspace is not None:
        blank = [""] * (spread + 1 + speeds)
        lines.insert(0, [f"headspace: {headspace.step}", f"{headspace.samples_per_s:.0f}", *blank,
                         *(["", f"{headspace.step_ms:.1f}"] if waits else []), "1.00x", "",
                         *([_headspace_settings(headspace)] if markdown else [])])
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 2) + "---|"]
        return "\n".join(out + ["| " + " | ".join(cells) + " |" for cells in lines])
    widths = [max(len(str(row[k])) for row in [head, *lines]) for k in range(1, len(head))]
    room = max(10, WIDTH - sum(widths) - 2 * len(widths))  # what the names may take
    name_width = min(room, max(len(row[0]) for row in [head, *lines]))
    text = []
    for row in [head, *lines]:
        names = textwrap.wrap(row[0], name_width, subsequent_indent="  ", break_long_words=True) or [""]
        numbers = "  ".join(str(cell).rjust(w) for cell, w in zip(row[1:], widths))
        text.append(f"{names[0].ljust(name_width)}  {numbers}".rstrip())
        text += names[1:]
    return "\n".join(text)


def _cells(r: RunResult, is_ref: bool, speeds: bool, waits: bool, spread: bool, headspace: Any,
           doubtful: bool) -> list[str]:
    blank = [""] * (speeds + 2 * waits + spread + bool(headspace))
    if r.status in ("skipped", "failed") or not r.samples:
        return [r.name, r.status, "", *blank, ""]
    mark = "?" if doubtful else ""
    speed = ["ref" if is_ref else (f"{r.speedup:.2f}x{mark}" if r.speedup is not None else "")] if speeds else []
    wait = [f"{r.wait_fraction:.0%}" if r.wait_fraction is not None else "",
            f"{r.step_ms:.1f}" if r.step_ms is not None else ""] if waits else []
    share = ([f"{r.samples_per_s / headspace.samples_per_s:.2f}x" if r.kind != "raw" else ""]
             if headspace else [])
    rss = f"{r.peak_rss_mb:.0f}" if r.peak_rss_mb else ""
    span = [f"{r.min:.0f}–{r.max:.0f}" if r.min is not None and r.max is not None else ""] if spread else []
    return [r.name, f"{r.samples_per_s:.0f}", *span, f"{r.mb_per_s:.1f}", *speed, *wait, *share, rss]


def _settings_of(r: RunResult) -> str:
    """A row's settings and, when it did not finish, why: a worker's traceback stays in the JSON,
    the text shows its first and last line."""
    if r.status in ("skipped", "failed") or not r.samples:
        return f"{r.status}: {_one_line(r.note)}" if r.note else r.status
    return r.settings + (f" [{r.status}: {r.note}]" if r.status != "ok" else "")


def _headspace_settings(headspace: Any) -> str:
    return ("the step alone, on one batch already on the device" if headspace.steps
            else "the stand-in's own rate: batch size / its sleep")


def _settings(report: BenchReport) -> str:
    """Each row's settings (and why a row did not run), under the table."""
    lines = [f"  {r.name}: {_settings_of(r)}" for r in report.runs if _settings_of(r)]
    if report.headspace is not None:
        lines.insert(0, f"  headspace: {report.headspace.step}: {_headspace_settings(report.headspace)}")
    return "\n".join(["settings of each row:", *lines]) if lines else ""


def _reference_of(report: BenchReport, r: RunResult) -> tuple[RunResult | None, str]:
    """The row ``r``'s ``× ref`` divides by, and the rate it compares (raw rows: MB/s)."""
    name = report.reference.get("raw" if r.kind == "raw" else "pipeline")
    ref = next((x for x in report.runs if x.name == name), None)
    return ref, "mb_per_s" if r.kind == "raw" else "samples_per_s"


def _doubt(report: BenchReport, r: RunResult) -> str | None:
    """Why ``r``'s ratio to its reference says neither is faster (None: it says one is). Two
    ways: its paired ratio and the ratio of its median to the reference's fall on opposite sides
    of 1, or the two rows' medians differ by less than either one's spread over the repeats."""
    ref, attr = _reference_of(report, r)
    if r.speedup is None or ref is None or ref is r or not getattr(ref, attr):
        return None
    unit = "MB/s" if attr == "mb_per_s" else "samples/s"
    of_medians = getattr(r, attr) / getattr(ref, attr)
    if (r.speedup - 1) * (of_medians - 1) < 0:
        return (f"? {r.name}: its median {unit} is {of_medians:.2f}x {ref.name!r}'s, its runs paired one by "
                f"one {r.speedup:.2f}x: the runs varied more than the rows differ, so neither is known "
                "faster; re-run with more --repeats on a quieter machine")
    mine, theirs = (r.per_repeat, ref.per_repeat) if attr == "samples_per_s" else (r.per_repeat_mb_s,
                                                                                      ref.per_repeat_mb_s)
    if len(mine) < 2 or len(theirs) < 2 or differs(Spread.of(mine), Spread.of(theirs)):
        return None
    return (f"? {r.name}: {Spread.of(mine).text()} {unit} against {ref.name!r}'s {Spread.of(theirs).text()} "
            "(median, slowest–fastest run): the runs overlap, a difference smaller than their spread, so "
            "neither is known faster; re-run with more --repeats on a quieter machine")


def _legend(report: BenchReport) -> str:
    """What each ratio in the table is a ratio of."""
    lines = []
    paired = ("run by run (each run's ratio to the same round's run of it), the median of those"
              if report.config.get("repeats", 1) > 1 else "in the same run")
    if report.reference.get("pipeline"):
        lines.append(f"× ref: a row's samples/s over those of {report.reference['pipeline']!r} (ref), {paired}")
    if report.reference.get("raw"):
        lines.append(f"× ref of raw reads: a row's MB/s over that of {report.reference['raw']!r}, {paired}")
    lines += [doubt for r in report.runs if (doubt := _doubt(report, r))]
    headspace = report.headspace
    if headspace is not None:
        alone = ("on a batch already on the device" if headspace.steps else
                 "by construction (batch size / its sleep)")
        lines.append(f"× headspace: a row's samples/s under the step over the step's own "
                     f"{headspace.samples_per_s:.0f} samples/s {alone} (1.00x: "
                     "the loader keeps the model busy); data wait: the loop's time inside next(); "
                     "step ms: the step's time per batch in that row's loop")
        above = [r.name for r in report.runs if r.samples and r.kind != "raw" and r.samples_per_s > 1.1 * headspace.samples_per_s]
        if above and headspace.steps:
            lines.append(f"? {', '.join(above)}: above the headspace, which cannot be: the step alone was timed "
                         "slower than in the loop (a busy machine); re-run on a quieter one")
    elif report.config.get("model_step_ms") or report.config.get("model_step_callable"):
        lines.append("data wait: the loop's time inside next(); step ms: the step's time per batch")
    return "\n".join(lines)


def _one_line(note: str | None) -> str:
    """A row's note in one line: a worker's traceback stays in the JSON, the table shows its last line."""
    lines = [ln for ln in (note or "").splitlines() if ln.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0]} ... {lines[-1].strip()}"


def _ceilings(c: dict[str, Any]) -> str:
    parts = [f"full-size JPEG decode {c['decode_per_core']:.0f}/s per core × {c['cores']} cores = "
             f"{c['decode_ceiling']:.0f}/s (all cores at once: {c['decode_all_cores_measured']:.0f}/s)"]
    if c.get("decode_reduced_per_core"):
        train = f"fastload's train decode {c['decode_reduced_per_core']:.0f}/s per core"
        if c.get("decode_reduced_pillow_per_core"):
            train += f" (whole-image Pillow path: {c['decode_reduced_pillow_per_core']:.0f}/s)"
        parts.append(train)
    parts.append(f"memory copy {format_size(c['memcpy_mb_s'] * 1e6)}/s")
    reads = f"record reads, 16 in flight: warm {c['read_warm_mb_s']:.0f} MB/s"
    if c.get("read_cold_mb_s"):
        reads += f", cold {c['read_cold_mb_s']:.0f} MB/s"
    parts.append(reads)
    if c.get("disk_sequential_mb_s"):
        parts.append(f"sequential disk read (cold) {c['disk_sequential_mb_s']:.0f} MB/s")
    if c.get("store_latency_ms"):
        parts.append(f"object store: {c['store_latency_ms']:.0f} ms a request alone; "
                     f"{c['store_in_flight']:.0f} at once in {c['store_round_ms']:.0f} ms, "
                     f"{c['store_mb_s']:.0f} MB/s")
    if c.get("h2d_pinned_mb_s"):
        parts.append(f"host→GPU copy {c['h2d_pinned_mb_s']:.0f} MB/s pinned, "
                     f"{c['h2d_pageable_mb_s']:.0f} MB/s pageable")
    return "ceilings:\n" + "\n".join(f"  {p}" for p in parts)


def _stages(report: BenchReport) -> str:
    lines = [("stages alone, ms per sample on one thread: the median of 5 timing rounds (fastest–slowest); "
              "×N: how many run at once in this loader")]
    width = max(len(s.name) for s in report.stages)
    for s in report.stages:
        note = f"  ({s.note})" if s.note else ""
        spread = (f"({s.low * 1e3:.3f}–{s.high * 1e3:.3f})" if s.low is not None and s.high is not None
                  and s.high > s.low else "")
        lines.append(f"  {s.name.ljust(width)}  {s.seconds_per_sample * 1e3:8.3f} {spread:<15} ×{s.parallel}{note}")
    return "\n".join(lines)
