"""fastload.ray.PackSink writing to an object store (the remote tests' moto S3 server) from the
two-node Ray cluster: a folder, a Parquet table and WebDataset tars packed to ``s3://`` read back
bit-exact against a local pack of the same source; a failed replacement leaves the published
dataset; the same pack twice writes the same index; a node lost mid-pack leaves every record once
and no object but the dataset's; a driver killed mid-pack (kill -9) and run again finishes, reusing
the parts its tasks had uploaded; a prefix holding a user's object is refused and left as it is.
And the loader's side: mode="ray" actors decoding a dataset in the store."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.cluster.conftest import write_photo_tables
from tests.conftest import REPO, many_small_jpegs
from tests.remote.conftest import s3_server  # noqa: F401 - the session's moto server

ray = pytest.importorskip("ray", reason="the Ray tests need ray[data]: pip install -e '.[ray]'")
pytest.importorskip("pyarrow")


import fastload
from fastload.errors import PackError
from fastload.format import MANIFEST_NAME

IMAGES = 24
SHARD = "4KB"  # below a block's bytes (3 photos of ~2 KB): each block is one write task, the same each run


class Bucket:
    """A bucket of the moto server, with what the tests ask of it."""

    def __init__(self, server: Any) -> None:
        self.server, self.name = server, server.make_bucket(f"fastload-ray-{uuid.uuid4().hex[:12]}")
        self.options = server.storage_options()

    def url(self, prefix: str) -> str:
        return f"s3://{self.name}/{prefix}"

    def objects(self, prefix: str) -> set[str]:
        """Every object under ``prefix/``, by name relative to it."""
        pages = self.server.client().get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix + "/")
        return {o["Key"][len(prefix) + 1:] for page in pages for o in page.get("Contents", [])}

    def read(self, key: str) -> bytes:
        return self.server.client().get_object(Bucket=self.name, Key=key)["Body"].read()

    def dataset(self, prefix: str) -> fastload.PackedDataset:
        return fastload.PackedDataset(self.url(prefix), storage_options=self.options)


@pytest.fixture(scope="module")
def bucket(s3_server: Any) -> Bucket:  # noqa: F811 - the fixture imported above
    return Bucket(s3_server)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An ImageFolder of small JPEGs (3 classes) and its local pack."""
    root = tmp_path_factory.mktemp("ray-store") / "images"
    many_small_jpegs(root, IMAGES, classes=3)
    fastload.pack(root, root.parent / "local.fl")
    return root, root.parent / "local.fl"


def folder_dataset(root: Path, blocks: int = 8, delay: float = 0.0) -> Any:
    """The folder as Ray reads it, each file's folder name its label (``delay``: seconds a row)."""
    ds = ray.data.read_binary_files(str(root), include_paths=True, override_num_blocks=blocks)
    return ds.map(lambda row: (time.sleep(delay), {**row, "label": row["path"].split("/")[-2]})[1])


def pack(ds: Any, bucket: Bucket, prefix: str, **options: Any) -> Any:
    from fastload.ray import PackSink

    sink = PackSink(bucket.url(prefix), storage_options=bucket.options, **{"image": "bytes", "shard_size": SHARD,
                                                                           **options})
    ds.write_datasink(sink)
    assert sink.report is not None and sink.report.out == bucket.url(prefix)
    return sink.report


def assert_same_records(packed: fastload.PackedDataset, local: Path, fields: tuple[str, ...] = ()) -> None:
    want = fastload.PackedDataset(local)
    assert len(packed) == len(want) and packed.classes == want.classes
    for i in range(len(want)):
        got, expected = packed.record(i), want.record(i)
        for name in ("data", "label", "width", "height", *fields):
            assert got[name] == expected[name], (i, name, got["path"], expected["path"])


def assert_only_the_dataset(bucket: Bucket, prefix: str) -> fastload.PackedDataset:
    """The prefix holds the dataset's objects and nothing else: no task part, no lease, no old shard."""
    packed = bucket.dataset(prefix)
    listed = {MANIFEST_NAME, *(s.file for s in packed.manifest.shards),
              *(e.file for e in packed.manifest.index.values())}
    if packed.manifest.packed.get("skipped_report"):  # beside the index, in the dataset's pack folder
        listed.add(packed.manifest.shards[0].file.split("/")[0] + "/" + packed.manifest.packed["skipped_report"])
    assert set(bucket.objects(prefix)) == listed
    assert fastload.verify(bucket.url(prefix), storage_options=bucket.options).ok
    return packed


def index_bytes(bucket: Bucket, prefix: str) -> dict[str, bytes]:
    packed = bucket.dataset(prefix)
    return {column: bucket.read(f"{prefix}/{entry.file}") for column, entry in packed.manifest.index.items()}


def test_a_folder_packs_to_the_store_as_a_local_pack_does(cluster: Any, bucket: Bucket,
                                                          photos: tuple[Path, Path]) -> None:
    """Bit-exact against the local pack; a failed replacement leaves it; the same pack again (with
    ``overwrite``) writes the same index, and only the new dataset's objects stay."""
    root, local = photos
    report = pack(folder_dataset(root), bucket, "folder.fl")
    assert report.num_records == IMAGES and report.num_shards > 1  # several tasks' shards, adopted
    assert_same_records(assert_only_the_dataset(bucket, "folder.fl"), local, fields=())
    before, index = bucket.read(f"folder.fl/{MANIFEST_NAME}"), index_bytes(bucket, "folder.fl")

    broken = folder_dataset(root).map(
        lambda row: {**row, "bytes": b"not a picture" if row["path"].endswith("00007.jpg") else row["bytes"]})
    with pytest.raises(Exception, match="img_00007.jpg"):  # the task's SourceError, as Ray passes it on
        pack(broken, bucket, "folder.fl", overwrite=True)
    assert bucket.read(f"folder.fl/{MANIFEST_NAME}") == before
    assert_same_records(bucket.dataset("folder.fl"), local)
    with pytest.raises(PackError, match="already holds a finished dataset"):
        pack(folder_dataset(root), bucket, "folder.fl")

    again = pack(folder_dataset(root), bucket, "folder.fl", overwrite=True)  # the failed pack's parts: deleted
    assert again.num_records == IMAGES
    assert_only_the_dataset(bucket, "folder.fl")
    assert bucket.read(f"folder.fl/{MANIFEST_NAME}") != before  # a new dataset, in a pack folder of its own
    assert index_bytes(bucket, "folder.fl") == index


def test_a_parquet_table_packs_to_the_store_as_a_local_pack_does(cluster: Any, bucket: Bucket,
                                                                 photos: tuple[Path, Path], tmp_path: Path) -> None:
    tables = write_photo_tables(sorted(photos[0].rglob("*.jpg")), tmp_path / "tables", row_group=4)
    fastload.pack(tables, tmp_path / "local.fl", image_column="jpg", label_column="species")
    pack(ray.data.read_parquet(str(tables)), bucket, "table.fl", image="jpg", label="species", key="key",
         fields=("caption",))
    assert_same_records(assert_only_the_dataset(bucket, "table.fl"), tmp_path / "local.fl", fields=("caption",))


def test_webdataset_tars_pack_to_the_store_as_a_local_pack_does(cluster: Any, bucket: Bucket,
                                                                photos: tuple[Path, Path], tmp_path: Path) -> None:
    """Numbered labels (.cls), a .json field and a bad picture skipped (``on_error="skip"``, reported in
    the store); keys in tar order, so the local pack's order is the keys'."""
    files = sorted(photos[0].rglob("*.jpg"))
    tars = tmp_path / "tars"
    tars.mkdir()
    for part in range(2):
        with tarfile.open(tars / f"data-{part}.tar", "w") as tar:
            for k in range(part * IMAGES // 2, (part + 1) * IMAGES // 2):
                picture = b"not a picture" if k == 5 else files[k].read_bytes()
                for ext, data in (("jpg", picture), ("cls", str(k % 3).encode()),
                                  ("json", json.dumps({"n": k}).encode())):
                    info = tarfile.TarInfo(f"sample{k:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    fastload.pack(tars, tmp_path / "local.fl", on_error="skip")
    ds = ray.data.read_webdataset(str(tars), decoder=None).map(
        lambda row: {"key": row["__key__"], "jpg": row["jpg"], "label": int(row["cls"]),
                     "n": json.loads(row["json"])["n"]})
    report = pack(ds, bucket, "tars.fl", image="jpg", key="key", fields=("n",), on_error="skip")
    assert report.skipped == 1 and report.num_records == IMAGES - 1
    assert_same_records(assert_only_the_dataset(bucket, "tars.fl"), tmp_path / "local.fl", fields=("n",))
    assert report.skipped_report is not None and str(report.skipped_report).startswith(bucket.url("tars.fl/gen-"))
    skipped = bucket.read(str(report.skipped_report).removeprefix(f"s3://{bucket.name}/")).decode()
    assert [json.loads(line)["path"] for line in skipped.splitlines()] == ["sample0005"]


def when_parts_appear(bucket: Bucket, prefix: str, then: Callable[[], None]) -> threading.Thread:
    """A thread that runs ``then`` once a task's part is in the store (other tasks still to run)."""
    def watch() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(n.endswith("/" + MANIFEST_NAME) for n in bucket.objects(prefix)):
            time.sleep(0.02)
        then()

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


def test_a_node_lost_mid_pack_to_the_store_loses_no_record(cluster: Any, bucket: Bucket,
                                                           photos: tuple[Path, Path]) -> None:
    root, local = photos
    node = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    removed: list[int] = []
    watcher = when_parts_appear(bucket, "lost.fl", lambda: (removed.append(len(bucket.objects("lost.fl"))),
                                                            cluster.remove_node(node)))
    try:
        pack(folder_dataset(root, blocks=8, delay=0.05), bucket, "lost.fl")
    finally:
        watcher.join()
    assert removed and removed[0] > 0  # the node went while the pack was writing
    packed = assert_only_the_dataset(bucket, "lost.fl")  # no part, no retried task's copy left
    paths = [packed.record(i)["path"] for i in range(len(packed))]
    assert len(paths) == IMAGES and len(set(paths)) == IMAGES and paths == sorted(paths)  # each record once
    assert_same_records(packed, local)


DRIVER = textwrap.dedent(f"""
    import json, sys, time
    import ray
    from fastload.ray import PackSink

    address, root, url, options = sys.argv[1:]
    ray.init(address=address, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = ray.data.read_binary_files(root, include_paths=True, override_num_blocks=8)
    ds = ds.map(lambda row: (time.sleep(0.2), {{**row, "label": row["path"].split("/")[-2]}})[1])
    ds.write_datasink(PackSink(url, image="bytes", shard_size={SHARD!r}, storage_options=json.loads(options)))
""")


def test_a_driver_killed_mid_pack_then_run_again_reuses_the_parts(cluster: Any, bucket: Bucket,
                                                                  photos: tuple[Path, Path], tmp_path: Path) -> None:
    root, local = photos
    (tmp_path / "driver.py").write_text(DRIVER)
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), cluster.address, str(root),
                               bucket.url("killed.fl"), json.dumps(bucket.options)], cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        watcher = when_parts_appear(bucket, "killed.fl", lambda: os.kill(driver.pid, signal.SIGKILL))
        watcher.join()
        assert driver.wait(60) == -signal.SIGKILL, driver.stderr.read().decode()[-2000:] if driver.stderr else ""
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    time.sleep(1)  # the dead job's tasks are stopped by Ray; a part they finish meanwhile is reused all the same
    finished = [n for n in bucket.objects("killed.fl") if n.endswith("/" + MANIFEST_NAME)]
    assert finished and MANIFEST_NAME not in bucket.objects("killed.fl")  # parts, and no dataset
    report = pack(folder_dataset(root, blocks=8), bucket, "killed.fl")  # the same pack again
    assert report.resumed_shards >= len(finished) > 0  # each finished part's shards reused, not written again
    packed = assert_only_the_dataset(bucket, "killed.fl")
    assert_same_records(packed, local)


def test_a_prefix_holding_a_users_object_is_refused_and_left_alone(bucket: Bucket) -> None:
    from fastload.ray import PackSink

    bucket.server.client().put_object(Bucket=bucket.name, Key="mine.fl/notes.txt", Body=b"keep me")
    with pytest.raises(PackError, match="not a fastload dataset's"):
        PackSink(bucket.url("mine.fl"), storage_options=bucket.options)
    assert bucket.read("mine.fl/notes.txt") == b"keep me"


def test_cli_ray_packs_a_folder_to_the_store_as_a_local_pack(cluster: Any, bucket: Bucket,
                                                             photos: tuple[Path, Path]) -> None:
    """``fastload pack SRC --ray ADDRESS -o s3://...`` with the store's --storage-option flags: the
    plain Ray tasks upload their parts, the driver publishes; a second run with --overwrite writes
    the same index; only the dataset's objects stay."""
    from fastload.cli import main

    root, local = photos
    flags = [f"--storage-option={key}={value if isinstance(value, str) else json.dumps(value)}"
             for key, value in bucket.options.items()]
    command = ["pack", str(root), "-o", bucket.url("cli.fl"), "--ray", "--ray-address", cluster.address, "--shard-size", SHARD,
               "--quiet", *flags]
    assert main(command) == 0
    assert_same_records(assert_only_the_dataset(bucket, "cli.fl"), local)
    index = index_bytes(bucket, "cli.fl")
    assert main([*command, "--overwrite"]) == 0
    assert_only_the_dataset(bucket, "cli.fl")
    assert index_bytes(bucket, "cli.fl") == index


def test_decode_actors_read_a_dataset_in_the_store(cluster: Any, bucket: Bucket, photos: tuple[Path, Path]) -> None:
    """mode="ray" on an ``s3://`` dataset: each actor opens it from its URL on its node (the
    storage options travel with the dataset) and makes the threads mode's batches."""
    fastload.pack(photos[0], bucket.url("decode.fl"), storage_options=bucket.options)
    ds = fastload.PackedDataset(bucket.url("decode.fl"), storage_options=bucket.options, image_size=32, train=True)
    threads = fastload.DataLoader(ds, batch_size=5, shuffle=True, seed=2, mode="threads")
    remote = fastload.DataLoader(ds, batch_size=5, shuffle=True, seed=2, mode="ray", num_workers=2)
    got, want = list(remote), list(threads)
    assert [y.tolist() for _, y in got] == [y.tolist() for _, y in want]
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got, want))
    assert sorted(y for _, labels in got for y in labels.tolist()) == sorted(ds.index.label.tolist())
