"""One reader of the soak test: random batches from the LMDB and the HDF5 copy of one dataset for
a while, checking every batch, then one JSON line of what it did and how its memory moved.

python -m tests.reliability.soak_reader LMDB_DIR HDF5_DIR SECONDS SEED
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import numpy as np


def memory_mb() -> dict[str, float]:
    """Resident and anonymous (heap, not file-backed) memory of this process, from /proc (MB)."""
    fields = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        fields[name] = int(value.split()[0]) / 1024
    return {"rss": fields["Rss"], "anon": fields["Anonymous"]}


def main(argv: list[str]) -> int:
    import fastload
    from fastload.samples.collate import collate_images

    lmdb_dir, hdf5_dir, seconds, seed = argv[0], argv[1], float(argv[2]), int(argv[3])
    rng = np.random.default_rng(seed)
    decoded = fastload.PackedDataset(lmdb_dir, image_size=32, train=True, decode_threads=1)
    lmdb_raw, hdf5_raw = fastload.PackedDataset(lmdb_dir), fastload.PackedDataset(hdf5_dir)
    n = len(decoded)
    labels = decoded.targets
    report = {"batches": 0, "records": 0, "error": None}
    started = time.monotonic()
    warm = None
    try:
        while time.monotonic() - started < seconds:
            batch = rng.integers(0, n, 32).tolist()
            images, got = collate_images(decoded.__getitems__(batch))
            assert images.shape == (32, 3, 32, 32) and got.tolist() == labels[batch].tolist()
            some = batch[:8]
            assert lmdb_raw.reader.read_many(some) == hdf5_raw.reader.read_many(some)
            report["batches"] += 1
            report["records"] += len(batch) + 2 * len(some)
            if warm is None and time.monotonic() - started > seconds / 5:
                warm = memory_mb()  # after the warm-up: page cache, allocator arenas, handles
            time.sleep(0.01)  # a loop step: the machine is shared
    except BaseException:
        report["error"] = traceback.format_exc()
    report["warm"] = warm
    report["end"] = memory_mb()
    print(json.dumps(report), flush=True)
    return 0 if report["error"] is None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
