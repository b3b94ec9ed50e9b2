"""``fastload pack SRC --ray --quiet`` prints its summary and no line of Ray's own: the Ray the pack
starts logs errors only (issue 39, item 7). A Ray of the pack's own, in a process of its own, so
not the package's two-node cluster."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import many_small_jpegs

FASTLOAD = Path(sys.executable).parent / "fastload"  # the installed CLI, as a user runs it


def test_a_quiet_ray_pack_prints_no_ray_log_line(tmp_path: Path) -> None:
    pytest.importorskip("ray", reason="the Ray tests need ray[data]: pip install -e '.[ray]'")
    many_small_jpegs(tmp_path / "images", 8, classes=2)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a local Ray, whatever runs here
    done = subprocess.run([str(FASTLOAD), "pack", "images", "-o", "images.fl", "--ray", "--quiet"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("packed 8 records"), done.stdout
    ray_lines = [line for line in done.stderr.splitlines() if re.search(r"\b(INFO|WARNING)\b", line)]
    assert not ray_lines, f"--quiet printed Ray's log lines:\n{done.stderr}"
