"""bench/gpu_check.sh, the device check, run for real here (no GPU: its first steps only, at once):
it stops with exit status 1 naming the missing GPU, a failed step is named and fails the whole,
and a step past its budget is stopped and counted as a failure."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "bench" / "gpu_check.sh"
pytestmark = pytest.mark.skipif(shutil.which("nvidia-smi") is not None,
                                reason="a GPU machine: the script would run the whole 8-minute check")


def check(tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "OUT": str(tmp_path / "out"), "PATH": "/usr/bin:/bin", **env})


def test_without_a_gpu_it_stops_at_once_naming_the_missing_gpu(tmp_path):
    done = check(tmp_path)
    assert done.returncode == 1
    assert "this machine has no CUDA GPU" in done.stdout and "lent GPU machine" in done.stdout
    assert "FAILED: cuda" in done.stdout and "install" not in done.stdout  # nothing after it ran
    assert (tmp_path / "out").is_dir() and any((tmp_path / "out").glob("gpu-check-*.log"))


def test_a_planted_failure_fails_the_check_naming_the_step(tmp_path):
    done = check(tmp_path, GPU_CHECK_PLANT="machine")
    assert done.returncode == 1
    assert "machine: a failure planted by GPU_CHECK_PLANT" in done.stdout
    assert "FAILED: machine (failed (exit status 3))" in done.stdout


def test_a_step_past_its_budget_is_stopped_and_counted_as_failed(tmp_path):
    """The script's own step runner (the script sourced): a 30 s sleep under a 1 s budget."""
    status = tmp_path / "status.tsv"
    code = f'source "{SCRIPT}"; STATUS="{status}"; run_step slow 1 sleep 30; echo "rc=$?"'
    done = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert "rc=124" in done.stdout and "slow: timed out after 1s" in done.stdout
    name, rc, seconds, budget, verdict = status.read_text().strip().split("\t")
    assert (name, rc, budget, verdict) == ("slow", "124", "1", "timed out after 1s") and int(seconds) < 10
