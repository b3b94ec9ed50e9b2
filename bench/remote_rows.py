"""The rows of bench/remote_bench.py, each run in a process of its own (``--row KIND``): what one
row reads and how, returning its records, seconds and bytes (the run adds the CPU and requests)."""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path
from typing import Any


def peak_mb() -> float:
    """This process's peak resident memory (VmHWM: ru_maxrss would carry the parent's peak over exec)."""
    return _status_mb("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def resident_mb() -> float:
    """This process's resident memory now (VmRSS)."""
    return _status_mb("VmRSS")


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def process_cpu(pid: int) -> float:
    """User + system CPU-seconds process ``pid`` has used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU-seconds of process ``pid`` and its live descendants (a DataLoader's worker processes)."""
    total = process_cpu(pid)
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in task.read_text().split():
            total += tree_cpu(int(child))
    return total


def _batches(order: list[int], size: int = 64) -> list[list[int]]:
    return [order[k:k + size] for k in range(0, len(order), size)]


def row_small_objects(a: dict[str, Any]) -> dict[str, Any]:
    import numpy as np

    from fastload.storage.remote import RemoteStore

    store = RemoteStore(a["photos_url"], a["options"], max_in_flight=a["in_flight"])
    objects = sorted((name, size) for name, size, _ in store.list_objects())  # as S3 lists them
    order = np.random.default_rng(0).permutation(len(objects))[:a["records"]].tolist()
    start, got = time.perf_counter(), 0
    for batch in _batches(order):
        got += sum(len(b) for b in store.read_ranges([(objects[i][0], 0, objects[i][1]) for i in batch]))
    seconds = time.perf_counter() - start
    return {"records": len(order), "seconds": seconds, "bytes": got}


def _dataset(a: dict[str, Any], **kw: Any) -> Any:
    from fastload import PackedDataset

    if a.get("url"):
        return PackedDataset(a["url"], storage_options=a["options"], cache_dir=a.get("cache_dir"),
                             cache_limit=a.get("cache_limit", 0), cache_policy=a.get("policy", "keep"), **kw)
    return PackedDataset(a["local"], **kw)


def _variant(a: dict[str, Any]) -> None:
    """A row comparing a setting side by side with the default: the shards opened one after
    another (as before f2ab580), or the fill's streams or pieces a group."""
    import fastload.readers.base
    import fastload.storage.remote_fill

    if a.get("opens_in_turn"):
        fastload.readers.base.SHARD_OPENS = 1
    if "fill_streams" in a:
        fastload.storage.remote_fill.FILL_STREAMS = a["fill_streams"]
    if "fill_group" in a:
        fastload.storage.remote_fill.FILL_GROUP = a["fill_group"]


def row_raw(a: dict[str, Any]) -> dict[str, Any]:
    """Shuffled raw record reads, a batch of 64 at a time, for ``epochs`` epochs."""
    import numpy as np

    _variant(a)
    ds = _dataset(a)
    if ds.reader.remote is not None:
        ds.reader.remote.store.max_in_flight = a["in_flight"]
    epochs = []
    for epoch in range(a.get("epochs", 1)):
        if a.get("fill"):
            ds.fill_cache()  # as fastload.DataLoader does when an epoch begins
        order = np.random.default_rng([0, epoch]).permutation(len(ds)).tolist()
        start, got = time.perf_counter(), 0
        for batch in _batches(order):
            got += sum(len(p) for p in ds.reader.read_many(batch))
        epochs.append({"records": len(order), "seconds": time.perf_counter() - start, "bytes": got})
    out = dict(epochs[0])
    out["epochs"] = epochs
    if ds.cache is not None:
        out["cache_usage"], out["cache_limit"] = ds.cache.usage(), ds.cache.limit
    return out


def row_train(a: dict[str, Any]) -> dict[str, Any]:
    import fastload

    _variant(a)
    ds = _dataset(a, image_size=224, train=True)
    if ds.reader.remote is not None:
        ds.reader.remote.store.max_in_flight = a["in_flight"]
    loader = fastload.DataLoader(ds, batch_size=64, shuffle=True)
    bed = a.get("bed_pids", [])  # the server's and the proxy's: CPU each epoch took from these cores
    epochs = []
    for epoch in range(a.get("epochs", 1)):
        start, n, first = time.perf_counter(), 0, None
        client, served = tree_cpu(os.getpid()), sum(map(process_cpu, bed))
        for images, _ in loader:
            n += len(images)
            first = first or time.perf_counter() - start
        epochs.append({"records": n, "seconds": time.perf_counter() - start, "first_batch_s": first,
                       "client_cpu_s": tree_cpu(os.getpid()) - client,
                       "bed_cpu_s": sum(map(process_cpu, bed)) - served,
                       "resident_mb": resident_mb()})  # after the epoch: what training goes on holding
    out = dict(epochs[0])
    out["epochs"] = epochs
    out["settings"] = str(loader.settings)
    return out


def row_pread(a: dict[str, Any]) -> dict[str, Any]:
    """The disk's own random-read rate: ``in_flight`` threads each ``pread`` one record at a time,
    the records in the same shuffled order, the shard files cold."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from fastload import PackedDataset
    from fastload.benchmark.stages import drop_cache

    ds = PackedDataset(a["local"])
    order = np.random.default_rng(0).permutation(len(ds)).tolist()
    places = [ds.reader.locate(i) for i in order]  # (fd, offset, size), found before the clock starts
    drop_cache([str(Path(a["local"]) / s.file) for s in ds.manifest.shards])
    start = time.perf_counter()
    with ThreadPoolExecutor(a["in_flight"]) as pool:
        got = sum(pool.map(lambda p: len(os.pread(p[0], p[2], p[1])), places, chunksize=16))
    return {"records": len(order), "seconds": time.perf_counter() - start, "bytes": got}


def row_raw_cold(a: dict[str, Any]) -> dict[str, Any]:
    """fastload's own shuffled raw reads of the local dataset, a batch of 64 at a time, shards cold."""
    import numpy as np

    from fastload import PackedDataset
    from fastload.benchmark.stages import drop_cache

    ds = PackedDataset(a["local"])
    order = np.random.default_rng(0).permutation(len(ds)).tolist()
    ds.reader.read_many(order[:2])  # shards opened (the LMDB page walk) before the clock starts
    drop_cache([str(Path(a["local"]) / s.file) for s in ds.manifest.shards])
    batches = _batches(order)
    start, got = time.perf_counter(), 0
    if a.get("ahead", True):  # the next batch's reads in flight while one is used (what verify does)
        got = sum(len(p) for payloads in ds.reader.read_batches(batches) for p in payloads)
    else:  # a batch at a time: each waits for its slowest read
        got = sum(len(p) for batch in batches for p in ds.reader.read_many(batch))
    return {"records": len(order), "seconds": time.perf_counter() - start, "bytes": got}


def row_pieces(a: dict[str, Any]) -> dict[str, Any]:
    """The store's own ceiling for the cold epoch: every aligned 4 MiB piece of every shard, in a
    shuffled order, 8 at a time (as a cold read fetches them), no cache and no checksums; the rate
    is in records' worth of bytes per second (bytes / mean record size)."""
    import numpy as np

    from fastload.format import read_manifest
    from fastload.storage.remote import RemoteStore
    from fastload.storage.remote_reads import FILL_BUDGET, FILL_PIECE

    manifest = read_manifest(a["local"])
    store = RemoteStore(a["url"], a["options"], max_in_flight=a["in_flight"])
    pieces = [(s.file, start, min(FILL_PIECE, s.bytes - start))
              for s in manifest.shards for start in range(0, s.bytes, FILL_PIECE)]
    order = np.random.default_rng(0).permutation(len(pieces)).tolist()
    per = FILL_BUDGET // FILL_PIECE
    start, got = time.perf_counter(), 0
    for k in range(0, len(order), per):
        got += sum(len(b) for b in store.read_ranges([pieces[i] for i in order[k:k + per]]))
    seconds = time.perf_counter() - start
    return {"records": round(got / (manifest.total_bytes / manifest.num_records)), "seconds": seconds,
            "bytes": got}


def row_connector(a: dict[str, Any]) -> dict[str, Any]:
    """AWS's connector: the small objects one GET each (the small-objects row's order), or with
    ``ranged`` the packed dataset's records one ranged GET each; a batch of 64 at a time."""
    import numpy as np

    from fastload import PackedDataset
    from fastload.benchmark.connector import ConnectorReads, ConnectorTarget

    ranged = a.get("ranged", False)
    reads = ConnectorReads(ConnectorTarget.from_options(a["url"] if ranged else a["photos_url"], a["options"]),
                           a["in_flight"], ranged=ranged)
    if ranged:  # where each record lies, from the local copy of the same shards
        ds = PackedDataset(a["local"])
        shards = [reads.position(s.file) for s in ds.manifest.shards]
        order = np.random.default_rng(0).permutation(len(ds))[:a["records"]].tolist()
        places: list[Any] = [(shards[int(ds.reader.index.shard[i])], *ds.reader.locate(i)[1:]) for i in order]
        read = reads.read_ranges
    else:  # the objects as S3 lists them (the small-objects row's order)
        names = sorted(reads.positions)
        order = np.random.default_rng(0).permutation(len(names))[:a["records"]].tolist()
        places, read = [reads.positions[names[i]] for i in order], reads.read_objects
    start, got = time.perf_counter(), 0
    for batch in _batches(places):
        got += sum(len(b) for b in read(batch))
    return {"records": len(places), "seconds": time.perf_counter() - start, "bytes": got,
            "settings": reads.settings}


ROWS = {"small": row_small_objects, "connector": row_connector, "raw": row_raw, "train": row_train, "pread": row_pread,
        "raw-cold": row_raw_cold, "pieces": row_pieces}
