"""The node cache: whole-block writes and reads, the size limit across processes, the two eviction
policies, SIGKILL at random moments, damaged entries, entries carried into other processes, and
failing soft (a full disk, files planted in the cache folder, I/O errors)."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import multiprocessing
import os
import pickle
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

import fastload.storage.cache_entry_files
from fastload.errors import CacheWarning
from fastload.storage.cache import NodeCache
from fastload.storage.cache_entry import BlocksMissing, CacheEntry
from fastload.storage.cache_entry_files import BLOCK
from tests.storage.small_disk import fill_up, tmpfs

CTX = multiprocessing.get_context("fork")


def key(shard: int, dataset: str = "ds") -> str:
    return f"s3://bucket/{dataset}/shard-{shard:05d}.lmdb|etag-{shard}"


def content(shard: int, offset: int, length: int) -> bytes:
    """The remote file's bytes: 8-byte words counting up, tagged with the shard (a misplaced or
    stale block never matches)."""
    first = offset // 8
    words = np.arange(first, first + length // 8 + 2, dtype="<u8") + (shard << 40)
    return words.tobytes()[offset % 8:offset % 8 + length]


def fill(entry: CacheEntry, shard: int, blocks: int = 2, whole: bytes | None = None) -> None:
    """Fetch-and-keep every missing span, ``blocks`` blocks per write (as a reader would); ``whole``
    is the file's content made in advance."""
    for start, length in entry.missing([(0, entry.size)]):
        for offset in range(start, start + length, blocks * BLOCK):
            length_here = min(blocks * BLOCK, start + length - offset)
            data = content(shard, offset, length_here) if whole is None else \
                memoryview(whole)[offset:offset + length_here]
            entry.write(offset, data)


def check_present(entry: CacheEntry, shard: int) -> int:
    """Every present block reads back the right bytes; returns how many blocks were present."""
    count = 0
    for offset in range(0, entry.size, BLOCK):
        length = min(BLOCK, entry.size - offset)
        if not entry.missing([(offset, length)]):
            assert entry.read(offset, length) == content(shard, offset, length), (shard, offset)
            count += 1
    return count


def on_disk(directory: Path) -> dict[str, dict]:
    """The sidecars of the whole entries in the cache folder, by entry name."""
    found = {}
    for path in directory.iterdir():
        if not path.name.startswith(".") and (path / "meta.json").exists():
            found[path.name] = json.loads((path / "meta.json").read_text())
    return found


def shard_of(meta: dict) -> int:
    return int(meta["key"].split("shard-")[1][:5])


# --- one entry ------------------------------------------------------------------------------------

def test_round_trip_missing_and_invalidate(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path / "cache", 10 * BLOCK)
    size = 3 * BLOCK + 100
    entry = cache.entry(key(1), size, "ds")
    assert entry is not None and entry.size == size and entry.present_bytes() == 0
    # unaligned ranges widen to whole blocks, adjacent ones merge, the end is clipped to the file
    assert entry.missing([(10, 5), (BLOCK - 1, 2)]) == [(0, 2 * BLOCK)]
    assert entry.missing([(2 * BLOCK + 5, 10**9), (0, 1)]) == [(0, BLOCK), (2 * BLOCK, BLOCK + 100)]
    assert entry.missing([(size, 10), (5, 0)]) == []
    with pytest.raises(BlocksMissing, match="not all cached"):
        entry.read(0, 10)

    entry.write(0, content(1, 0, BLOCK))
    entry.write(3 * BLOCK, content(1, 3 * BLOCK, 100))  # the short last block ends at the end of file
    assert entry.missing([(0, size)]) == [(BLOCK, 2 * BLOCK)]
    assert entry.present_bytes() == BLOCK + 100
    assert entry.read(7, 1000) == content(1, 7, 1000)
    assert entry.read(3 * BLOCK + 50, 50) == content(1, 3 * BLOCK + 50, 50)
    with pytest.raises(BlocksMissing):
        entry.read(BLOCK - 10, 20)  # straddles into an absent block
    with pytest.raises(ValueError, match="past the end"):
        entry.read(size - 10, 20)

    for offset, data in ((100, b"x" * BLOCK), (BLOCK, b"x" * 100), (3 * BLOCK, b"x" * 200)):
        with pytest.raises(ValueError, match="not whole"):
            entry.write(offset, data)  # unaligned start, unaligned end, past the end
    assert entry.write(BLOCK, memoryview(content(1, BLOCK, 2 * BLOCK))) is True
    assert entry.missing([(0, size)]) == [] and entry.present_bytes() == size

    entry.invalidate(BLOCK + 10, BLOCK)  # covers blocks 1 and 2
    assert entry.missing([(0, size)]) == [(BLOCK, 2 * BLOCK)]
    assert check_present(entry, 1) == 2
    assert cache.usage() == size
    [info] = cache.entries()
    assert (info.dataset, info.size, info.present) == ("ds", size, BLOCK + 100)
    entry.close()
    assert entry.read(0, 10) == content(1, 0, 10)  # a later use opens the files again


def test_nothing_admitted_past_the_limit(tmp_path: Path) -> None:
    assert NodeCache(tmp_path / "a", 0).entry(key(1), 10, "ds") is None
    cache = NodeCache(tmp_path / "b", 4 * BLOCK)
    assert cache.entry(key(1), 4 * BLOCK + 1, "ds") is None
    empty = cache.entry(key(2), 0, "ds")
    assert empty is not None and empty.missing([(0, 10)]) == [] and empty.read(0, 0) == b""
    assert cache.usage() == 0


def test_threads_write_and_read_one_entry(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path, 64 * BLOCK)
    entry = cache.entry(key(3), 40 * BLOCK + 8, "ds")
    assert entry is not None

    def work(part: int) -> None:
        for block in range(part, 41, 4):
            offset = block * BLOCK
            entry.write(offset, content(3, offset, min(BLOCK, entry.size - offset)))
            assert entry.read(offset, 8) == content(3, offset, 8)

    threads = [threading.Thread(target=work, args=(part,)) for part in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert entry.missing([(0, entry.size)]) == [] and check_present(entry, 3) == 41


def test_a_claimed_piece_excludes_other_threads_until_released(tmp_path: Path) -> None:
    entry = NodeCache(tmp_path, 8 * BLOCK).entry(key(6), 4 * BLOCK, "ds")
    assert entry is not None
    mine = entry.claim(1)
    assert mine is not None
    assert entry.claim(1) is None  # the same process, another fetch: excluded too
    other = entry.claim(2)  # another piece is free
    assert other is not None
    waited = threading.Event()

    def wait() -> None:
        entry.wait(1)
        waited.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert not waited.wait(0.3)  # still fetching
    mine.release()
    waiter.join(timeout=60)  # a guard against a hang: it wakes as soon as the claim is released
    assert waited.is_set()
    again = entry.claim(1)
    assert again is not None
    again.release()
    other.release()


# --- other processes ------------------------------------------------------------------------------

def _claim_and_sleep(entry: CacheEntry, piece: int, claimed: Any) -> None:
    assert entry.claim(piece) is not None
    claimed.set()
    time.sleep(60)


def test_a_released_claim_is_free_though_a_forked_child_holds_its_descriptor(tmp_path: Path) -> None:
    entry = NodeCache(tmp_path, 8 * BLOCK).entry(key(8), 4 * BLOCK, "ds")
    assert entry is not None
    claim = entry.claim(0)
    assert claim is not None
    child = CTX.Process(target=time.sleep, args=(60,))  # a DataLoader worker forked mid-fetch
    child.start()
    try:
        claim.release()
        again = entry.claim(0)
        assert again is not None  # the child's copy of the descriptor holds nothing
        again.release()
    finally:
        child.kill()
        child.join()


def test_a_claim_excludes_other_processes_and_dies_with_its_holder(tmp_path: Path) -> None:
    entry = NodeCache(tmp_path, 8 * BLOCK).entry(key(7), 4 * BLOCK, "ds")
    assert entry is not None
    claimed = CTX.Event()
    child = CTX.Process(target=_claim_and_sleep, args=(entry, 3, claimed))
    child.start()
    try:
        assert claimed.wait(120)  # a guard against a hang (a forked child on a loaded machine)
        assert entry.claim(3) is None  # the child is fetching it
        os.kill(child.pid, signal.SIGKILL)  # killed mid-fetch: the kernel drops its claim
        child.join(10)
        entry.wait(3)  # returns: no one holds it now
        mine = entry.claim(3)
        assert mine is not None
        mine.release()
    finally:
        child.kill()
        child.join()

def _write_block(entry: CacheEntry, block: int) -> None:
    entry.write(block * BLOCK, content(4, block * BLOCK, BLOCK))


def test_forked_and_pickled_entries_open_their_own_files(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path, 8 * BLOCK)
    entry = cache.entry(key(4), 4 * BLOCK, "ds")
    assert entry is not None
    _write_block(entry, 0)
    state = entry.__getstate__()
    assert state["_files"] is None and state["_pid"] == -1  # no descriptor travels
    copy = pickle.loads(pickle.dumps(entry))
    assert copy.read(0, BLOCK) == content(4, 0, BLOCK)

    child = CTX.Process(target=_write_block, args=(entry, 2))
    child.start()
    child.join()
    assert child.exitcode == 0
    # the child's mark went to the shared map: both handles here see it
    assert entry.missing([(0, 4 * BLOCK)]) == [(BLOCK, BLOCK), (3 * BLOCK, BLOCK)]
    assert copy.read(2 * BLOCK, BLOCK) == content(4, 2 * BLOCK, BLOCK)


def test_an_evicted_entry_stays_readable_and_comes_back_on_write(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path, 4 * BLOCK)
    entry = cache.entry(key(5), 2 * BLOCK, "ds")
    assert entry is not None
    fill(entry, 5)
    NodeCache(tmp_path, 4 * BLOCK).clear()  # another process evicts it
    assert cache.usage() == 0 and on_disk(tmp_path) == {}
    assert entry.read(100, 1000) == content(5, 100, 1000)  # the unlinked file is still open here
    assert entry.write(0, content(5, 0, BLOCK)) is True  # admitted again, not into the unlinked file
    assert cache.usage() == 2 * BLOCK and entry.present_bytes() == BLOCK
    [info] = cache.entries()
    assert info.present == BLOCK


SIZES = [(8 + 6 * i) * BLOCK + 4096 * (i % 4) for i in range(12)]  # 0.5 to 4.7 MB, some ending short
LIMIT = 5 * sum(SIZES) // 12


def _two_epochs(directory: str, policy: str, seed: int) -> None:
    cache = NodeCache(directory, LIMIT, policy)  # type: ignore[arg-type]
    rng = random.Random(seed)
    for _ in range(2):
        order = list(range(12))
        rng.shuffle(order)
        for shard in order:
            entry = cache.entry(key(shard), SIZES[shard], "ds")
            assert cache.usage() <= LIMIT  # checked at every admission too, not only by the watcher
            if entry is not None:
                fill(entry, shard, blocks=rng.choice((1, 3)))
                check_present(entry, shard)
                entry.close()


def _allocated_and_reserved(directory: Path) -> tuple[int, int]:
    """Disk used by the entries' data files and the sizes they reserve, read while no admission
    or eviction runs (the cache's own lock), so the sums are of one moment."""
    fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        allocated = reserved = 0
        for name, meta in on_disk(directory).items():
            try:
                allocated += os.stat(directory / name / "data").st_blocks * 512
            except FileNotFoundError:
                continue
            reserved += meta["size"]
        return allocated, reserved
    finally:
        os.close(fd)


@pytest.mark.parametrize("policy", ["lru", "keep"])
def test_the_limit_holds_across_processes(tmp_path: Path, policy: str) -> None:
    workers = [CTX.Process(target=_two_epochs, args=(str(tmp_path), policy, seed)) for seed in range(4)]
    cache = NodeCache(tmp_path, LIMIT, policy)  # type: ignore[arg-type]
    for worker in workers:
        worker.start()
    peak, running = [0, 0, 0], True
    while running:
        running = any(worker.is_alive() for worker in workers)  # one more look once all are done
        allocated, reserved = _allocated_and_reserved(tmp_path)
        peak = [max(peak[0], allocated), max(peak[1], reserved), max(peak[2], cache.usage())]
        time.sleep(0.001)
    for worker in workers:
        worker.join()
        assert worker.exitcode == 0
    assert max(peak) <= LIMIT, peak
    assert peak[0] > LIMIT // 2  # the watcher saw the cache well filled, not just empty moments
    for meta in on_disk(tmp_path).values():
        entry = cache.entry(meta["key"], meta["size"], "ds")
        assert entry is not None
        check_present(entry, shard_of(meta))
    assert cache.usage() == sum(meta["size"] for meta in on_disk(tmp_path).values()) <= LIMIT


# --- eviction policies ----------------------------------------------------------------------------

def _epochs(cache: NodeCache, shards: int, size: int, epochs: int) -> list[dict[str, int]]:
    """Per epoch, how each shard was met: hit (all present), created (admitted empty), through (None)."""
    rng, counts = random.Random(7), []
    for _ in range(epochs):
        count = {"hit": 0, "created": 0, "through": 0}
        order = list(range(shards))
        rng.shuffle(order)
        for shard in order:
            entry = cache.entry(key(shard), size, "ds")
            if entry is None:
                count["through"] += 1
                continue
            count["hit" if entry.present_bytes() == size else "created"] += 1
            fill(entry, shard)
        counts.append(count)
    return counts


def test_keep_holds_a_fixed_half_where_lru_churns(tmp_path: Path) -> None:
    size = 4 * BLOCK
    keep = _epochs(NodeCache(tmp_path / "keep", 4 * size, "keep"), 8, size, epochs=4)
    lru = _epochs(NodeCache(tmp_path / "lru", 4 * size, "lru"), 8, size, epochs=4)
    assert keep[0] == {"hit": 0, "created": 4, "through": 4}
    assert all(epoch == {"hit": 4, "created": 0, "through": 4} for epoch in keep[1:])  # 4/8 = cache/dataset
    assert lru[0] == {"hit": 0, "created": 8, "through": 0}
    assert all(epoch["created"] >= 4 and epoch["hit"] < 4 for epoch in lru[1:]), lru  # evicts, refetches
    assert sum(e["hit"] for e in lru[1:]) < sum(e["hit"] for e in keep[1:])


def test_keep_evicts_other_datasets_lru_first_never_its_own(tmp_path: Path) -> None:
    size = 2 * BLOCK
    cache = NodeCache(tmp_path, 4 * size, "keep")

    def names(dataset: str) -> set[int]:
        return {shard_of(m) for m in on_disk(tmp_path).values() if m["dataset"] == dataset}

    for shard in range(4):
        assert cache.entry(key(shard, "a"), size, "a") is not None
    assert cache.entry(key(0, "a"), size, "a") is not None  # used again: now a1 is a's least recent
    assert cache.entry(key(10, "b"), size, "b") is not None
    assert names("a") == {0, 2, 3} and names("b") == {10}
    assert cache.entry(key(11, "b"), size, "b") is not None
    assert names("a") == {0, 3}
    assert cache.entry(key(4, "a"), size, "a") is not None  # a makes room from b, its least recent
    assert names("a") == {0, 3, 4} and names("b") == {11}
    assert cache.entry(key(12, "b"), size, "b") is not None
    assert names("a") == {0, 4} and names("b") == {11, 12}

    cache.clear("b")
    for shard in (5, 6):
        assert cache.entry(key(shard, "a"), size, "a") is not None
    assert cache.entry(key(7, "a"), size, "a") is None  # full of its own dataset: read through
    assert names("a") == {0, 4, 5, 6} and cache.usage() == 4 * size
    assert NodeCache(tmp_path, 4 * size, "lru").entry(key(7, "a"), size, "a") is not None
    assert names("a") == {4, 5, 6, 7}  # lru evicts the same dataset's least recent


# --- SIGKILL and damage ---------------------------------------------------------------------------

KILL_SIZES = [(16 + 5 * i) * BLOCK + 4096 * i for i in range(5)]
KILL_LIMIT = 3 * 24 * BLOCK


def _churn(directory: str, seed: int, started: Any) -> None:
    """Admit, write big spans, invalidate and evict in a loop until killed; the content is made in
    advance so that most of the time goes to writing (where a kill must not leave a wrong block).
    ``started`` is set once the first entry is filled: the kill comes after that, however slow
    the machine is."""
    cache, rng = NodeCache(directory, KILL_LIMIT, "lru"), random.Random(seed)
    wholes = [content(shard, 0, size) for shard, size in enumerate(KILL_SIZES)]
    while True:
        shard = rng.randrange(5)
        entry = cache.entry(key(shard), KILL_SIZES[shard], "ds")
        if entry is None:
            continue
        fill(entry, shard, blocks=rng.choice((1, 8, 32)), whole=wholes[shard])
        started.set()
        entry.invalidate(rng.randrange(entry.size), rng.randrange(8 * BLOCK))
        if rng.random() < 0.2:
            cache.clear()


def check_all(cache: NodeCache, directory: Path) -> None:
    """Every present block of every entry holds its bytes; usage is the entries' sizes, in the limit."""
    metas = on_disk(directory)
    for meta in metas.values():
        entry = cache.entry(meta["key"], meta["size"], "ds")
        assert entry is not None
        check_present(entry, shard_of(meta))
        entry.close()
    assert cache.usage() == sum(m["size"] for m in metas.values()) <= cache.limit
    assert sum(info.size for info in cache.entries()) == cache.usage()


def test_sigkill_at_random_moments_leaves_no_wrong_block(tmp_path: Path) -> None:
    rng, cache = random.Random(3), NodeCache(tmp_path, KILL_LIMIT, "lru")
    admitted = False
    for seed in range(20):
        started = CTX.Event()
        child = CTX.Process(target=_churn, args=(str(tmp_path), seed, started))
        child.start()
        assert started.wait(60), "the child filled no entry in 60 s"
        time.sleep(rng.uniform(0.0, 0.2))  # then a random moment of its churn
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        assert child.exitcode == -signal.SIGKILL
        admitted = admitted or bool(on_disk(tmp_path))
        check_all(cache, tmp_path)  # as the kill left it, before anything sweeps
    assert admitted, "no kill found an entry on disk (each child may have just cleared the cache)"

    (tmp_path / ".tmp-0123-999999").mkdir()  # as a process killed while making an entry leaves it
    (tmp_path / ".tmp-0123-999999" / "data").write_bytes(b"x")
    assert cache.entry(key(9), 8 * BLOCK, "ds") is not None  # the next admission sweeps temporaries
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    check_all(cache, tmp_path)


@pytest.mark.parametrize("damage", ["sidecar", "sidecar-fields", "map-size", "map-bytes", "data-size"])
def test_a_damaged_entry_is_dropped_and_made_again(tmp_path: Path, damage: str) -> None:
    cache = NodeCache(tmp_path, 10 * BLOCK)
    for shard in (1, 2):
        entry = cache.entry(key(shard), 3 * BLOCK, "ds")
        assert entry is not None
        fill(entry, shard)
        entry.close()
    folder = tmp_path / xxhash.xxh3_128_hexdigest(key(1).encode())
    if damage == "sidecar":
        (folder / "meta.json").write_bytes(b'{"key": "s3://')
    elif damage == "sidecar-fields":
        (folder / "meta.json").write_text(json.dumps({"key": key(1), "dataset": "ds", "size": "3"}))
    elif damage == "map-size":
        os.truncate(folder / "map", 1)
    elif damage == "map-bytes":
        (folder / "map").write_bytes(b"\x01\x07\x01")
    else:
        os.truncate(folder / "data", 2 * BLOCK)
    if damage.startswith("sidecar"):
        assert [info.name for info in cache.entries()] != [folder.name]  # a scan drops it too
        assert cache.usage() == 3 * BLOCK
    entry = cache.entry(key(1), 3 * BLOCK, "ds")
    assert entry is not None and entry.present_bytes() == 0
    fill(entry, 1)
    assert check_present(entry, 1) == 3 and cache.usage() == 6 * BLOCK


@pytest.mark.parametrize("totals", [b"", b'{"ds": 1', b'{"ds": -5}', b'[1]', None])
def test_damaged_or_missing_totals_are_counted_again(tmp_path: Path, totals: bytes | None) -> None:
    cache = NodeCache(tmp_path, 10 * BLOCK)
    for shard in (1, 2):
        assert cache.entry(key(shard), 3 * BLOCK, "ds") is not None
    assert json.loads((tmp_path / ".totals.json").read_text()) == {"ds": 6 * BLOCK}
    if totals is None:
        (tmp_path / ".totals.json").unlink()  # as a holder killed between evicting and counting
    else:
        (tmp_path / ".totals.json").write_bytes(totals)
    assert cache.usage() == 6 * BLOCK
    assert cache.entry(key(3), 5 * BLOCK, "ds") is None  # the recount holds the limit
    assert cache.entry(key(3), 4 * BLOCK, "ds") is not None and cache.usage() == 10 * BLOCK


def test_a_link_or_a_file_is_refused_as_the_folder(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "file").write_text("x")
    for name, kind in (("link", "a symbolic link"), ("file", "a regular file")):
        with pytest.raises(ValueError, match=f"{tmp_path / name}: the cache folder is {kind}"):
            NodeCache(tmp_path / name, BLOCK)
    with pytest.raises(ValueError, match="'lru'"):
        NodeCache(tmp_path / "real", BLOCK, "fifo")  # type: ignore[arg-type]
    assert NodeCache(tmp_path / "new" / "cache", BLOCK).directory == str(tmp_path / "new" / "cache")


# --- failing soft: a full disk, planted files, I/O errors -----------------------------------------

def test_an_admitted_entry_keeps_its_room_when_the_disk_fills(tmp_path: Path) -> None:
    """Its blocks are reserved as it is admitted: a disk filled afterwards (another entry, another
    program) fails no write of it, and a tmpfs kills no one with SIGBUS through its mapped map."""
    with tmpfs(tmp_path / "disk", "1m") as disk:
        cache = NodeCache(disk / "cache", 100 * BLOCK)
        entry = cache.entry(key(1), 8 * BLOCK, "ds")
        assert entry is not None
        fill_up(disk, 0)
        fill(entry, 1)
        assert check_present(entry, 1) == 8
        with pytest.warns(CacheWarning, match=f"{disk / 'cache'}: .*no room on its disk: free space"):
            assert cache.entry(key(2), 2 * BLOCK, "ds") is None  # nothing more fits: read through


def test_where_the_disk_cannot_reserve_without_writing_the_data_stays_sparse(tmp_path: Path,
                                                                               monkeypatch: Any) -> None:
    """NFS v3 and the like: glibc would write a byte into every block of a large file to emulate
    posix_fallocate, under the cache's lock; only the small map is reserved so."""
    def unsupported(*_: int) -> int:
        ctypes.set_errno(errno.EOPNOTSUPP)
        return -1

    monkeypatch.setattr(fastload.storage.cache_entry_files, "_fallocate", unsupported)
    entry = NodeCache(tmp_path, 100 * BLOCK).entry(key(1), 64 * BLOCK, "ds")
    assert entry is not None
    assert os.stat(tmp_path / entry.name / "data").st_blocks == 0  # extended, not written
    assert os.stat(tmp_path / entry.name / "map").st_blocks > 0
    fill(entry, 1)
    assert check_present(entry, 1) == 64


def _plant(where: Path, kind: str) -> None:
    if kind == "link":
        where.symlink_to(where.parent.parent / "elsewhere")
    elif kind == "fifo":
        os.mkfifo(where)
    elif kind == "folder":
        where.mkdir()
    else:  # another user's file
        where.touch()
        os.chown(where, 12345, 12345)


@pytest.mark.parametrize(("kind", "found"), [("link", "a symbolic link"), ("fifo", "a FIFO"),
                                             ("folder", "a folder"), ("owner", "a regular file owned by uid 12345")])
def test_a_planted_lock_file_is_a_warning_and_no_cache(tmp_path: Path, kind: str, found: str) -> None:
    if kind == "owner" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    cache = NodeCache(tmp_path / "cache", 10 * BLOCK)
    _plant(tmp_path / "cache" / ".lock", kind)
    with pytest.warns(CacheWarning, match=f"{tmp_path / 'cache' / '.lock'} is {found}.*remove it"):
        assert cache.entry(key(1), 3 * BLOCK, "ds") is None  # read through, never a bare OSError
    assert not os.path.lexists(tmp_path / "elsewhere")  # a link is never followed


def test_a_linked_entry_folder_is_replaced_never_followed(tmp_path: Path) -> None:
    other = NodeCache(tmp_path / "other", 10 * BLOCK)
    entry = other.entry(key(1), 3 * BLOCK, "ds")
    assert entry is not None
    fill(entry, 1)
    entry.close()
    name = xxhash.xxh3_128_hexdigest(key(1).encode())
    cache = NodeCache(tmp_path / "cache", 10 * BLOCK)
    (tmp_path / "cache" / name).symlink_to(tmp_path / "other" / name)
    mine = cache.entry(key(1), 3 * BLOCK, "ds")
    assert mine is not None and mine.present_bytes() == 0  # made anew in the cache folder itself
    assert (tmp_path / "cache" / name).is_dir() and not (tmp_path / "cache" / name).is_symlink()
    assert [info.present for info in other.entries()] == [3 * BLOCK]  # the link's target untouched


def test_a_cached_file_cut_short_is_a_warning_and_a_miss(tmp_path: Path) -> None:
    cache = NodeCache(tmp_path, 10 * BLOCK)
    entry = cache.entry(key(1), 3 * BLOCK, "ds")
    assert entry is not None
    fill(entry, 1)
    os.truncate(tmp_path / entry.name / "data", BLOCK)  # by hand, behind the cache's back
    with pytest.warns(CacheWarning, match="could not read a cached shard .*ends before byte"), \
            pytest.raises(BlocksMissing):
        entry.read(2 * BLOCK, 10)  # the caller fetches it from the store
    assert entry.missing([(0, 10)]) == [(0, BLOCK)] and entry.write(0, content(1, 0, BLOCK)) is False


def test_a_folder_that_cannot_be_made_is_a_warning_and_no_cache(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")  # as a read-only home would refuse it
    with pytest.warns(CacheWarning, match=f"{tmp_path / 'file' / 'cache'}: .*could not make its folder"):
        cache = NodeCache(tmp_path / "file" / "cache", 10 * BLOCK)
    assert cache.limit == 0 and cache.entry(key(1), BLOCK, "ds") is None
