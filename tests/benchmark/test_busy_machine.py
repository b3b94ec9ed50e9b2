"""tune, doctor and bench beside a real CPU hog: they say the machine is busy, and decide only what
the spread of their repeats allows (issue 47 item 1).

The hog is ``yes > /dev/null``, one per core, started by this module and killed at its end. Each
is started through a shell that exits at once, so the hog is not a descendant of this process:
what the commands measure as their own CPU time leaves it out, as it leaves out any program
running beside them. The assertions are about what is printed given the load and the spreads
measured, never about speed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastload.benchmark import bench, doctor
from fastload.benchmark.capacity import GROUPS, group_spread
from fastload.benchmark.spread import differs
from fastload.config import available_cpus
from fastload.dataset import PackedDataset

QUICK = {"batch_size": 4, "image_size": 32, "duration": 300.0, "samples": 8, "stage_budget": 0.1,
         "progress": False, "repeats": 2}

pytestmark = pytest.mark.skipif(not Path("/proc/stat").exists() or shutil.which("timeout") is None,
                                reason="the machine's load is read from /proc (Linux); the hog needs timeout(1)")


@pytest.fixture(scope="module")
def hog() -> Iterator[list[int]]:
    """One ``yes > /dev/null`` per core this process may use, for the module's tests; each under
    ``timeout 600``, so that a test run killed outright does not leave it spinning."""
    pids: list[int] = []
    try:
        for _ in range(available_cpus()):
            shown = subprocess.run(["sh", "-c", "timeout 600 yes > /dev/null 2>&1 & echo $!"], capture_output=True,
                                   text=True, check=True, timeout=30)
            pids.append(int(shown.stdout))
        yield pids
    finally:
        for pid in pids:  # timeout passes SIGTERM on to its yes, then exits
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def _named_only_where_the_spread_allows(report) -> None:
    """A bottleneck named by the verdict stands clear of the next stage group, round for round."""
    v = report.verdict
    assert v is not None, report.table()
    if v.bottleneck is None:
        assert v.label == "too noisy to name the bottleneck" and "overlap across their timing rounds" in v.reason
        return
    if v.bottleneck == "model":
        return
    cores = report.machine["cores"]
    spreads = {g: group_spread(report.stages, cores, g) for g in GROUPS}
    others = [g for g in GROUPS if g != v.bottleneck and spreads[g].median > 0]
    if others:
        runner = max(others, key=lambda g: spreads[g].median)
        assert differs(spreads[v.bottleneck], spreads[runner]), report.table()


def test_tune_beside_a_hog_says_the_machine_is_busy_and_keeps_auto(hog, photos):
    import fastload

    dataset = PackedDataset(photos("lmdb"), image_size=32, train=True)
    grid = [{"num_workers": 0}, {"num_workers": "auto"}, {"num_workers": 1, "prefetch_factor": 2}]
    best = fastload.tune(dataset, batch_size=4, batches=1, candidates=grid, repeats=2, progress=False)
    auto = fastload.DataLoader(dataset, batch_size=4).settings
    assert "a busy machine" in best.reasons["machine load"], best
    assert best.reasons["tune"].startswith("too noisy to choose: the machine was busy (other processes used ")
    assert best == auto and "chosen by tune" not in str(best)


def test_doctor_beside_a_hog_says_the_machine_is_busy(hog, photos):
    report = doctor(photos("lmdb"), **QUICK)
    assert report.load is not None and report.load.busy, report.table()
    flat = " ".join(report.table().split())
    assert "a busy machine, so the numbers move from run to run; rerun on a quiet machine" in flat
    assert report.runs[0].min is not None and len(report.runs[0].per_repeat) == 2  # the spread, shown
    _named_only_where_the_spread_allows(report)
    if report.verdict.bottleneck is not None:
        assert "measured on a busy machine" in report.verdict.doubt


def test_bench_beside_a_hog_says_the_machine_is_busy_and_marks_rows_within_the_noise(hog, photos):
    report = bench(photos("folder"), [photos("lmdb")], dali=False, torch_grid=[(1, 2)], stages=True,
                   include=("baseline", "fastload"), **QUICK)
    assert report.load is not None and report.load.busy, report.table()
    text = report.table()
    assert "a busy machine" in " ".join(text.split())
    _named_only_where_the_spread_allows(report)
    for r in report.measured():  # a ratio whose runs overlap the reference's is marked, and only then
        ref = next(x for x in report.runs if x.name == report.reference["raw" if r.kind == "raw" else "pipeline"])
        if r is ref or r.speedup is None:
            continue
        mine, theirs = (r.per_repeat, ref.per_repeat) if r.kind != "raw" else (r.per_repeat_mb_s, ref.per_repeat_mb_s)
        overlap = min(mine) <= max(theirs) and min(theirs) <= max(mine)
        contradicted = (r.speedup - 1) * ((r.mb_per_s / ref.mb_per_s if r.kind == "raw" else
                                           r.samples_per_s / ref.samples_per_s) - 1) < 0
        row = next(ln for ln in text.splitlines() if ln.startswith(r.name + " "))
        assert (f"{r.speedup:.2f}x?" in row) == (overlap or contradicted), (row, mine, theirs)
