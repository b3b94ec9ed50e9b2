"""``fastload bench`` and ``doctor`` on store URLs: small objects in the store against a packed
dataset in the same store, read through the fault proxy with a round trip added to every request."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from fastload.converters import pack

from fastload import PackedDataset
from fastload.benchmark import bench, doctor
from fastload.benchmark.connector import (
    MAP_ROW,
    ConnectorReads,
    ConnectorTarget,
    connector_rows,
    ranged_row_name,
)
from fastload.benchmark.far import StoreObjects, store_rows
from fastload.benchmark.runs import Limits, run_all
from fastload.storage.remote import RemoteStore
from tests.conftest import make_jpeg, write_tree
from tests.remote.fault_proxy import FaultProxy

LATENCY = 0.03  # seconds the proxy adds to every request
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _aws_environment(monkeypatch):
    """The connector's rows put the store's credentials in this process's AWS_* variables (where
    it reads them): each test starts without them, and what it set is undone after it."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, "recorded")
        monkeypatch.delenv(name)


@pytest.fixture(scope="module")
def store(s3_server, tmp_path_factory):
    """40 JPEGs in 2 classes as small objects under ``images/``, packed from there to ``images.fl``
    (several shards); the URLs and a proxy with a round trip added, shared by the module."""
    bucket = s3_server.make_bucket("bench-module")
    work = tmp_path_factory.mktemp("bench-store")
    objects = RemoteStore(f"s3://{bucket}/images", s3_server.storage_options())
    for c in range(2):
        for i in range(20):
            objects.put_bytes(f"c{c}/{i:02d}.jpg", make_jpeg(96 + i, 72, seed=i + 50 * c))
    pack(objects.url, f"s3://{bucket}/images.fl", shard_size="60KB", progress=False,
         storage_options=s3_server.storage_options(), staging=work / "staging")
    with FaultProxy(s3_server.host, s3_server.port) as proxy:
        proxy.latency = LATENCY
        yield {"objects": objects.url, "packed": f"s3://{bucket}/images.fl", "proxy": proxy,
               "options": s3_server.storage_options(proxy.url), "work": work}


def test_bench_on_store_urls_has_the_small_object_packed_and_cache_rows(store, cli, tmp_path):
    args = []
    for key, value in store["options"].items():
        args += ["--storage-option", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]
    out = tmp_path / "bench.json"
    done = cli("bench", store["objects"], "--duration", "0.3", "--repeats", "1", "--batch-size", "8",
               "--torch-workers", "2", "--no-dali", "--stages", "--quiet", "--work", tmp_path, "--json", out, *args)
    assert done.rc == 0, done.out + done.err
    report = json.loads(out.read_text())
    rows = {r["name"]: r for r in report["runs"]}
    assert list(rows) == ["torch small objects, defaults", "torch small objects, tuned w2 pf4",
                          "raw reads: small objects", "raw reads: fastload lmdb, store, no cache",
                          "raw reads: fastload lmdb, store, cache epoch 1",
                          "raw reads: fastload lmdb, store, cache epoch 2",
                          "raw reads: small objects, s3torchconnector",
                          "raw reads: lmdb shards, store, s3torchconnector ranged", "fastload lmdb, store"]
    assert all(r["status"] == "ok" and r["samples"] > 0 for r in rows.values()), rows
    # AWS's connector beside fastload, on the same store through the same proxy, compared by name
    notes = " ".join(report["notes"])
    assert "raw reads: fastload lmdb, store, cache epoch 1: " in notes
    assert "x the records/s of s3torchconnector's one GET per object" in notes
    assert "x the records/s of s3torchconnector's ranged reads of the same shards" in notes
    assert report["reference"] == {"pipeline": "torch small objects, tuned w2 pf4",
                                   "raw": "raw reads: small objects"}
    assert all(r["speedup"] for name, r in rows.items() if name.startswith(("raw reads: fastload", "fastload")))
    assert f"packed: {store['packed']}" in " ".join(report["notes"])
    # the verdict is about fastload on the store, its read stage the store's, measured here
    assert report["verdict"]["loader"] == "fastload lmdb, store"
    assert report["ceilings"]["store_latency_ms"] >= LATENCY * 1e3
    assert report["stages"][0]["name"] == "read (object store)"
    # named where the timings' rounds allow (on a busy machine the CPU stages' may overlap the store's)
    named = report["verdict"]["bottleneck"] is not None
    assert "object store:" in done.out, done.out
    assert ("verdict: I/O-bound (object store" if named else "verdict: too noisy to name the bottleneck") in done.out
    assert not list(tmp_path.glob("fastload-bench-cache-*"))  # the temporary cache is gone


def test_the_second_epoch_row_reads_only_the_cache(store, tmp_path):
    raw = store_rows(store["packed"], store["options"], str(tmp_path / "cache"), batch_size=8,
                     image_size=32, train=False)
    names = [spec.name for spec in raw]
    proxy = store["proxy"]
    (first,), _ = run_all([raw[names.index("raw reads: fastload lmdb, store, cache epoch 1")]],
                          Limits(duration=0.2))
    proxy.clear()
    (second,), _ = run_all([raw[names.index("raw reads: fastload lmdb, store, cache epoch 2")]],
                           Limits(duration=0.2))
    assert first.status == second.status == "ok" and second.samples > 0
    assert [r.path for r in proxy.requests if "/shard-" in r.path] == []


def test_the_connector_row_reads_each_object_with_one_get_through_the_proxy(store):
    objects = StoreObjects.from_store(store["objects"], store["options"], image_size=32)
    rows, notes = connector_rows(objects, [store["packed"]], store["options"], batch_size=8)
    assert notes == [] and [r.name for r in rows] == [MAP_ROW, ranged_row_name("lmdb")]
    reads = rows[0].make()  # the connector lists the prefix here, before the clock
    proxy = store["proxy"]
    proxy.clear()
    sizes = [int(n) for batch in reads for n in batch]  # one epoch, shuffled
    gets = [r for r in proxy.requests if r.method == "GET"]
    assert sorted(sizes) == sorted(objects.sizes)
    assert len(gets) == len(objects) == 40 and all(g.path.split("?")[0].startswith("/bench-module/images/")
                                                    for g in gets), [g.path for g in gets]
    assert not [r for r in proxy.requests if r.method != "GET"]  # sizes from the listing: no HEAD


def test_the_connector_ranged_reader_fetches_each_record_with_one_ranged_get(store):
    ds = PackedDataset(store["packed"], storage_options=store["options"], cache_limit=0)
    reads = ConnectorReads(ConnectorTarget.from_options(store["packed"], store["options"]), in_flight=8,
                           ranged=True)
    records = [3, 17, 0, 39, 22]
    places = [ds.reader.locate(i) for i in records]
    store["proxy"].clear()
    got = reads.read_ranges([(reads.position(shard.name), offset, size) for shard, offset, size in places])
    gets = store["proxy"].requests
    assert got == ds.reader.read_many(records)  # the records' exact bytes
    assert len(gets) == len(records) and all(g.method == "GET" and g.headers["range"].startswith("bytes=")
                                              for g in gets)


def test_doctor_names_far_storage_and_the_fix(store):
    store["proxy"].latency = 0.1  # round trips that dwarf a few small pieces' transfer
    # each stage and ceiling timed for 0.1 s, not the default 0.5 s: a 0.1 s round trip against a
    # small JPEG's decode is a verdict a short sample already tells
    try:
        packed = doctor(store["packed"], storage_options=store["options"], duration=0.3, batch_size=8,
                        stage_budget=0.1, progress=False, repeats=1)
        objects = doctor(store["objects"], storage_options=store["options"], duration=0.3, batch_size=8,
                         num_workers=1, stage_budget=0.1, progress=False, repeats=1)
    finally:
        store["proxy"].latency = LATENCY
    assert packed.verdict is not None and packed.verdict.bottleneck == "io"
    assert packed.verdict.label == "I/O-bound (object store, latency-bound)"
    assert packed.verdict.loader == "fastload lmdb, store"
    assert any("run next to the store" in a for a in packed.verdict.advice)
    assert objects.verdict is not None and objects.verdict.label == "I/O-bound (object store, latency-bound)"
    assert objects.verdict.advice[0].startswith("pack the objects into shards in the store")
    assert objects.runs[0].name == "doctor: torch small objects in a store (one GET each, Pillow)"


def test_a_store_prefix_without_a_packed_copy_runs_the_small_objects_alone(store, s3_server):
    bucket = s3_server.make_bucket("bench-alone")
    alone = RemoteStore(f"s3://{bucket}/photos", s3_server.storage_options())
    for i in range(6):
        alone.put_bytes(f"{i}.jpg", make_jpeg(40, 30, seed=i))
    report = bench(alone.url, storage_options=s3_server.storage_options(), duration=0.1, batch_size=4,
                   torch_grid=[(1, 2)], dali=False, measure_ceilings=False, progress=False, repeats=1)
    assert [r.name for r in report.runs] == ["torch small objects, defaults", "torch small objects, tuned w1 pf2",
                                             "raw reads: small objects", MAP_ROW]
    assert any(f"fastload pack {alone.url} -o {alone.url}.fl" in n for n in report.notes)


def test_store_urls_are_checked_before_anything_runs(store, s3_server, tmp_path):
    with pytest.raises(Exception, match="no manifest.json there"):
        bench(store["objects"], [store["objects"] + "-none.fl"], storage_options=s3_server.storage_options())
    with pytest.raises(ValueError, match="storage options are for object-store URLs"):
        bench(Path(tmp_path), storage_options={"anon": True})


def test_a_bad_object_is_left_out_up_front_and_named_as_a_local_file_would_be(s3_server):
    bucket = s3_server.make_bucket("bench-bad")
    objects = RemoteStore(f"s3://{bucket}/photos", s3_server.storage_options())
    for i in range(6):
        objects.put_bytes(f"{i}.jpg", make_jpeg(40, 30, seed=i))
    objects.put_bytes("3.jpg", b"not a jpeg")
    report = bench(objects.url, storage_options=s3_server.storage_options(), duration=0.1, batch_size=2,
                   torch_grid=[(1, 2)], dali=False, measure_ceilings=False, progress=False, repeats=1)
    assert all(r.status == "ok" for r in report.runs), [(r.name, r.status, r.error) for r in report.runs]
    assert any(n.startswith("skipped 1 file that cannot be decoded: 3.jpg (") for n in report.notes), report.notes


def test_an_empty_prefix_says_the_images_must_be_in_the_store_first(s3_server):
    bucket = s3_server.make_bucket("bench-empty")
    with pytest.raises(Exception, match="upload the images first"):
        bench(f"s3://{bucket}/photos", storage_options=s3_server.storage_options(), duration=0.1,
              dali=False, measure_ceilings=False, progress=False)


def test_remote_bench_runs_the_connector_rows_on_the_same_objects_through_its_proxy(tmp_path):
    photos = tmp_path / "photos"
    write_tree(photos, {f"c{i % 2}/{i:02d}.jpg": make_jpeg(60 + i, 40, seed=i) for i in range(12)})
    pack(photos, tmp_path / "photos.fl", shard_size="40KB", progress=False)
    rows = "small objects;s3torchconnector, one GET per object;s3torchconnector ranged, one GET per record"
    out = tmp_path / "remote.json"
    done = subprocess.run([sys.executable, str(REPO / "bench" / "remote_bench.py"), str(photos), str(tmp_path / "photos.fl"),
                           "--latency", "0.01", "--small-records", "10", "--skip-train", "--rows", rows,
                           "--json", str(out)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    by = {r["name"]: r for r in report["rows"]}
    assert list(by) == rows.split(";") and report["s3torchconnector"] == version("s3torchconnector")
    small, whole, ranged = by.values()
    # the same 10 objects, one GET each (and one listing), as the proxy counted them
    assert small["records"] == whole["records"] == ranged["records"] == 10
    assert small["requests"] == whole["requests"] == ranged["requests"] == 11
    assert whole["bytes"] == small["bytes"]
    assert ranged["range_bytes"] == ranged["bytes"] > 0  # each record's own range, no more
    assert all(r["server_cpu_s"] >= 0 and r["proxy_cpu_s"] >= 0 and r["client_cpu_s"] > 0 for r in by.values())
    assert "s3torchconnector one GET per object / small objects" in report["ratios"]
