"""LMDB reader memory: pages a read maps are unmapped from the process once the records are copied."""

from __future__ import annotations

import io
import shutil
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
    """An LMDB dataset of 120 noise JPEGs of ~40 KB each, in one shard (~4.6 MB)."""
    base = tmp_path_factory.mktemp("lmdb-mapping")
    rng = np.random.default_rng(0)
    files = {}
    for i in range(120):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (160, 200, 3), dtype=np.uint8)).save(buf, "JPEG", quality=95)
        files[f"c/{i:03d}.jpg"] = buf.getvalue()
    write_tree(base / "images", files)
    pack(base / "images", base / "big.fl", format="lmdb", workers=1, progress=False)
    return base / "big.fl"


def read_in_batches(reader, count: int, after_each=lambda: None) -> list[bytes]:
    out = []
    for k in range(0, count, 4):
        out += reader.read_raw(list(range(k, min(k + 4, count))))
        after_each()
    return out


def test_reads_keep_about_the_release_budget_mapped(big_records, monkeypatch):
    ds = PackedDataset(big_records)
    reader = ds.reader
    env = reader.handle(0)
    # Copied out through liblmdb's map: every page read stays mapped.
    with env.begin(buffers=False) as txn:
        payloads = [value for _, value in txn.cursor()]
    total_kb = sum(map(len, payloads)) // 1024
    assert total_kb > 4000
    start, length = lmdb_mapping.find_mapping(big_records / ds.manifest.shards[0].file)
    assert length >= reader.manifest.shards[0].bytes
    assert mapped_kb(start, length) > total_kb * 3 // 4

    monkeypatch.setattr(lmdb_mapping, "RELEASE_EVERY", 512 * 1024)
    lmdb_mapping.note_read(512 * 1024)  # the budget is reached: every tracked shard is released
    assert mapped_kb(start, length) < 128
    peaks: list[int] = []
    again = read_in_batches(reader, len(ds), lambda: peaks.append(mapped_kb(start, length)))
    assert again == payloads  # the reader's pread copies: the bytes liblmdb gives
    # Releases happened, and between them what a read maps stays within a few budgets (the
    # reader reads records with pread; the B-tree pages liblmdb walks fault in with the
    # page-cache pages around them).
    assert 0 in peaks and max(peaks) <= 4 * 512 < total_kb // 2, peaks


def test_records_are_read_with_pread_where_the_map_is_known(big_records, tmp_path):
    import lmdb

    ds = PackedDataset(big_records)
    env = ds.reader.handle(0)
    assert lmdb_mapping._maps[env][2] >= 0  # located and opened: copy_out reads the file
    with env.begin(buffers=True) as txn:
        for _, value in txn.cursor():
            copied = lmdb_mapping.copy_out(env, value)
            assert type(copied) is bytes and copied == bytes(value)
    # An environment it could not locate (never tracked): copied from the map, same bytes.
    shutil.copy(big_records / ds.manifest.shards[0].file, tmp_path / "copy.lmdb")
    other = lmdb.open(str(tmp_path / "copy.lmdb"), subdir=False, readonly=True, lock=False)
    assert other not in lmdb_mapping._maps
    with other.begin(buffers=True) as txn, env.begin(buffers=False) as theirs:
        for key, value in txn.cursor():
            assert lmdb_mapping.copy_out(other, value) == theirs.get(key)
    other.close()


def test_a_file_that_is_not_mapped_has_no_mapping(tmp_path):
    path = tmp_path / "plain"
    path.write_bytes(b"x" * 10)
    assert lmdb_mapping.find_mapping(path) is None
    assert lmdb_mapping.find_mapping(tmp_path / "missing") is None


def test_a_closed_environment_is_never_advised(big_records, tmp_path, monkeypatch):
    import lmdb

    path = tmp_path / "shard.lmdb"
    shutil.copy(big_records / PackedDataset(big_records).manifest.shards[0].file, path)
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    lmdb_mapping.track(env, path)
    advised: list[tuple] = []
    monkeypatch.setattr(lmdb_mapping, "_advise", lambda *args: advised.append(args))
    lmdb_mapping.release(env)
    assert len(advised) == 1  # open: released
    env.close()  # unmapped: advising the range now could zero whatever is mapped there next
    lmdb_mapping.release(env)
    assert len(advised) == 1
