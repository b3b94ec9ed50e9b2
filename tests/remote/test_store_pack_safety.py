"""A pack to a store deletes nothing of the user's, keeps the old dataset readable until the new one
is published, lets one pack at a time write a URL (a lease the store enforces) and stages only in a
folder of its own."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from fastload.converters import pack
from fastload.converters.destination.store_lease import put_conditional
from fastload import PackedDataset
from fastload.errors import PackError
from fastload.format.layout import STORE_LEASE_NAME
from fastload.storage.remote import RemoteStore
from fastload.verifier import verify
from tests.conftest import REPO, make_jpeg
from tests.remote.test_pack_resume import _pack_command


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """24 small JPEGs in 2 classes."""
    root = tmp_path_factory.mktemp("safety") / "images"
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(12):
            (root / f"c{c}" / f"{i:02d}.jpg").write_bytes(make_jpeg(64 + i, 48, seed=i + 40 * c))
    return root


def _objects(store: RemoteStore) -> dict[str, bytes]:
    return {name: store.read_file(name, 2**24) for name, _, _ in store.list_objects()}


def _pack(src, url, opts, staging, **kw):
    return pack(src, url, **{"shard_size": "12KB", **kw}, progress=False, storage_options=opts, staging=staging)


@pytest.mark.parametrize("name", ["index/index.html", ".pack/notes.txt", "shard-00000.lmdb/part",
                                  "skipped.jsonl", "gen-0123456789abcdef/shard-00000.lmdb"])
def test_a_prefix_holding_objects_named_like_fastloads_is_refused_and_kept(tree, s3_server, s3_bucket, tmp_path,
                                                                           name):
    store = RemoteStore(f"s3://{s3_bucket}/site", s3_server.storage_options())
    store.put_bytes(name, b"the user's own")
    with pytest.raises(PackError, match="not a fastload dataset's"):
        _pack(tree, store.url, s3_server.storage_options(), tmp_path / "s")
    assert _objects(store) == {name: b"the user's own"}
    assert not (tmp_path / "s").exists()  # refused before staging anything


def test_overwrite_refuses_a_dataset_prefix_that_also_holds_user_objects(tree, s3_server, s3_bucket, tmp_path):
    opts = s3_server.storage_options()
    store = RemoteStore(f"s3://{s3_bucket}/ds.fl", opts)
    _pack(tree, store.url, opts, tmp_path / "a")
    store.put_bytes("notes/readme.txt", b"mine")
    before = _objects(store)
    with pytest.raises(PackError, match="notes/readme.txt"):
        _pack(tree, store.url, opts, tmp_path / "b", overwrite=True, shard_size="40KB")
    assert _objects(store) == before


def test_a_failed_overwrite_leaves_the_old_dataset_readable_and_the_next_one_cleans_up(
        tree, s3_server, s3_bucket, tmp_path):
    opts = s3_server.storage_options()
    url = f"s3://{s3_bucket}/ds.fl"
    _pack(tree, url, opts, tmp_path / "a")
    old = {s.file for s in PackedDataset(url, storage_options=opts, cache_limit=0).manifest.shards}
    bad = tmp_path / "bad"
    bad.mkdir()
    for path in sorted(tree.rglob("*.jpg")):
        (bad / path.relative_to(tree).parent).mkdir(exist_ok=True)
        (bad / path.relative_to(tree)).write_bytes(path.read_bytes())
    (bad / "c1" / "99.jpg").write_bytes(b"not a jpeg")  # the new pack fails on its last shard
    with pytest.raises(Exception, match="99.jpg"):
        _pack(bad, url, opts, tmp_path / "b", overwrite=True)
    report = verify(url, storage_options=opts)
    assert report.ok and report.num_records == 24  # the old dataset, whole
    assert {s.file for s in PackedDataset(url, storage_options=opts, cache_limit=0).manifest.shards} == old
    (bad / "c1" / "99.jpg").write_bytes(make_jpeg(40, 40, seed=99))
    _pack(bad, url, opts, tmp_path / "b", overwrite=True)  # takes the failed pack's lease over at once
    ds = PackedDataset(url, storage_options=opts, cache_limit=0)
    assert len(ds) == 25 and verify(url, storage_options=opts).ok
    names = {name for name, _, _ in RemoteStore(url, opts).list_objects()}
    wanted = {s.file for s in ds.manifest.shards} | {e.file for e in ds.manifest.index.values()}
    assert names == wanted | {"manifest.json"}  # nothing skipped: no report
    assert not old & names  # no object of the old dataset or of the failed pack is left


def test_a_second_pack_to_the_same_url_is_refused_while_the_first_runs(
        tree, s3_server, s3_bucket, fault_proxy, tmp_path):
    url = f"s3://{s3_bucket}/busy.fl"
    fault_proxy.latency = 0.05  # the first pack takes a few seconds
    first = subprocess.Popen(_pack_command(tree, url, tmp_path / "one", s3_server.storage_options(fault_proxy.url)),
                             env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    store = RemoteStore(url, s3_server.storage_options())
    deadline = time.monotonic() + 60
    while first.poll() is None and time.monotonic() < deadline:
        if any(name == STORE_LEASE_NAME for name, _, _ in store.list_objects()):
            break
        time.sleep(0.05)
    assert first.poll() is None, "the first pack ended before the second could start: slow the proxy down"
    with pytest.raises(PackError, match=r"another pack \(pid \d+ on .*\) is writing here"):
        _pack(tree, url, s3_server.storage_options(), tmp_path / "two", shard_size="20KB")
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert verify(url, storage_options=s3_server.storage_options()).ok
    assert STORE_LEASE_NAME not in {name for name, _, _ in store.list_objects()}  # released
    assert not (tmp_path / "two").exists()


def _lease(store: RemoteStore, *, expires: float, host: str = "elsewhere", generations=()) -> None:
    store.put_bytes(STORE_LEASE_NAME, json.dumps({
        "fastload": "pack lease", "token": "x", "host": host, "boot": "", "pid": 1, "renewed": time.time() - 5,
        "expires": expires, "generations": list(generations)}).encode())


def test_a_live_lease_of_another_machine_is_refused_an_expired_one_taken_over(tree, s3_server, s3_bucket, tmp_path):
    opts = s3_server.storage_options()
    store = RemoteStore(f"s3://{s3_bucket}/leased.fl", opts)
    _lease(store, expires=time.time() + 100)
    with pytest.raises(PackError, match="another pack .*on elsewhere"):
        _pack(tree, store.url, opts, tmp_path / "s")
    # expired, naming a pack folder with a shard the dead pack left: taken over, the shard deleted
    store.put_bytes("gen-00000000000000aa/shard-00000.lmdb", b"left by a dead pack")
    _lease(store, expires=time.time() - 1, generations=["gen-00000000000000aa"])
    _pack(tree, store.url, opts, tmp_path / "s")
    names = {name for name, _, _ in store.list_objects()}
    assert verify(store.url, storage_options=opts).ok
    assert not any(n.startswith("gen-00000000000000aa") for n in names) and STORE_LEASE_NAME not in names


def test_conditional_writes_are_enforced_by_the_store(s3_server, s3_bucket):
    store = RemoteStore(f"s3://{s3_bucket}/cas", s3_server.storage_options())
    first = put_conditional(store, "x", b"1", None)
    assert first is not None and put_conditional(store, "x", b"2", None) is None  # exists already
    second = put_conditional(store, "x", b"3", first)
    assert second is not None and put_conditional(store, "x", b"4", first) is None  # stale ETag
    assert store.read_file("x", 10) == b"3"


def test_staging_must_be_a_folder_of_its_own(tree, s3_server, s3_bucket, tmp_path):
    opts = s3_server.storage_options()
    local = tmp_path / "local.fl"
    pack(tree, local, progress=False)
    before = sorted(p.relative_to(local).as_posix() for p in local.rglob("*"))
    with pytest.raises(PackError, match="not a staging folder of fastload's"):
        _pack(tree, f"s3://{s3_bucket}/a.fl", opts, local)
    assert sorted(p.relative_to(local).as_posix() for p in local.rglob("*")) == before
    assert verify(local).ok
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(PackError, match="not a staging folder of fastload's"):
        _pack(tree, f"s3://{s3_bucket}/a.fl", opts, mine)
    assert (mine / "notes.txt").read_text() == "keep"


def test_a_staging_folder_serves_one_url(tree, s3_server, s3_bucket, tmp_path):
    from fastload.converters.destination.out_dir import claim_staging

    claim_staging(tmp_path / "s", f"s3://{s3_bucket}/one.fl")
    with pytest.raises(PackError, match=f"staging folder of a pack to s3://{s3_bucket}/one.fl"):
        _pack(tree, f"s3://{s3_bucket}/two.fl", s3_server.storage_options(), tmp_path / "s")
    assert (tmp_path / "s").exists()
