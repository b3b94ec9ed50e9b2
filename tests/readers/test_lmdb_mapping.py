"""LMDB reader memory: pages a read maps are unmapped from the process once the records are copied."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from converters import pack
from fastload.dataset import PackedDataset
from fastload.readers import lmdb_mapping
from tests.conftest import write_tree


def mapped_kb(start: int, length: int) -> int:
    """Resident kB of this process's mapping that begins at ``start`` (from /proc/self/smaps)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for k, line in enumerate(lines):
        fields = line.split()
        if "-" in fields[0] and int(fields[0].split("-")[0], 16) == start:
            return next(int(ln.split()[1]) for ln in lines[k + 1:] if ln.startswith("Rss:"))
    raise AssertionError(f"no mapping at {start:#x}")


@pytest.fixture(scope="module")
def big_records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An LMDB dataset of 60 noise JPEGs of ~40 KB each, in one shard (~2.3 MB)."""
    base = tmp_path_factory.mktemp("lmdb-mapping")
    rng = np.random.default_rng(0)
    files = {}
    for i in range(60):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (160, 200, 3), dtype=np.uint8)).save(buf, "JPEG", quality=95)
        files[f"c/{i:03d}.jpg"] = buf.getvalue()
    write_tree(base / "images", files)
    pack(base / "images", base / "big.fl", format="lmdb", workers=1, progress=False)
    return base / "big.fl"


def test_reads_leave_no_shard_pages_mapped(big_records):
    ds = PackedDataset(big_records)
    reader = ds.reader
    payloads = reader.read_raw(list(range(len(ds))))
    total_kb = sum(map(len, payloads)) // 1024
    assert total_kb > 2000
    env = reader.handle(0)
    start, length = lmdb_mapping.find_mapping(big_records / ds.manifest.shards[0].file)
    assert length >= reader.manifest.shards[0].bytes
    assert mapped_kb(start, length) < 256  # a read's pages went back

    # The same reads straight through liblmdb, without the release: the pages stay mapped.
    with env.begin(buffers=False) as txn:
        assert sum(len(v) for _, v in txn.cursor()) // 1024 == total_kb
    assert mapped_kb(start, length) > total_kb // 2
    lmdb_mapping.release(env)
    assert mapped_kb(start, length) < 256
    # ... and reading again gives the same bytes (the pages fault back in from the page cache).
    assert reader.read_raw(list(range(len(ds)))) == payloads


def test_a_file_that_is_not_mapped_has_no_mapping(tmp_path):
    path = tmp_path / "plain"
    path.write_bytes(b"x" * 10)
    assert lmdb_mapping.find_mapping(path) is None
    assert lmdb_mapping.find_mapping(tmp_path / "missing") is None
