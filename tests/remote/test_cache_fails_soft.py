"""The node cache fails soft: a full cache disk (tmpfs or ext4), a damaged cached header, or a
planted file in the cache folder is a warning and a read from the store, never a crash or a false
"damaged"; a store copy that is itself damaged is still refused as before."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastload.converters import pack
from fastload import PackedDataset
from fastload.errors import ManifestError
from fastload.storage.remote import RemoteStore
from tests.storage.small_disk import ext4, tmpfs

REPO = Path(__file__).resolve().parents[2]
RECORDS = 40


@pytest.fixture(scope="module")
def packed(tmp_path_factory, s3_server):
    """40 noise JPEGs (~1.2 MB: more than the 1 MiB cache disks below) packed to the store in
    LMDB and HDF5, several shards each, and locally as the reference."""
    root = tmp_path_factory.mktemp("soft")
    for i in range(RECORDS):
        folder = root / "images" / f"c{i % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = np.random.default_rng(i).integers(0, 256, (160, 160, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:02d}.jpg", format="JPEG", quality=95)
    bucket = s3_server.make_bucket("fails-soft")
    for fmt in ("lmdb", "hdf5"):
        pack(root / "images", f"s3://{bucket}/{fmt}.fl", format=fmt, shard_size="400KB", progress=False,
             storage_options=s3_server.storage_options(), staging=root / f"staging-{fmt}")
        pack(root / "images", root / f"local-{fmt}.fl", format=fmt, shard_size="400KB", progress=False)
    return root, bucket


def _url(packed, fmt: str) -> str:
    return f"s3://{packed[1]}/{fmt}.fl"


def _want(packed, fmt: str) -> list[bytes]:
    return PackedDataset(packed[0] / f"local-{fmt}.fl").reader.read_many(list(range(RECORDS)))


def _remote(packed, s3_server, fmt: str, cache: Path, url: str | None = None) -> PackedDataset:
    return PackedDataset(url or _url(packed, fmt), storage_options=s3_server.storage_options(), cache_dir=cache)


# --- a full cache disk ------------------------------------------------------------------------------

LEAVE = [0, 1, 2, 3, 4, 6, 8, 12, 10**9]  # blocks left free on the cache's disk (10**9: no ballast)


def _read_on_full_disk(packed, s3_server, disk: Path) -> list[dict]:
    """Every record read twice through a cache on ``disk`` for each LEAVE, in a process of its own."""
    digest = hashlib.sha256(b"".join(_want(packed, "lmdb"))).hexdigest()
    args = {"url": _url(packed, "lmdb"), "options": s3_server.storage_options(), "disk": str(disk),
            "leave": LEAVE, "records": RECORDS, "digest": digest}
    done = subprocess.run([sys.executable, "-m", "tests.remote.full_cache_reader", json.dumps(args)],
                          check=False, cwd=REPO, capture_output=True, text=True, timeout=240)
    if done.returncode < 0:
        pytest.fail(f"the reader was killed by {signal.Signals(-done.returncode).name} after "
                    f"{done.stdout.count(chr(10))} of {len(LEAVE)} disks:\n{done.stdout}{done.stderr[-3000:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def _check_full_disk_runs(runs: list[dict], disk: Path) -> None:
    assert [run["leave"] for run in runs] == LEAVE
    assert all(run["ok"] for run in runs), runs  # every record right, on every disk
    for run in runs:  # too full for every shard (the dataset is larger than the disk): said once
        said = run["warnings"]
        assert len(said) == 1 and "no room" in said[0], said
        assert str(disk / "cache") in said[0] and "free space" in said[0] and "cache_dir" in said[0]
    assert runs[0]["cached"] == 0 and runs[-1]["cached"] > 0  # what fits is kept


def test_a_full_tmpfs_cache_reads_from_the_store_without_sigbus(packed, s3_server, tmp_path):
    """tmpfs: a store into a mapped page the disk has no room for is SIGBUS, not ENOSPC."""
    with tmpfs(tmp_path / "disk", "1m") as disk:
        _check_full_disk_runs(_read_on_full_disk(packed, s3_server, disk), disk)


def test_a_full_ext4_cache_reads_from_the_store_without_enospc(packed, s3_server, tmp_path):
    with ext4(tmp_path / "disk", "2M") as disk:
        _check_full_disk_runs(_read_on_full_disk(packed, s3_server, disk), disk)


# --- a damaged cached copy --------------------------------------------------------------------------

def _cached_data(cache: Path, shard: str) -> Path:
    """The cache entry's data file holding ``shard``'s bytes."""
    for meta in cache.glob("*/meta.json"):
        if f"/{shard}|" in json.loads(meta.read_text())["key"]:
            return meta.with_name("data")
    raise AssertionError(f"{shard} is not in the cache {cache}")


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


# the LMDB meta page's magic number (after its 16-byte page header); the HDF5 superblock's signature
FIRST_PAGES = {"lmdb": 16, "hdf5": 1}


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_a_damaged_cached_header_is_fetched_again(packed, s3_server, fmt, tmp_path):
    want = _want(packed, fmt)
    assert _remote(packed, s3_server, fmt, tmp_path / "c").reader.read_many(list(range(RECORDS))) == want
    first = PackedDataset(packed[0] / f"local-{fmt}.fl").manifest.shards[0].file
    _flip(_cached_data(tmp_path / "c", first), FIRST_PAGES[fmt])  # a bad disk, a power cut
    with pytest.warns(UserWarning, match=f"cached copy of .*{first} was damaged .*read it again from the store"):
        again = _remote(packed, s3_server, fmt, tmp_path / "c").reader.read_many(list(range(RECORDS)))
    assert again == want
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cache holds the store's bytes again: no warning now
        assert _remote(packed, s3_server, fmt, tmp_path / "c").reader.read_many(list(range(RECORDS))) == want


def test_a_damaged_cached_record_is_fetched_again(packed, s3_server, tmp_path):
    want = _want(packed, "hdf5")
    ds = _remote(packed, s3_server, "hdf5", tmp_path / "c")
    assert ds.reader.read_many(list(range(RECORDS))) == want
    shard, offset, size = ds.reader.locate(3)
    _flip(_cached_data(tmp_path / "c", shard.name), offset + size // 2)
    again = _remote(packed, s3_server, "hdf5", tmp_path / "c")
    with pytest.warns(UserWarning, match=f"cached copy of .*{shard.name} was damaged .*record 3 .*checksum"):
        assert again.reader.read_many([3]) == [want[3]]


@pytest.mark.parametrize(("fmt", "damaged"), [("lmdb", "damaged LMDB shard"),
                                              ("hdf5", "not a readable fastload HDF5 shard")])
def test_a_damaged_header_in_the_store_is_still_damaged(packed, s3_server, s3_bucket, fmt, damaged, tmp_path):
    local = tmp_path / "damaged.fl"
    shutil.copytree(packed[0] / f"local-{fmt}.fl", local)
    first = PackedDataset(local).manifest.shards[0].file
    _flip(local / first, FIRST_PAGES[fmt])
    store = RemoteStore(f"s3://{s3_bucket}/damaged.fl", s3_server.storage_options())
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        store.put_bytes(path.relative_to(local).as_posix(), path.read_bytes())
    for _ in range(2):  # the second through a cache holding the damaged bytes
        ds = _remote(packed, s3_server, fmt, tmp_path / "c", url=store.url)
        with warnings.catch_warnings(), pytest.raises(ManifestError, match=f"{first}: {damaged} .*re-pack"):
            warnings.simplefilter("error", UserWarning)  # and no word of a damaged cached copy
            ds.reader.read_many([0])


# --- planted files in the cache folder --------------------------------------------------------------

def test_a_linked_lock_is_a_warning_and_the_reads_come_from_the_store(packed, s3_server, tmp_path):
    cache = tmp_path / "c"
    cache.mkdir()
    (cache / ".lock").symlink_to(tmp_path / "elsewhere")
    with pytest.warns(UserWarning, match=f"{cache}.*\\.lock.*symbolic link"):
        got = _remote(packed, s3_server, "lmdb", cache).reader.read_many(list(range(RECORDS)))
    assert got == _want(packed, "lmdb")
    assert not os.path.lexists(tmp_path / "elsewhere")  # never followed


def test_a_cached_reader_left_open_exits_quietly(packed, s3_server, tmp_path):
    """A script that reads through the cache and ends without closing anything: the entries' files
    are closed as the interpreter exits, with nothing printed (their module globals may be gone)."""
    script = ("import json, sys\nfrom fastload import PackedDataset\n"
              "a = json.loads(sys.argv[1])\n"
              "ds = PackedDataset(a['url'], storage_options=a['options'], cache_dir=a['cache'])\n"
              "print(sum(len(b) for b in ds.reader.read_many(list(range(a['records'])))))\n")
    args = {"url": _url(packed, "lmdb"), "options": s3_server.storage_options(), "cache": str(tmp_path / "cache"),
            "records": RECORDS}
    done = subprocess.run([sys.executable, "-c", script, json.dumps(args)], check=False, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout) == sum(len(b) for b in _want(packed, "lmdb"))
    assert done.stderr == "", done.stderr[-3000:]
