"""The reader contract, run for every storage kind: exact bytes by index, checks, lazy per-process handles."""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing as mp
import os
import pickle
import random
import threading
import time
from pathlib import Path

import pytest

from fastload import CorruptRecordError, ManifestError
from fastload.format import RecordIndex, lmdb_key, read_manifest
from fastload.readers import READERS, HDF5Reader, LMDBReader, ShardReader
from tests.conftest import copy_dataset, flip_payload_byte, load_manifest_json, save_manifest_json

STORAGES = ["lmdb", "hdf5"]


def open_reader(out) -> ShardReader:
    manifest = read_manifest(out)
    return READERS[manifest.storage](out, manifest, RecordIndex(out, manifest))


@pytest.fixture(params=STORAGES)
def storage(request) -> str:
    return request.param


@pytest.fixture
def reader_and_files(packed, storage):
    out, files = packed(storage)
    reader = open_reader(out)
    expected = [files[reader.index.path[i]] for i in range(len(files))]
    yield reader, expected
    reader.close()


def test_registry_names_every_storage_kind():
    assert READERS == {"lmdb": LMDBReader, "hdf5": HDF5Reader}
    assert all(issubclass(cls, ShardReader) for cls in READERS.values())


def test_read_gives_every_record_bit_exact(reader_and_files):
    reader, expected = reader_and_files
    assert len(reader.manifest.shards) > 1
    assert [reader.read(i) for i in range(len(expected))] == expected


def test_read_many_in_any_order_across_shards(reader_and_files):
    reader, expected = reader_and_files
    order = list(range(len(expected))) * 2
    random.Random(0).shuffle(order)
    assert reader.read_many(order) == [expected[i] for i in order]
    assert reader.read_raw(order[:7]) == [expected[i] for i in order[:7]]
    assert reader.read_many([]) == []
    assert all(isinstance(b, bytes) for b in reader.read_many([0, len(expected) - 1]))


def test_read_batches_gives_each_batch_in_turn_with_the_next_in_flight(reader_and_files):
    reader, expected = reader_and_files
    order = list(range(len(expected))) * 2
    random.Random(1).shuffle(order)
    batches = [order[k:k + 7] for k in range(0, len(order), 7)] + [[3], []]
    got = list(reader.read_batches(iter(batches)))  # any iterable: the next batch is taken early
    assert got == [[expected[i] for i in batch] for batch in batches]
    assert list(reader.read_batches(batches[:2], checked=False)) == got[:2]
    assert list(reader.read_batches([])) == []
    pending = reader.start_reads(batches[0])  # returns before its reads land; result() waits
    assert pending.result() == got[0] and pending.result() == got[0]


def test_a_damaged_batch_is_raised_in_its_turn_after_the_ones_before(packed, storage, tmp_path):
    out = copy_dataset(packed(storage)[0], tmp_path / "ds")
    reader = open_reader(out)
    n = len(reader.index.path)
    victim = n // 2
    expected = [reader.read(i) for i in range(n)]
    reader.close()
    flip_payload_byte(out, victim)
    reader = open_reader(out)
    batches = [list(range(k, min(k + 4, n))) for k in range(0, n, 4)]
    bad = victim // 4
    stream = reader.read_batches(batches)
    for k in range(bad):  # those before it, whole, though the damaged batch was read ahead of them
        assert next(stream) == expected[batches[k][0]:batches[k][-1] + 1]
    with pytest.raises(CorruptRecordError, match=rf"record {victim} \(.*\): checksum mismatch"):
        next(stream)
    with pytest.raises(StopIteration):
        next(stream)  # a generator that raised is done: nothing after it is delivered out of turn
    unchecked = list(reader.read_batches(batches, checked=False))
    assert unchecked[bad][victim % 4] != expected[victim] and len(unchecked) == len(batches)
    reader.close()


def test_a_record_the_shard_lacks_is_raised_in_its_batch_turn(packed, tmp_path):
    out = copy_dataset(packed("lmdb")[0], tmp_path / "ds")
    victim = _rewrite_lmdb_record(out, 1, None)
    reader = open_reader(out)
    others = [i for i in range(len(reader.index.path)) if i != victim]
    stream = reader.read_batches([others[:3], [victim], others[3:6]])
    assert next(stream) == reader.read_many(others[:3])  # the next batch's locate failed already
    with pytest.raises(CorruptRecordError, match=rf"record {victim} \(.*\): record missing from its shard"):
        next(stream)
    pending = reader.start_reads([others[0], victim])
    with pytest.raises(CorruptRecordError, match="record missing from its shard"):
        pending.result()  # start_reads itself never raises: the batch's result does
    reader.close()


def test_handles_open_lazily_and_are_never_pickled(reader_and_files):
    reader, expected = reader_and_files
    reader.close()
    assert reader._handles == {}  # nothing is opened until a record is read
    reader.read(0)
    assert len(reader._handles) == 1 and reader._pid == os.getpid()
    copy = pickle.loads(pickle.dumps(reader))
    assert copy._handles == {} and copy._pid == -1
    assert copy.read_many([len(expected) - 1, 0]) == [expected[-1], expected[0]]
    copy.close()
    reader.close()
    assert reader._handles == {}
    assert reader.read(1) == expected[1]  # re-opens after close


def test_threads_reading_at_once_open_each_shard_once(packed, storage):
    """Decode threads read their own records: a fresh reader hit by many at once opens each
    shard file once (no descriptor left behind by a lost race)."""
    out, files = packed(storage)
    reader = open_reader(out)
    n = len(files)
    expected = [files[reader.index.path[i]] for i in range(n)]
    fds_before = len(os.listdir("/proc/self/fd"))
    start = threading.Barrier(8)
    results: list[list[bytes]] = []

    def read_all() -> None:
        start.wait()
        results.append(reader.read_many(range(n)))

    threads = [threading.Thread(target=read_all) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [expected] * 8
    shards = len(reader.manifest.shards)
    assert len(reader._handles) == shards
    assert len(os.listdir("/proc/self/fd")) - fds_before == shards
    reader.close()
    assert len(os.listdir("/proc/self/fd")) == fds_before


def _read_all_in_child(reader: ShardReader, queue) -> None:
    try:
        data = reader.read_many(list(range(len(reader.index.path))))
        queue.put((os.getpid(), reader._pid, data))
    except BaseException as exc:  # report, never hang the parent
        queue.put((os.getpid(), None, repr(exc)))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_reader_opened_in_the_parent_works_in_a_child(reader_and_files, method):
    reader, expected = reader_and_files
    reader.read_many(list(range(len(expected))))  # handles open in the parent before the fork
    ctx = mp.get_context(method)
    queue = ctx.Queue()
    child = ctx.Process(target=_read_all_in_child, args=(reader, queue))
    child.start()
    pid, handle_pid, data = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert data == expected
    assert handle_pid == pid != os.getpid()  # the child opened its own handles
    assert reader.read(0) == expected[0]  # and the parent's still work


def test_where_names_shard_record_and_path(reader_and_files):
    reader, _ = reader_and_files
    i = len(reader.index.path) - 1
    shard = reader.manifest.shards[int(reader.index.shard[i])].file
    assert reader.where(i) == f"{reader.root / shard} record {i} ({reader.index.path[i]})"


def test_a_flipped_byte_raises_corrupt_record_naming_it(packed, storage, tmp_path):
    out = copy_dataset(packed(storage)[0], tmp_path / "ds")
    reader = open_reader(out)
    victim = len(reader.index.path) // 2
    good = reader.read(victim)
    reader.close()
    shard = flip_payload_byte(out, victim)
    reader = open_reader(out)
    with pytest.raises(CorruptRecordError) as err:
        reader.read_many([0, victim])
    text = str(err.value)
    assert text.startswith(f"{out / shard} record {victim} ({reader.index.path[victim]}): checksum mismatch")
    assert f"fastload verify {out}" in text and isinstance(err.value, ValueError)
    raw = reader.read_raw([victim])[0]  # unchecked: the damaged bytes themselves
    assert len(raw) == len(good) and raw != good and sum(a != b for a, b in zip(raw, good)) == 1
    assert reader.read(0) is not None and reader.read(victim - 1)
    reader.close()


def test_a_missing_shard_is_a_manifest_error_on_first_read(packed, storage, tmp_path):
    out = copy_dataset(packed(storage)[0], tmp_path / "ds")
    reader = open_reader(out)
    last = len(reader.index.path) - 1
    (out / reader.manifest.shards[-1].file).unlink()
    assert reader.read(0)  # other shards still read
    with pytest.raises(ManifestError, match=reader.manifest.shards[-1].file):
        reader.read(last)


def _read_first(reader: ShardReader, queue) -> None:
    try:
        reader.read_many([0])
        queue.put(None)
    except Exception as exc:
        queue.put((type(exc).__name__, str(exc)))


@pytest.mark.parametrize("keep", [0.5, 0.0])
def test_a_truncated_shard_is_an_error_not_a_crash(packed, storage, tmp_path, keep):
    # Were a shard memory-mapped, reading past the end of a truncated one would be SIGBUS:
    # the read runs in a child that this test outlives.
    out = copy_dataset(packed(storage)[0], tmp_path / "ds")
    reader = open_reader(out)
    path = out / reader.manifest.shards[0].file
    os.truncate(path, int(path.stat().st_size * keep))
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_read_first, args=(reader, queue))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0, f"the reader crashed (exit {child.exitcode})"
    kind, message = queue.get(timeout=10)
    assert kind in ("ManifestError", "CorruptRecordError") and message.startswith(str(path))


def test_lmdb_shard_replaced_by_other_bytes_is_refused(packed, tmp_path):
    out = copy_dataset(packed("lmdb")[0], tmp_path / "ds")
    reader = open_reader(out)
    path = out / reader.manifest.shards[0].file
    path.write_bytes(b"\0" * path.stat().st_size)  # right size, not an LMDB file
    with pytest.raises(ManifestError, match="damaged LMDB shard .*lost its magic number"):
        reader.read(0)


def _rewrite_lmdb_record(dataset, position: int, value: bytes | None) -> int:
    """Replace (or delete, ``value=None``) the record at ``position`` of shard 0 with liblmdb, and
    let the manifest accept the file's new size; returns that record's global index (-1: none)."""
    import lmdb

    path = dataset / read_manifest(dataset).shards[0].file
    env = lmdb.open(str(path), subdir=False, lock=False, max_dbs=0, map_size=64 << 20)
    with env.begin(write=True) as txn:
        if value is None:
            assert txn.delete(lmdb_key(position))
        else:
            txn.put(lmdb_key(position), value)
    env.close()
    raw = load_manifest_json(dataset)
    raw["shards"][0]["bytes"] = path.stat().st_size
    save_manifest_json(dataset, raw)
    index = RecordIndex(dataset, read_manifest(dataset))
    found = ((index.shard == 0) & (index.position == position)).nonzero()[0]
    return int(found[0]) if len(found) else -1


def test_an_lmdb_record_gone_from_its_shard_is_named(packed, tmp_path):
    out = copy_dataset(packed("lmdb")[0], tmp_path / "ds")
    victim = _rewrite_lmdb_record(out, 1, None)
    reader = open_reader(out)
    with pytest.raises(CorruptRecordError, match=rf"record {victim} \(.*\): record missing from its shard"):
        reader.read_many([0, victim])
    assert reader.read(0)  # the others still read
    reader.close()


def test_an_lmdb_record_of_another_size_is_named(packed, tmp_path):
    out = copy_dataset(packed("lmdb")[0], tmp_path / "ds")
    victim = _rewrite_lmdb_record(out, 0, b"x" * 5000)  # overflow pages now, a new place
    reader = open_reader(out)
    size = int(reader.index.size[victim])
    with pytest.raises(CorruptRecordError, match=rf"record {victim} .*: 5000 bytes stored, index says {size}"):
        reader.read(victim)
    reader.close()


def test_an_lmdb_key_that_is_no_record_position_is_refused_at_open(packed, tmp_path):
    out = copy_dataset(packed("lmdb")[0], tmp_path / "ds")
    count = read_manifest(out).shards[0].num_records
    assert _rewrite_lmdb_record(out, count + 5, b"stray") == -1
    reader = open_reader(out)
    with pytest.raises(ManifestError, match=rf"damaged LMDB shard \(page \d+ holds key "
                                            rf"{lmdb_key(count + 5).hex()}, not the position of one "
                                            rf"of this shard's {count} records\)"):
        reader.read(0)


def _resident(fd: int, offset: int, size: int) -> bool:
    """Whether the page cache holds all of these bytes (mincore on a mapping nothing touches)."""
    page = mmap.PAGESIZE
    start = offset // page * page
    length = offset + size - start
    pages = (length + page - 1) // page
    with mmap.mmap(fd, length, access=mmap.ACCESS_COPY, offset=start) as mapped:
        vec = (ctypes.c_ubyte * pages)()
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
        assert _libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(length), vec) == 0
        return all(v & 1 for v in vec)


_libc = ctypes.CDLL(None, use_errno=True)


def test_will_read_starts_the_reads_of_records_out_of_the_cache(packed, storage, tmp_path):
    out = copy_dataset(packed(storage)[0], tmp_path / "ds")
    reader = open_reader(out)
    records = list(range(len(reader.index.path)))
    places = [reader.locate(i) for i in records]
    for _ in range(20):  # pages still in a per-CPU LRU batch are not dropped at the first try
        for info in reader.manifest.shards:
            fd = os.open(out / info.file, os.O_RDONLY)
            os.fsync(fd)  # written just now by the copy: dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        if not any(_resident(*place) for place in places):
            break
        time.sleep(0.05)
    assert not any(_resident(*place) for place in places)
    reader.will_read(records)
    deadline = time.monotonic() + 120  # the reads land when the disk gets to them: a guard, not a speed
    while not all(_resident(*place) for place in places) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(_resident(*place) for place in places)
    reader.close()


def test_will_read_leaves_damaged_records_to_the_read(packed, tmp_path):
    out = copy_dataset(packed("lmdb")[0], tmp_path / "ds")
    victim = _rewrite_lmdb_record(out, 1, None)
    reader = open_reader(out)
    reader.will_read([0, victim, 1])  # a hint: nothing to report
    with pytest.raises(CorruptRecordError, match="record missing from its shard"):
        reader.read_many([0, victim])
    reader.close()


def test_reads_map_nothing_of_the_shards(reader_and_files):
    """Records come by pread: a process that read every record maps none of the shard files,
    so none of their pages count as its memory."""
    reader, expected = reader_and_files
    assert reader.read_many(range(len(expected))) == expected
    maps = Path("/proc/self/maps").read_text()
    assert not [line for line in maps.splitlines() if str(reader.root) in line]


def test_hdf5_payload_offset_must_match_the_manifest(packed, tmp_path):
    out = copy_dataset(packed("hdf5")[0], tmp_path / "ds")
    raw = load_manifest_json(out)
    raw["shards"][0]["data_offset"] += 8
    save_manifest_json(out, raw)
    reader = open_reader(out)
    with pytest.raises(ManifestError, match="the payload dataset is not where the manifest says"):
        reader.read(0)


def test_hdf5_shard_that_is_not_hdf5_is_refused(packed, tmp_path):
    out = copy_dataset(packed("hdf5")[0], tmp_path / "ds")
    reader = open_reader(out)
    shard = out / reader.manifest.shards[0].file
    shard.write_bytes((b"not hdf5 " * 10000)[:shard.stat().st_size])  # the size the manifest says
    with pytest.raises(ManifestError, match="not a readable fastload HDF5 shard"):
        reader.read(0)


def test_both_storage_kinds_hold_the_same_records(packed):
    lmdb_reader, hdf5_reader = open_reader(packed("lmdb")[0]), open_reader(packed("hdf5")[0])
    n = len(lmdb_reader.index.path)
    assert lmdb_reader.read_many(range(n)) == hdf5_reader.read_many(range(n))
    assert (lmdb_reader.index.checksum == hdf5_reader.index.checksum).all()
    lmdb_reader.close()
    hdf5_reader.close()


def _two_readers_in_child(a: ShardReader, b: ShardReader, queue) -> None:
    try:
        n = len(a.index.path)
        queue.put((b.read_many(list(range(n))), a.read_many(list(range(n)))))
    except BaseException as exc:
        queue.put(repr(exc))


def test_two_readers_of_one_dataset_in_one_process(packed, storage):
    # Each reader has its own handles, before and after a fork; closing one leaves the other working.
    out, files = packed(storage)
    a, b = open_reader(out), open_reader(out)
    n = len(files)
    expected = [files[a.index.path[i]] for i in range(n)]
    assert a.read_many(range(n)) == b.read_many(range(n)) == expected
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_two_readers_in_child, args=(a, b, queue))
    child.start()
    assert queue.get(timeout=60) == (expected, expected)
    child.join(timeout=60)
    a.close()
    assert b.read_many([n - 1, 0]) == [expected[-1], expected[0]]  # closing one leaves the other working
    b.close()
    c = open_reader(out)
    assert c.read(0) == expected[0]
    c.close()
