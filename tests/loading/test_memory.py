"""Worker memory stays flat over epochs of many tiny records (the index is NumPy, not Python lists:
copy-on-write would otherwise make every worker's memory grow as it touches the objects)."""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import pytest

import fastload

from .helpers import write_tiny_list

RECORDS = 200_000
EPOCHS = 5
# Allowed growth of each process from the end of epoch 1 to the end of epoch 5 (a leak per epoch).
# Measured here: workers +0.0-0.1 MB RSS and private, the main process under 3 MB of private.
MARGIN_MB = 10
# Allowed growth of a worker's private memory from its start to the end of epoch 5. A worker that
# touches Python objects inherited from the parent copies their pages (refcounts are writes): with a
# list of 200,000 strings in the Dataset, measured +15 MB, nearly all in epoch 1, which the per-epoch
# check above cannot see. The NumPy index: +1-2 MB (allocator arenas, batch buffers).
START_MARGIN_MB = 8


def count_batch(batch: list[tuple[bytes, int]]) -> tuple[int, int]:
    """A collate_fn that returns just how many records (and bytes) the batch held."""
    return len(batch), sum(len(data) for data, _ in batch)


def note_worker(folder: str, worker_id: int) -> None:
    """A worker_init_fn: leave this worker's pid and private memory at its start for the test."""
    import h5py  # noqa: F401  (the HDF5 reader's one-time import is not growth)

    Path(folder, f"worker{worker_id}").write_text(f"{os.getpid()} {memory_mb(os.getpid())['private']}")


def memory_mb(pid: int) -> dict[str, float]:
    """Resident, proportional and private memory of a process, from /proc (MB)."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0])  # kB
    return {"rss": fields["Rss"] / 1024, "pss": fields["Pss"] / 1024,
            "private": (fields["Private_Clean"] + fields["Private_Dirty"]) / 1024}


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    """200,000 16-byte records packed into one HDF5 shard, and how long making them took: a list
    names 1,000 files 200 times each (200,000 files of their own took 3 minutes to make and delete
    on a busy disk, past the test's timeout)."""
    from fastload.converters import pack

    base = tmp_path_factory.mktemp("tiny")
    started = time.perf_counter()
    listing = write_tiny_list(base / "files", RECORDS, files=1_000)
    made = time.perf_counter()
    # HDF5: the LMDB writer cannot pack this many records (see the test report).
    pack(listing, base / "tiny.fl", format="hdf5", extensions=[".bin"], progress=False)
    packed = time.perf_counter()
    return base / "tiny.fl", {"write_s": made - started, "pack_s": packed - made}


@pytest.mark.slow
@pytest.mark.timeout(900)  # a fixed amount of work (~35 s here quiet): the limit only catches a hang
def test_worker_memory_is_flat_over_epochs(tiny_dataset, tmp_path):
    path, timings = tiny_dataset
    ds = fastload.PackedDataset(path)
    assert len(ds) == RECORDS and ds.manifest.kind == "files"
    loader = fastload.DataLoader(ds, batch_size=1024, shuffle=True, num_workers=2, persistent_workers=True,
                                 collate_fn=count_batch,
                                 worker_init_fn=functools.partial(note_worker, str(tmp_path)))
    seen: list[dict[int, dict[str, float]]] = []
    for _ in range(EPOCHS):
        records = nbytes = 0
        for count, size in loader:
            records += count
            nbytes += size
        assert (records, nbytes) == (RECORDS, 16 * RECORDS)  # each record once, read in full
        notes = [p.read_text().split() for p in tmp_path.glob("worker*")]
        workers = {int(pid): float(mb) for pid, mb in notes}
        seen.append({pid: memory_mb(pid) for pid in [*sorted(workers), os.getpid()]})
    pids = list(seen[0])
    assert len(pids) == 3 and list(seen[-1]) == pids  # the same two workers served every epoch
    report = "; ".join(
        (f"worker {pid}: private at start {workers[pid]:.1f} MB, " if pid in workers else f"main {pid}: ")
        + ", ".join(f"{k} {seen[0][pid][k]:.1f}→{seen[-1][pid][k]:.1f} MB"
                    for k in ("rss", "pss", "private"))
        for pid in pids)
    print(f"made the list of {RECORDS} records in {timings['write_s']:.1f} s, packed in {timings['pack_s']:.1f} s; {report}")
    for pid in pids:
        # The main process's "private" also counts pages it shared with its workers that a worker
        # has since copied (a refcount touched in the child leaves the parent's page unshared): it
        # rose 11 MB with RSS unchanged to the 0.1 MB in a run here. Its RSS is what it holds.
        for kind in ("rss", "private") if pid in workers else ("rss",):
            assert seen[-1][pid][kind] - seen[0][pid][kind] <= MARGIN_MB, report
        if pid in workers:
            assert seen[-1][pid]["private"] - workers[pid] <= START_MARGIN_MB, report
