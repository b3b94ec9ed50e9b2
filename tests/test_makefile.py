"""The Makefile's set-up: it stops before the big download under a Python too old, and installs
torch's CPU build on any machine (issue 47 item 3)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def _make(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "-C", str(REPO), "--no-print-directory", *argv], capture_output=True,
                          text=True, timeout=120, check=False)


def test_a_python_older_than_3_11_stops_the_set_up_before_any_download(tmp_path):
    """A python3 that says it is 3.10 (this interpreter, its sys.version_info set so by a
    sitecustomize): make fails at once with what to do, and makes no venv."""
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "sitecustomize.py").write_text("import sys\nsys.version_info = (3, 10, 14, 'final', 0)\n")
    python = tmp_path / "python3.10"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'old'} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    venv = tmp_path / "venv"
    # PY=false: were the check missing, the recipe would stop at its first pip, not install for minutes
    done = _make(f"PYTHON={python}", f"VENV={venv}", "PY=false", f"{venv}/.installed-dev")
    assert done.returncode != 0
    assert f"fastload needs Python 3.11 or newer; {python} is 3.10: run make PYTHON=python3.11 (or newer)" in done.stderr
    assert not venv.exists() and "pip" not in done.stdout


def test_the_set_up_installs_the_cpu_build_of_torch(tmp_path):
    venv = tmp_path / "venv"
    planned = _make("-n", f"VENV={venv}", f"{venv}/.installed-dev").stdout
    torch = [line for line in planned.splitlines() if "pip install" in line and "torch==" in line]
    assert torch, planned
    cpu = "torch==2.13.0" if sys.platform == "darwin" else "torch==2.13.0+cpu"
    assert f'"{cpu}"' in torch[0]  # a local wheel pip finds first ...
    assert f'"{cpu}" --extra-index-url https://download.pytorch.org/whl/cpu' in planned  # ... else the CPU index
    assert planned.index("sys.version_info >= (3, 11)") < planned.index(" -m venv ")
