"""What a loader's iterator leaves behind: nothing printed at interpreter exit when a pass is left
unfinished, no worker process once the iterator (or a persistent-workers loader) is dropped, and
no second error from torch's SIGCHLD handler after a worker died (see worker_dies.py)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap

import pytest
import torch

import fastload
from tests.conftest import REPO

from .helpers import Numbers

LEFT_UNFINISHED = """
import torch, fastload
from tests.loading.helpers import Numbers
loader = fastload.DataLoader(Numbers(100), batch_size=2, {args})
it = iter(loader)
next(it)
"""


@pytest.mark.parametrize("args", ["num_workers=0", "mode='threads', num_workers=0", "num_workers=2"])
def test_a_pass_left_unfinished_at_interpreter_exit_prints_nothing(args):
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(LEFT_UNFINISHED.format(args=args))], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # was: Exception ignored in LoaderIterator.__del__ ... TypeError: isinstance()


def _alive(workers) -> int:
    # is_alive() reaps an ended worker; torch's shutdown joins its workers before it returns
    return sum(w.is_alive() for w in workers)


@pytest.mark.parametrize("make", [torch.utils.data.DataLoader, fastload.DataLoader], ids=["torch", "fastload"])
def test_workers_end_with_the_iterator_or_loader_that_owns_them(make):
    """As torch's: an unfinished pass's workers end when its iterator is dropped, or collected in a
    cycle; persistent workers when their loader is deleted."""
    enabled = gc.isenabled()
    gc.disable()  # nothing is collected behind the test's back: each drop shows its own effect
    try:
        loader = make(Numbers(100), batch_size=2, num_workers=2)
        it = iter(loader)
        next(it)
        workers = list(it._workers)
        del it
        assert _alive(workers) == 0

        it = iter(loader)
        next(it)
        workers = list(it._workers)
        holder: dict = {"it": it}
        holder["self"] = holder  # a cycle: only the collector frees it
        del it, holder
        assert _alive(workers) == 2
        gc.collect()
        assert _alive(workers) == 0

        loader = make(Numbers(100), batch_size=2, num_workers=2, persistent_workers=True)
        for _ in loader:
            pass
        it = iter(loader)
        next(it)
        workers = list(it._workers)
        del it
        assert _alive(workers) == 2  # persistent: the loader's, for its next pass
        del loader
        assert _alive(workers) == 0
    finally:
        if enabled:
            gc.enable()


def test_no_second_error_from_torchs_sigchld_handler_after_a_worker_died():
    """The loader's error is raised before torch's SIGCHLD handler has seen the death (a loaded
    machine); then that late SIGCHLD, and another worker killed, raise nothing more: the failed
    pass's workers are stopped and out of torch's handler when the error reaches the loop."""
    result = subprocess.run([sys.executable, "-m", "tests.loading.worker_dies", "fastload"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["first"] is not None and got["first"].startswith("RuntimeError: DataLoader worker"), got
    assert got["again"] is None, got


def test_a_pass_whose_worker_died_ends_there_and_the_loader_starts_anew(tmp_path):
    script = textwrap.dedent("""
        import json, torch, fastload
        from tests.loading.worker_dies import KillsItsWorker
        loader = fastload.DataLoader(KillsItsWorker(40), batch_size=2, num_workers=2, persistent_workers=True)
        it, errors = iter(loader), []
        for _ in range(2):
            try:
                for _ in it:
                    pass
            except RuntimeError as exc:
                errors.append(str(exc))
        KillsItsWorker.__getitem__ = KillsItsWorker.__mro__[1].__getitem__  # new workers: none dies
        labels = sorted(int(y) for _, ys in loader for y in ys)
        print(json.dumps({"errors": errors, "labels": labels}))
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout.strip().splitlines()[-1])
    first, second = got["errors"]
    assert first.startswith("DataLoader worker") and second == f"{first}; this iteration ended there: start a new one"
    assert got["labels"] == list(range(40))  # persistent workers: new ones for the next pass
