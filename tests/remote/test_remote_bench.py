"""``fastload bench`` and ``doctor`` on store URLs: small objects in the store against a packed
dataset in the same store, read through the fault proxy with a round trip added to every request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastload.converters import pack
from fastload.benchmark import bench, doctor
from fastload.benchmark.far import store_rows
from fastload.benchmark.runs import Limits, run_all
from fastload.storage.remote import RemoteStore
from tests.conftest import make_jpeg
from tests.remote.fault_proxy import FaultProxy

LATENCY = 0.03  # seconds the proxy adds to every request


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
                          "raw reads: fastload lmdb, store, cache epoch 2", "fastload lmdb, store"]
    assert all(r["status"] == "ok" and r["samples"] > 0 for r in rows.values()), rows
    assert report["reference"] == {"pipeline": "torch small objects, tuned w2 pf4",
                                   "raw": "raw reads: small objects"}
    assert all(r["speedup"] for name, r in rows.items() if name.startswith(("raw reads: fastload", "fastload")))
    assert f"packed: {store['packed']}" in " ".join(report["notes"])
    # the verdict is about fastload on the store, its read stage the store's, measured here
    assert report["verdict"]["loader"] == "fastload lmdb, store"
    assert report["ceilings"]["store_latency_ms"] >= LATENCY * 1e3
    assert report["stages"][0]["name"] == "read (object store)"
    assert "object store:" in done.out and "verdict: I/O-bound (object store" in done.out, done.out
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


def test_doctor_names_far_storage_and_the_fix(store):
    store["proxy"].latency = 0.1  # round trips that dwarf a few small pieces' transfer
    try:
        packed = doctor(store["packed"], storage_options=store["options"], duration=0.3, batch_size=8,
                        progress=False)
        objects = doctor(store["objects"], storage_options=store["options"], duration=0.3, batch_size=8,
                         num_workers=1, progress=False)
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
                   torch_grid=[(1, 2)], dali=False, measure_ceilings=False, progress=False)
    assert [r.name for r in report.runs] == ["torch small objects, defaults", "torch small objects, tuned w1 pf2",
                                             "raw reads: small objects"]
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
                   torch_grid=[(1, 2)], dali=False, measure_ceilings=False, progress=False)
    assert all(r.status == "ok" for r in report.runs), [(r.name, r.status, r.error) for r in report.runs]
    assert any(n.startswith("skipped 1 file that cannot be decoded: 3.jpg (") for n in report.notes), report.notes


def test_an_empty_prefix_says_the_images_must_be_in_the_store_first(s3_server):
    bucket = s3_server.make_bucket("bench-empty")
    with pytest.raises(Exception, match="upload the images first"):
        bench(f"s3://{bucket}/photos", storage_options=s3_server.storage_options(), duration=0.1,
              dali=False, measure_ceilings=False, progress=False)
