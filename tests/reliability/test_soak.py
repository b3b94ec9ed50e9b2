"""Load over time: 8 processes reading the same shards for 2 minutes, and 20 epochs through the
same persistent workers: no errors, no wrong data, and memory that stops growing after warm-up.

Both run with `make test-all` (marker `reliability`)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import fastload
from tests.conftest import REPO, many_small_jpegs

pytestmark = pytest.mark.reliability

READERS = 8
SOAK_S = 120
# Allowed growth after warm-up. Anonymous memory is what a leak grows (shards are read with
# pread, not mapped; file-backed pages are the libraries').
ANON_MARGIN_MB = 8
RSS_MARGIN_MB = 16


@pytest.fixture(scope="module")
def both_storages(tmp_path_factory) -> tuple[Path, Path]:
    """2000 small JPEGs packed twice: LMDB and HDF5, ~60 shards each."""
    from fastload.converters import pack

    base = tmp_path_factory.mktemp("soak")
    many_small_jpegs(base / "src", 2000)
    for storage in ("lmdb", "hdf5"):
        pack(base / "src", base / f"{storage}.fl", format=storage, shard_size="64KB", progress=False)
    return base / "lmdb.fl", base / "hdf5.fl"


def test_8_processes_reading_the_same_shards_for_2_minutes(both_storages):
    lmdb_dir, hdf5_dir = both_storages
    procs = [subprocess.Popen([sys.executable, "-m", "tests.reliability.soak_reader", str(lmdb_dir),
                               str(hdf5_dir), str(SOAK_S), str(seed)],
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: os.nice(10))
             for seed in range(READERS)]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=SOAK_S + 300)
        assert proc.returncode == 0, f"reader failed: {out}\n{err}"
        reports.append(json.loads(out.strip().splitlines()[-1]))
    summary = "; ".join(f"{r['batches']} batches, rss {r['warm']['rss']:.0f}→{r['end']['rss']:.0f} MB, "
                        f"anon {r['warm']['anon']:.0f}→{r['end']['anon']:.0f} MB" for r in reports)
    print(summary)
    for r in reports:
        assert r["error"] is None and r["batches"] > 100, summary
        assert r["end"]["anon"] - r["warm"]["anon"] <= ANON_MARGIN_MB, summary
        assert r["end"]["rss"] - r["warm"]["rss"] <= RSS_MARGIN_MB, summary


# --- 20 epochs, persistent workers ----------------------------------------------------------------

EPOCHS = 20


def memory_mb(pid: int) -> dict[str, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0]) / 1024
    return {"rss": fields["Rss"], "anon": fields["Anonymous"]}


def note_worker(folder: str, worker_id: int) -> None:
    Path(folder, f"worker{worker_id}").write_text(str(os.getpid()))


def test_20_epochs_through_persistent_workers_keep_memory_and_handles_flat(both_storages, tmp_path):
    lmdb_dir, _ = both_storages
    ds = fastload.PackedDataset(lmdb_dir, image_size=32, train=True)
    loader = fastload.DataLoader(ds, batch_size=32, shuffle=True, num_workers=2, persistent_workers=True,
                                 worker_init_fn=functools.partial(note_worker, str(tmp_path)))
    seen: list[dict[str, object]] = []
    for epoch in range(EPOCHS):
        labels = [y for _, batch_labels in loader for y in batch_labels.tolist()]
        assert sorted(labels) == sorted(ds.targets.tolist()), f"epoch {epoch}"
        pids = [int(p.read_text()) for p in sorted(tmp_path.glob("worker*"))]
        seen.append({"pids": pids, "fds": len(os.listdir("/proc/self/fd")),
                     "memory": {pid: memory_mb(pid) for pid in [os.getpid(), *pids]}})
    first, last = seen[1], seen[-1]  # from the end of epoch 2: after warm-up
    assert first["pids"] == last["pids"] and len(last["pids"]) == 2  # the same workers throughout
    report = "; ".join(f"{'main' if pid == os.getpid() else 'worker'} {pid}: "
                       + ", ".join(f"{k} {first['memory'][pid][k]:.1f}→{last['memory'][pid][k]:.1f} MB"
                                   for k in ("rss", "anon"))
                       for pid in first["memory"]) + f"; open fds {first['fds']}→{last['fds']}"
    print(report)
    for pid in first["memory"]:
        assert last["memory"][pid]["anon"] - first["memory"][pid]["anon"] <= ANON_MARGIN_MB, report
        assert last["memory"][pid]["rss"] - first["memory"][pid]["rss"] <= RSS_MARGIN_MB, report
    assert last["fds"] <= first["fds"] + 2, report  # no shared-memory handles left behind per batch
