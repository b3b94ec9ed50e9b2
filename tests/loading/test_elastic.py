"""Resume on another number of ranks (elastic), under torchrun with gloo: a state saved on W ranks
loads on W' and the union of what both runs delivered is a prefix of the epoch's global order,
each sample exactly once (drop_last=True truncates only the end, as an epoch does)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fastload.sampling.order import epoch_order
from tests.conftest import REPO

from .helpers import ID_RECORDS

SCRIPT = Path(__file__).with_name("elastic_rank.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(ranks: int, *args: object) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={ranks}",
               "--master-addr=127.0.0.1", f"--master-port={_free_port()}", str(SCRIPT), *map(str, args)]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]


def delivered(out: Path, ranks: int) -> list[int]:
    return [i for r in range(ranks) for i in json.loads(Path(f"{out}.{r}").read_text())]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("before, after, batches", [(4, 2, 2), (2, 3, 3)])
def test_a_state_saved_on_w_ranks_resumes_on_another_number(id_packed, tmp_path, before, after, batches):
    dataset, state = id_packed("lmdb"), tmp_path / "state.json"
    torchrun(before, dataset, "save", batches, state, tmp_path / "first")
    torchrun(after, dataset, "resume", 0, state, tmp_path / "rest")
    first, rest = delivered(tmp_path / "first", before), delivered(tmp_path / "rest", after)
    assert len(first) == before * batches * 2
    union = first + rest
    assert len(union) == len(set(union))  # no sample twice
    left = ID_RECORDS - len(first)
    assert len(rest) == left - left % after  # drop_last: only the end is cut, fewer than `after`
    assert set(union) == set(epoch_order(ID_RECORDS, seed=7, epoch=0, shuffle=True)[:len(union)].tolist())
