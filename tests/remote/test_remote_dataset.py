"""Datasets in a real S3-compatible server (moto, on 127.0.0.1): packed there, read back by byte
range, refused when changed, and read through a proxy that puts faults on the wire."""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest
import torch

from fastload.converters import pack
from fastload import PackedDataset
from fastload.readers.read_ahead import OPENS_IN_TURN, SHARD_OPENS
from fastload.errors import (
    CorruptRecordError, DatasetNotFoundError, ManifestError, RemoteAccessDenied, RemoteReadError,
)
from fastload.storage.remote import RemoteStore
from fastload.storage.retry import RetryPolicy
from tests.conftest import make_jpeg

FAST_RETRY = RetryPolicy(attempts=3, base=0.01, cap=0.05)


def shard_object(store: RemoteStore, number: int = 0) -> str:
    """The name of shard ``number``'s object (in the pack's own folder, ``gen-<hex>/``)."""
    return PackedDataset(store.url, storage_options=store.options, cache_limit=0).manifest.shards[number].file


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """40 small JPEGs in 2 classes, and local LMDB and HDF5 packs of them (the reference)."""
    root = tmp_path_factory.mktemp("remote") / "images"
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(20):
            (root / f"c{c}" / f"{i:02d}.jpg").write_bytes(make_jpeg(72 + i, 56, seed=i + 50 * c))
    for fmt in ("lmdb", "hdf5"):
        pack(root, root.parent / f"local-{fmt}.fl", format=fmt, shard_size="20KB", progress=False)
    return root


@pytest.fixture(scope="module")
def uploaded(tree, s3_server):
    """Both formats packed straight to the server (several shards each)."""
    bucket = s3_server.make_bucket("packed-module")
    opts = s3_server.storage_options()
    for fmt in ("lmdb", "hdf5"):
        pack(tree, f"s3://{bucket}/{fmt}.fl", format=fmt, shard_size="20KB", progress=False,
             storage_options=opts, staging=tree.parent / f"staging-{fmt}")
    return bucket


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_packed_to_the_store_reads_back_bit_exact(tree, uploaded, s3_server, fmt, tmp_path):
    local = PackedDataset(tree.parent / f"local-{fmt}.fl")
    remote = PackedDataset(f"s3://{uploaded}/{fmt}.fl", storage_options=s3_server.storage_options(),
                           cache_dir=tmp_path / "cache")
    assert len(remote.manifest.shards) > 1 and all(s.etag for s in remote.manifest.shards)
    assert remote.classes == local.classes and list(remote.targets) == list(local.targets)
    order = np.random.default_rng(0).permutation(len(local)).tolist()
    assert remote.reader.read_many(order) == local.reader.read_many(order)
    decoded = PackedDataset(f"s3://{uploaded}/{fmt}.fl", storage_options=s3_server.storage_options(),
                            image_size=32, train=False, cache_limit=0)
    eval_local = PackedDataset(tree.parent / f"local-{fmt}.fl", image_size=32, train=False)
    assert all(bool((decoded[i][0] == eval_local[i][0]).all()) for i in (0, 17, 39))


def test_the_same_pack_again_is_already_packed(tree, uploaded, s3_server):
    report = pack(tree, f"s3://{uploaded}/lmdb.fl", shard_size="20KB", progress=False,
                  storage_options=s3_server.storage_options(), staging=tree.parent / "staging-again")
    assert report.already_packed
    with pytest.raises(Exception, match="--overwrite"):
        pack(tree, f"s3://{uploaded}/lmdb.fl", shard_size="30KB", progress=False,
             storage_options=s3_server.storage_options(), staging=tree.parent / "staging-again")


def test_overwrite_replaces_and_removes_the_old_shards(tree, s3_server, s3_bucket, tmp_path):
    url, opts = f"s3://{s3_bucket}/x.fl", s3_server.storage_options()
    pack(tree, url, shard_size="10KB", progress=False, storage_options=opts, staging=tmp_path / "a")
    pack(tree, url, shard_size="60KB", progress=False, storage_options=opts, staging=tmp_path / "b",
         overwrite=True)
    ds = PackedDataset(url, storage_options=opts, cache_limit=0)
    names = {name for name, _, _ in RemoteStore(url, opts).list_objects()}
    assert {s.file for s in ds.manifest.shards} == {n for n in names if "/shard-" in n}  # the old ones gone
    assert len(ds) == 40 and not (tmp_path / "b").exists()  # the staging folder is removed


def test_a_prefix_holding_other_objects_is_refused(tree, s3_server, s3_bucket, tmp_path):
    store = RemoteStore(f"s3://{s3_bucket}/mine", s3_server.storage_options())
    store.put_bytes("notes.txt", b"my notes")
    with pytest.raises(Exception, match="notes.txt"):
        pack(tree, store.url, progress=False, storage_options=s3_server.storage_options(),
             staging=tmp_path / "s")
    assert store.read_file("notes.txt", 100) == b"my notes"


def test_pack_from_a_store_prefix_equals_the_local_pack(tree, s3_server, s3_bucket, tmp_path):
    store = RemoteStore(f"s3://{s3_bucket}/images", s3_server.storage_options())
    for path in sorted(tree.rglob("*.jpg")):
        store.put_bytes(path.relative_to(tree).as_posix(), path.read_bytes())
    store.put_bytes("c0/readme.txt", b"not an image")
    report = pack(store.url, tmp_path / "from-store.fl", shard_size="20KB", progress=False,
                  storage_options=s3_server.storage_options())
    assert report.num_records == 40 and report.ignored == {".txt": 1}
    got, want = PackedDataset(tmp_path / "from-store.fl"), PackedDataset(tree.parent / "local-lmdb.fl")
    assert got.classes == want.classes and list(got.targets) == list(want.targets)
    assert [got.index.path[i] for i in range(40)] == [want.index.path[i] for i in range(40)]
    assert got.reader.read_many(list(range(40))) == want.reader.read_many(list(range(40)))


def test_a_missing_dataset_says_so(s3_server, s3_bucket):
    with pytest.raises(DatasetNotFoundError, match="no manifest.json"):
        PackedDataset(f"s3://{s3_bucket}/nothing.fl", storage_options=s3_server.storage_options())


def _upload_local(local, store: RemoteStore) -> None:
    """Copy a local dataset folder into the store as a user's `aws s3 sync` would (no ETags recorded)."""
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        store.put_bytes(path.relative_to(local).as_posix(), path.read_bytes())


def test_a_shard_changed_in_the_store_is_refused(tree, uploaded, s3_server, s3_bucket):
    opts = s3_server.storage_options()
    source = RemoteStore(f"s3://{uploaded}/lmdb.fl", opts)
    copy = RemoteStore(f"s3://{s3_bucket}/copy.fl", opts)
    for name, size, _ in source.list_objects():
        copy.put_bytes(name, source.read_file(name, size))
    PackedDataset(copy.url, storage_options=opts, cache_limit=0)  # an exact copy: its ETags match
    name = shard_object(source, 1)
    shard = source.read_file(name, 10**7)
    copy.put_bytes(name, shard[:-1] + bytes([shard[-1] ^ 1]))  # same size, other bytes
    with pytest.raises(ManifestError, match="shard-00001.lmdb: ETag .* replaced since the pack"):
        PackedDataset(copy.url, storage_options=opts, cache_limit=0)
    copy.put_bytes(name, shard + b"\0" * 4096)
    with pytest.raises(ManifestError, match="bytes in the store, the manifest says"):
        PackedDataset(copy.url, storage_options=opts, cache_limit=0)


def test_a_damaged_record_in_the_store_is_skipped_and_counted(tree, s3_server, s3_bucket, tmp_path):
    import shutil

    local = tmp_path / "damaged.fl"
    shutil.copytree(tree.parent / "local-hdf5.fl", local)
    ds = PackedDataset(local)
    _, offset, size = ds.reader.locate(5)
    shard = local / ds.manifest.shards[int(ds.index.shard[5])].file
    data = bytearray(shard.read_bytes())
    data[offset + size // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    store = RemoteStore(f"s3://{s3_bucket}/damaged.fl", s3_server.storage_options())
    _upload_local(local, store)
    remote = PackedDataset(store.url, storage_options=s3_server.storage_options(), image_size=32, train=True,
                           on_error="skip", cache_dir=tmp_path / "cache")
    with pytest.warns(Warning, match="record 5"):
        batch = remote.__getitems__(list(range(8)))
    assert len(batch) == 7 and remote.skipped == 1
    with pytest.raises(CorruptRecordError, match="record 5 .*checksum"):
        remote.reader.read_many([5])


# --- faults on the wire --------------------------------------------------------------------------

@pytest.fixture()
def through_proxy(uploaded, s3_server, fault_proxy):
    """The LMDB dataset's store folder reached through the fault proxy, with quick retries."""
    opts = s3_server.storage_options(fault_proxy.url)
    return RemoteStore(f"s3://{uploaded}/lmdb.fl", opts, retry=FAST_RETRY), fault_proxy


def _shard_bytes(uploaded, s3_server) -> bytes:
    store = RemoteStore(f"s3://{uploaded}/lmdb.fl", s3_server.storage_options())
    return store.read_file(shard_object(store), 10**7)


def _is_range_get(request) -> bool:
    return request.method == "GET" and "range" in request.headers


@pytest.mark.parametrize("fault", ["503", "500", "reset", "truncate"])
def test_transient_faults_are_retried_and_never_give_wrong_bytes(through_proxy, uploaded, s3_server, fault):
    store, proxy = through_proxy
    want = _shard_bytes(uploaded, s3_server)
    ranges = [(shard_object(store), start, 3000) for start in (0, 5000, 9000)]
    proxy.fail_next(fault, count=2, match=_is_range_get)
    got = store.read_ranges(ranges)
    assert got == [want[s:s + n] for _, s, n in ranges]
    assert proxy.faults_injected[fault] == 2


def test_a_fault_that_persists_names_the_object_and_range(through_proxy):
    store, proxy = through_proxy
    name = shard_object(store)
    proxy.fail_next("503", count=100, match=_is_range_get)
    with pytest.raises(RemoteReadError, match=r"shard-00000.lmdb bytes 4096-8191: failed 3 times"):
        store.read_ranges([(name, 4096, 4096)])


def test_access_denied_is_immediate_and_clear(through_proxy):
    store, proxy = through_proxy
    name = shard_object(store)
    proxy.fail_next("403", count=100, match=_is_range_get)
    with pytest.raises(RemoteAccessDenied, match="shard-00000.lmdb bytes 0-99: access denied"):
        store.read_ranges([(name, 0, 100)])
    assert proxy.faults_injected["403"] == 1  # not retried


def test_a_request_that_hangs_times_out_and_is_retried(uploaded, s3_server, fault_proxy):
    opts = s3_server.storage_options(fault_proxy.url, config_kwargs={"read_timeout": 1, "connect_timeout": 1})
    store = RemoteStore(f"s3://{uploaded}/lmdb.fl", opts, retry=FAST_RETRY)
    want, name = _shard_bytes(uploaded, s3_server)[100:600], shard_object(store)
    fault_proxy.fail_next("timeout", count=1, match=_is_range_get)
    assert store.read_ranges([(name, 100, 500)]) == [want]


def test_a_dataset_read_through_faults_matches_the_local_one(tree, uploaded, s3_server, fault_proxy, tmp_path):
    opts = s3_server.storage_options(fault_proxy.url)
    remote = PackedDataset(f"s3://{uploaded}/hdf5.fl", storage_options=opts, cache_dir=tmp_path / "c")
    local = PackedDataset(tree.parent / "local-hdf5.fl")
    # 5 faults in a row: under the 6 tries of the default policy (aiohttp also retries a reset once
    # on its own; obstore does not, so 6 would fail a request that meets them all)
    fault_proxy.fail_next("reset", count=2, match=_is_range_get)
    fault_proxy.fail_next("truncate", count=3, match=_is_range_get)
    assert remote.reader.read_many(list(range(40))) == local.reader.read_many(list(range(40)))


def test_the_second_epoch_reads_the_cache_not_the_store(tree, uploaded, s3_server, fault_proxy, tmp_path):
    opts = s3_server.storage_options(fault_proxy.url)
    remote = PackedDataset(f"s3://{uploaded}/lmdb.fl", storage_options=opts, cache_dir=tmp_path / "c")
    order = np.random.default_rng(1).permutation(40).tolist()
    first = [remote.reader.read_many(order[k:k + 8]) for k in range(0, 40, 8)]
    assert any(_is_range_get(r) for r in fault_proxy.requests)
    fault_proxy.clear()
    # a new dataset object (another process would do the same): the cache is on disk
    again = PackedDataset(f"s3://{uploaded}/lmdb.fl", storage_options=opts, cache_dir=tmp_path / "c")
    second = [again.reader.read_many(order[k:k + 8]) for k in range(0, 40, 8)]
    # (the manifest and index are read again at open: small files, not cached)
    assert not [r for r in fault_proxy.requests if _is_range_get(r) and "/shard-" in r.path]
    assert first == second


def test_worker_processes_share_one_bounded_cache(tree, uploaded, s3_server, tmp_path):
    import torch

    import fastload

    opts, limit = s3_server.storage_options(), 70_000  # a few of the dataset's shards, not all
    remote = PackedDataset(f"s3://{uploaded}/lmdb.fl", storage_options=opts, image_size=32, train=False,
                           cache_dir=tmp_path / "c", cache_limit=limit)
    local = PackedDataset(tree.parent / "local-lmdb.fl", image_size=32, train=False)
    assert sum(s.bytes for s in remote.manifest.shards) > limit
    batches = {}
    for name, ds in (("remote", remote), ("local", local)):
        loader = fastload.DataLoader(ds, batch_size=8, num_workers=2, shuffle=False)
        batches[name] = [(images.clone(), labels.clone()) for _ in range(2) for images, labels in loader]
    assert len(batches["remote"]) == len(batches["local"]) == 10
    for (a, la), (b, lb) in zip(batches["remote"], batches["local"]):
        assert torch.equal(a, b) and torch.equal(la, lb)
    assert 0 < remote.cache.usage() <= limit


def test_a_decoded_batch_is_fetched_in_one_round_not_per_record(tree, uploaded, s3_server, fault_proxy):
    opts = s3_server.storage_options(fault_proxy.url)
    remote = PackedDataset(f"s3://{uploaded}/hdf5.fl", storage_options=opts, image_size=32, train=False,
                           cache_limit=0)
    for shard in {int(remote.index.shard[i]) for i in range(16)}:
        remote.reader.handle(shard)  # opened (h5py reads its header) before counting
    fault_proxy.clear()
    batch = remote.__getitems__(list(range(16)))
    gets = [r for r in fault_proxy.requests if _is_range_get(r) and "/shard-" in r.path]
    shards = {int(remote.index.shard[i]) for i in range(16)}
    assert len(batch) == 16 and len(gets) == len(shards)  # neighbours coalesced: one GET per shard


def test_batches_read_in_turn_fetch_the_next_one_ahead(tree, uploaded, s3_server, fault_proxy):
    opts = s3_server.storage_options(fault_proxy.url)
    remote = PackedDataset(f"s3://{uploaded}/lmdb.fl", storage_options=opts, cache_limit=0)
    local = PackedDataset(tree.parent / "local-lmdb.fl")
    by_shard = [np.flatnonzero(remote.index.shard == s).tolist() for s in range(2)]
    batches = [by_shard[0][:3], by_shard[1][:3]]
    for shard in (0, 1):
        remote.reader.handle(shard)  # opened (its tree read) before counting
    fault_proxy.clear()
    stream = remote.reader.read_batches(batches)
    assert next(stream) == local.reader.read_many(batches[0])
    second = f"/{remote.manifest.shards[1].file}"
    deadline = time.monotonic() + 120  # its fetch was started with the first: it lands unasked (a guard, not a speed)
    while not any(_is_range_get(r) and r.path.endswith(second) for r in fault_proxy.requests):
        assert time.monotonic() < deadline, "the second batch was not fetched ahead"
        time.sleep(0.01)
    assert next(stream) == local.reader.read_many(batches[1])
    assert next(stream, None) is None


def test_filling_ahead_puts_every_shard_in_the_cache(tree, uploaded, s3_server, fault_proxy, tmp_path):
    opts = s3_server.storage_options(fault_proxy.url)
    remote = PackedDataset(f"s3://{uploaded}/lmdb.fl", storage_options=opts, cache_dir=tmp_path / "c")
    remote.fill_cache()  # what fastload.DataLoader does as an epoch begins
    filler = remote.reader.remote._filler
    filler.join(timeout=60)
    assert not filler.is_alive()
    assert remote.cache.usage() == sum(s.bytes for s in remote.manifest.shards)
    fault_proxy.clear()
    local = PackedDataset(tree.parent / "local-lmdb.fl")
    assert remote.reader.read_many(list(range(40))) == local.reader.read_many(list(range(40)))
    assert not [r for r in fault_proxy.requests if "/shard-" in r.path]


def _connections_to(port: int) -> int:
    """This process's established TCP connections to 127.0.0.1:``port``."""
    import os

    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            mine.add(link[8:-1])
    count = 0
    for line in open("/proc/self/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "01" and int(fields[2].split(":")[1], 16) == port and fields[9] in mine:
            count += 1
    return count


def test_a_finished_fill_closes_the_idle_connections(uploaded, s3_server, fault_proxy, tmp_path):
    remote = PackedDataset(f"s3://{uploaded}/lmdb.fl", storage_options=s3_server.storage_options(fault_proxy.url),
                           cache_dir=tmp_path / "c")
    if remote.reader.remote.store.client.name != "obstore":
        pytest.skip("s3fs's pool has no call that closes only its idle connections")
    port = int(fault_proxy.url.rsplit(":", 1)[1])
    remote.reader.read_many(list(range(0, 40, 3)))  # a cold start's batch reads: connections of their own
    assert _connections_to(port) > 0
    remote.fill_cache()
    remote.reader.remote._filler.join(timeout=60)
    deadline = time.monotonic() + 60  # each closes on the client's runtime, soon after its pool is dropped
    while _connections_to(port) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _connections_to(port) == 0  # nothing left holding a socket and its read buffer
    fault_proxy.clear()
    name = remote.manifest.shards[0].file  # a later read opens a connection again
    assert len(remote.reader.remote.store.read_ranges([(name, 0, 16)])[0]) == 16
    assert [r for r in fault_proxy.requests if r.path.endswith(name)]


def test_a_dropped_dataset_stops_filling_its_cache(uploaded, s3_server, fault_proxy, tmp_path, monkeypatch):
    import fastload.storage.remote_fill

    monkeypatch.setattr(fastload.storage.remote_fill, "FILL_STREAMS", 1)  # 4 small shards: one at a time
    fault_proxy.latency = 0.5  # the fill takes a round trip per shard: still running when dropped
    remote = PackedDataset(f"s3://{uploaded}/lmdb.fl", storage_options=s3_server.storage_options(fault_proxy.url),
                           cache_dir=tmp_path / "c")
    cache, shards = remote.cache, len(remote.manifest.shards)
    remote.fill_cache()
    filler = remote.reader.remote._filler
    deadline = time.monotonic() + 120  # dropped once the first shard is in (not after a fixed wait)
    while not cache.entries():
        assert filler.is_alive() and time.monotonic() < deadline, "the fill put nothing in the cache"
        time.sleep(0.01)
    del remote
    gc.collect()
    filler.join(timeout=60)  # the pieces in flight, then it stops
    assert not filler.is_alive()
    assert len(cache.entries()) < shards  # it did not go on to fetch the rest of the dataset


def test_opening_a_shard_reads_its_tree_a_level_at_a_time(tmp_path, s3_server, s3_bucket, fault_proxy):
    src = tmp_path / "tiny"
    src.mkdir()
    for i in range(300):  # tiny records: inline in leaf pages, several dozen leaf pages in one shard
        (src / f"{i:03d}.jpg").write_bytes(make_jpeg(8, 8, seed=i))
    url = f"s3://{s3_bucket}/tiny.fl"
    pack(src, url, progress=False, storage_options=s3_server.storage_options(), staging=tmp_path / "stage")
    remote = PackedDataset(url, storage_options=s3_server.storage_options(fault_proxy.url), cache_limit=0)
    assert len(remote.manifest.shards) == 1
    fault_proxy.clear()
    assert len(remote.reader.read_many([0, 299])) == 2
    gets = [r for r in fault_proxy.requests if "/shard-" in r.path]
    # both meta pages at once, the root, the leaves, then the records: not one request per page
    assert remote.manifest.shards[0].bytes // 4096 > 20 and len(gets) <= 5, [g.headers.get("range") for g in gets]


@pytest.fixture(scope="module")
def many_shards(tree, s3_server):
    """The 40 JPEGs packed to the store a record or two a shard (tens of shards)."""
    url = f"s3://{s3_server.make_bucket('many-shards')}/lmdb.fl"
    pack(tree, url, shard_size="4KB", progress=False, storage_options=s3_server.storage_options(),
         staging=tree.parent / "staging-many")
    return url


def _chains(shards: int) -> int:
    """Opens side by side for ``shards`` new shards (``ShardReader.open_shards``)."""
    chains = min(SHARD_OPENS, -(-shards // OPENS_IN_TURN))
    assert chains >= 2, "the dataset must have more shards than are opened in turn"
    return chains


def test_the_shards_a_batch_needs_are_opened_side_by_side(tree, many_shards, s3_server, fault_proxy):
    remote = PackedDataset(many_shards, storage_options=s3_server.storage_options(fault_proxy.url), cache_limit=0)
    shards = len(remote.manifest.shards)
    fault_proxy.latency = 0.05  # each open is a few requests in turn: opened side by side, they overlap
    fault_proxy.clear()
    remote.reader.open_shards(range(shards))
    # opened in turn, one request would have been in flight at a time (each tree is its root page)
    assert fault_proxy.most_in_flight >= _chains(shards)
    fault_proxy.clear()
    firsts = [int(np.flatnonzero(remote.index.shard == s)[0]) for s in range(shards)]
    local = PackedDataset(tree.parent / "local-lmdb.fl")
    assert remote.reader.read_many(firsts) == local.reader.read_many(firsts)  # one tree, one record order
    assert not [r for r in fault_proxy.requests if "/shard-" in r.path
                and r.headers.get("range", "").startswith("bytes=0-")]  # each opened once: no meta page again


def test_a_batch_opens_the_shards_it_needs_side_by_side(many_shards, s3_server, fault_proxy):
    remote = PackedDataset(many_shards, storage_options=s3_server.storage_options(fault_proxy.url), image_size=32,
                           train=False, cache_limit=0)
    shards = len(remote.manifest.shards)
    fault_proxy.latency = 0.05
    fault_proxy.clear()
    firsts = [int(np.flatnonzero(remote.index.shard == s)[0]) for s in range(shards)]
    assert len(remote.__getitems__(firsts)) == shards
    reads = [r.headers.get("range", "") for r in fault_proxy.requests if "/shard-" in r.path]
    metas = [k for k, at in enumerate(reads) if at.startswith("bytes=0-")]
    assert len(metas) == shards  # each shard opened once
    # the first opens of every chain began before any had its answer (opened in turn, the
    # second request would have been the first shard's root page)
    assert metas[:_chains(shards)] == list(range(_chains(shards))), reads


def test_hdf5_shards_opened_side_by_side_read_what_the_local_pack_holds(tree, s3_server, tmp_path):
    url = f"s3://{s3_server.make_bucket('many-hdf5')}/hdf5.fl"
    pack(tree, url, format="hdf5", shard_size="4KB", progress=False, storage_options=s3_server.storage_options(),
         staging=tmp_path / "stage")
    remote = PackedDataset(url, storage_options=s3_server.storage_options(), image_size=32, train=False,
                           cache_dir=tmp_path / "cache")
    local = PackedDataset(tree.parent / "local-hdf5.fl", image_size=32, train=False)
    _chains(len(remote.manifest.shards))  # enough shards to open side by side (h5py reads each header)
    everything = list(range(len(remote)))
    got, want = remote.__getitems__(everything), local.__getitems__(everything)
    assert len(got) == len(want) == len(everything)
    assert all(torch.equal(a, b) and la == lb for (a, la), (b, lb) in zip(got, want))


def test_a_handful_of_shards_are_opened_in_turn(uploaded, s3_server, fault_proxy):
    remote = PackedDataset(f"s3://{uploaded}/lmdb.fl", storage_options=s3_server.storage_options(fault_proxy.url),
                           cache_limit=0)
    shards = len(remote.manifest.shards)
    assert 1 < shards <= OPENS_IN_TURN
    fault_proxy.clear()
    firsts = [int(np.flatnonzero(remote.index.shard == s)[0]) for s in range(shards)]
    assert len(remote.reader.read_many(firsts)) == shards
    reads = [r.headers.get("range", "") for r in fault_proxy.requests if "/shard-" in r.path]
    metas = [k for k, at in enumerate(reads) if at.startswith("bytes=0-")]
    assert len(metas) == shards and metas[1] > 1, reads  # the first shard's walk done before the next began


def test_a_refused_manifest_says_access_denied_not_re_pack(uploaded, s3_server, fault_proxy):
    fault_proxy.fail_next("403", count=100, match=lambda r: r.path.endswith("/manifest.json"))
    with pytest.raises(RemoteAccessDenied, match="manifest.json: access denied") as raised:
        PackedDataset(f"s3://{uploaded}/lmdb.fl", storage_options=s3_server.storage_options(fault_proxy.url))
    assert "re-pack" not in str(raised.value)


def test_file_fields_are_packed_to_and_read_from_the_store(tmp_path, s3_server, s3_bucket):
    """A record's mask rides in its shard: fetched by range with the batch, bit-exact, cropped alike."""
    import json

    from tests.samples.test_masks import scene

    rows = []
    for i in range(12):
        image, mask, _ = scene(50 + i, 40 + i, [5, 5, 30, 30])
        (tmp_path / f"{i}.png").write_bytes(image)
        (tmp_path / f"{i}.m.png").write_bytes(mask)
        rows.append({"path": f"{i}.png", "mask": f"{i}.m.png"})
    (tmp_path / "list.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    opts = s3_server.storage_options()
    pack(tmp_path / "list.jsonl", f"s3://{s3_bucket}/seg.fl", file_columns=("mask",), shard_size="1KB",
         storage_options=opts, staging=tmp_path / "staging", progress=False)
    pack(tmp_path / "list.jsonl", tmp_path / "seg.fl", file_columns=("mask",), shard_size="1KB", progress=False)
    remote = PackedDataset(f"s3://{s3_bucket}/seg.fl", storage_options=opts, cache_limit=0, image_size=24,
                           train=False, fields=("image", "mask"))
    local = PackedDataset(tmp_path / "seg.fl", image_size=24, train=False, fields=("image", "mask"))
    assert len(remote.manifest.shards) > 1
    assert [remote.record(i)["mask"] for i in range(12)] == [(tmp_path / f"{i}.m.png").read_bytes() for i in range(12)]
    got, want = remote.__getitems__(list(range(12))), local.__getitems__(list(range(12)))
    assert all(bool((got.fields[k] == want.fields[k]).all()) for k in ("image", "mask"))


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_a_cached_batch_is_left_in_the_cache_for_the_decode_threads(tree, uploaded, s3_server, fmt, tmp_path):
    """With a node cache, a batch's records are fetched into it and each is read from there by the
    decode thread that wants it, bit-exact and checked, not all held in memory; without one, they
    come back in memory. The batch decodes as the local pack's does."""
    opts, indices = s3_server.storage_options(), list(range(12))
    local = PackedDataset(tree.parent / f"local-{fmt}.fl", image_size=32, train=False)
    for cache in (tmp_path / "c", None):
        remote = PackedDataset(f"s3://{uploaded}/{fmt}.fl", storage_options=opts, image_size=32, train=False,
                               cache_dir=cache, **({} if cache else {"cache_limit": 0}))
        places = [remote.reader.locate(i) for i in indices]
        fetched = remote.reader.remote.fetch(places)
        if cache is None:
            assert fetched == local.reader.read_many(indices)
        else:
            assert fetched == [None] * len(indices)
        read = remote.reader.prefetched(indices)
        assert [read(i) for i in indices] == local.reader.read_many(indices)
        got, want = remote.__getitems__(indices), local.__getitems__(indices)
        assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(got, want))
