"""fastload.ray.PackSink on a real Ray cluster of two nodes on this machine (one CPU each), started
once for the module: folders and Parquet tables packed by Ray read back bit-exact against a local
``fastload.pack`` of the same source, in the same order; the same pack twice gives the same index;
a failed pack leaves the old dataset; a re-run reuses the tasks' finished shards; the tasks' worker
processes share a few malloc arenas; a node lost mid-pack leaves every record exactly once and no
orphan file; ``fastload pack SRC --ray --ray-address ADDRESS`` on a folder, a JSONL list and WebDataset tars gives
a local pack's records, skips a bad picture as it does, and run again after a failed run reuses the
parts its tasks had finished."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.cluster.conftest import write_photo_tables
from tests.conftest import many_small_jpegs

ray = pytest.importorskip("ray", reason="the Ray tests need ray[data]: pip install -e '.[ray]'")
pytest.importorskip("pyarrow")

from ray.cluster_utils import Cluster

import fastload
from fastload.cli import main
from fastload.errors import PackError
from fastload.format import INDEX_DIR, MANIFEST_NAME, PACK_STATE_DIR

IMAGES = 48


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An ImageFolder of small JPEGs (3 classes) and its local pack."""
    root = tmp_path_factory.mktemp("ray") / "images"
    many_small_jpegs(root, IMAGES, classes=3)
    local = root.parent / "local.fl"
    fastload.pack(root, local)
    return root, local


def folder_dataset(root: Path, blocks: int = 6) -> Any:
    """The folder as Ray reads it, each file's class (its folder's name) as its label."""
    ds = ray.data.read_binary_files(str(root), include_paths=True, override_num_blocks=blocks)
    return ds.map(lambda row: {**row, "label": row["path"].split("/")[-2]})


def pack_folder(root: Path, out: Path, **options: Any) -> fastload.converters.packing.report.PackReport:
    from fastload.ray import PackSink

    sink = PackSink(out, image="bytes", shard_size="20KB", **options)
    folder_dataset(root).write_datasink(sink)
    assert sink.report is not None
    return sink.report


def assert_same_records(packed: Path, local: Path, fields: tuple[str, ...] = ()) -> None:
    a, b = fastload.PackedDataset(packed), fastload.PackedDataset(local)
    assert len(a) == len(b) and a.classes == b.classes
    for i in range(len(b)):
        got, want = a.record(i), b.record(i)
        for name in ("data", "label", "width", "height", *fields):
            assert got[name] == want[name], (i, name, got["path"], want["path"])


def index_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / INDEX_DIR).glob("*.npy"))}


def test_folder_packs_as_a_local_pack_does(cluster: Cluster, photos: tuple[Path, Path], tmp_path: Path) -> None:
    root, local = photos
    report = pack_folder(root, tmp_path / "a.fl")
    assert report.num_records == IMAGES and report.num_shards > 1  # several tasks' shards, adopted
    assert_same_records(tmp_path / "a.fl", local)
    assert main(["verify", str(tmp_path / "a.fl")]) == 0
    assert sorted(p.name for p in (tmp_path / "a.fl").iterdir() if not p.name.startswith("shard-")) == [
        INDEX_DIR, MANIFEST_NAME]  # no work folder, no lock, no orphan
    pack_folder(root, tmp_path / "b.fl")
    assert index_bytes(tmp_path / "a.fl") == index_bytes(tmp_path / "b.fl")  # the same pack twice: one index


def test_parquet_table_packs_as_a_local_pack_does(cluster: Cluster, photos: tuple[Path, Path], tmp_path: Path) -> None:
    from fastload.ray import PackSink

    tables = write_photo_tables(sorted(photos[0].rglob("*.jpg")), tmp_path / "tables", row_group=8)
    local = tmp_path / "local.fl"
    fastload.pack(tables, local, image_column="jpg", label_column="species")
    sink = PackSink(tmp_path / "ray.fl", image="jpg", label="species", key="key", fields=("caption", "score"),
                    shard_size="20KB")
    ray.data.read_parquet(str(tables)).write_datasink(sink)
    assert_same_records(tmp_path / "ray.fl", local, fields=("caption", "score"))
    assert main(["verify", str(tmp_path / "ray.fl")]) == 0


def test_a_failed_pack_leaves_the_old_dataset(cluster: Cluster, photos: tuple[Path, Path], tmp_path: Path) -> None:
    root, _ = photos
    out = tmp_path / "a.fl"
    pack_folder(root, out)
    before = (out / MANIFEST_NAME).read_bytes()
    broken = folder_dataset(root).map(
        lambda row: {**row, "bytes": b"not a picture" if row["path"].endswith("00007.jpg") else row["bytes"]})
    from fastload.ray import PackSink

    with pytest.raises(Exception, match="img_00007.jpg"):  # the task's SourceError, as Ray passes it on
        broken.write_datasink(PackSink(out, image="bytes", overwrite=True, shard_size="20KB"))
    assert (out / MANIFEST_NAME).read_bytes() == before and main(["verify", str(out)]) == 0
    with pytest.raises(PackError, match="already holds a finished dataset"):
        PackSink(out)


def test_a_rerun_reuses_the_shards_written(cluster: Cluster, photos: tuple[Path, Path], tmp_path: Path) -> None:
    """A driver gone before its finalize (here: the finalize refused) leaves the tasks' datasets; the
    same pack again adopts those very files (hard links of them) without writing them again."""
    from fastload.ray import PackSink

    class Interrupted(PackSink):
        def on_write_complete(self, write_result: Any) -> None:
            self.pack.give_up()
            raise KeyboardInterrupt  # the driver stops here: no manifest

    root, local = photos
    out = tmp_path / "a.fl"
    with pytest.raises(BaseException):  # noqa: B017 - Ray may wrap it
        folder_dataset(root).write_datasink(Interrupted(out, image="bytes", shard_size="20KB"))
    assert not (out / MANIFEST_NAME).exists()
    written = {p.stat().st_ino for p in (out / PACK_STATE_DIR).rglob("shard-*")}
    assert written
    pack_folder(root, out)
    assert {p.stat().st_ino for p in out.glob("shard-*")} == written
    assert_same_records(out, local)


def _arenas_after_threads() -> tuple[str | None, int | None]:
    """In a Ray worker: threads that allocate and exit, as each part's read threads do; then the
    worker's MALLOC_ARENA_MAX and its malloc arenas."""
    import os
    import threading

    from fastload.storage.allocator import malloc_arenas

    def allocate() -> None:
        blocks = [bytes(100_000) for _ in range(64)]
        del blocks
    for _ in range(3):
        threads = [threading.Thread(target=allocate) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return os.environ.get("MALLOC_ARENA_MAX"), malloc_arenas()


def test_a_pack_tasks_worker_shares_a_few_malloc_arenas(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ray worker's own threads take most of glibc's arenas, and each part's new read threads were
    dealt arenas other than the ones the last part freed into (tens of thousands of page faults a
    task). Pack tasks run in workers started with their arenas bounded; a user's own bound wins."""
    from fastload.converters.cluster.ray_tasks import WORKER_ARENAS, task_options

    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    limit, arenas = ray.get(ray.remote(**task_options())(_arenas_after_threads).remote())
    assert limit == str(WORKER_ARENAS)
    assert arenas is not None and arenas <= WORKER_ARENAS
    monkeypatch.setenv("MALLOC_ARENA_MAX", "3")
    assert ray.get(ray.remote(**task_options())(_arenas_after_threads).remote())[0] == "3"


def test_a_node_lost_mid_pack_loses_no_record(cluster: Cluster, photos: tuple[Path, Path], tmp_path: Path) -> None:
    from fastload.ray import PackSink

    root, local = photos
    node = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    out = tmp_path / "a.fl"
    work = out / PACK_STATE_DIR / "ray"

    removed: list[bool] = []

    def remove_when_writing() -> None:  # once the first task has begun its dataset: others still run
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (work.is_dir() and any(work.iterdir())):
            time.sleep(0.02)
        removed.append(work.is_dir())
        cluster.remove_node(node)

    slow = folder_dataset(root, blocks=12).map(lambda row: (time.sleep(0.05), row)[1])
    remover = threading.Thread(target=remove_when_writing)
    remover.start()
    try:
        sink = PackSink(out, image="bytes", shard_size="8KB")
        slow.write_datasink(sink)
    finally:
        remover.join()
    assert removed == [True]  # the node went while the pack was writing
    packed = fastload.PackedDataset(out)
    paths = [packed.record(i)["path"] for i in range(len(packed))]
    assert len(paths) == IMAGES and len(set(paths)) == IMAGES and paths == sorted(paths)  # each record once
    assert_same_records(out, local)
    listed = {s.file for s in packed.manifest.shards}
    assert {p.name for p in out.glob("shard-*")} == listed and not (out / PACK_STATE_DIR).exists()  # no orphan
    assert np.array_equal(packed.targets, fastload.PackedDataset(local).targets)


def test_cli_ray_packs_the_records_of_a_local_pack(cluster: Cluster, photos: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    """``fastload pack SRC --ray --ray-address ADDRESS``: the local listing's records, order, labels, paths and
    fields, for a folder and for a JSONL list whose order is not its paths' (the shards may differ)."""
    root, local = photos
    out = tmp_path / "cli.fl"
    assert main(["pack", str(root), "-o", str(out), "--ray", "--ray-address", cluster.address, "--shard-size", "20KB", "--quiet"]) == 0
    packed = fastload.PackedDataset(out).manifest.packed
    assert len(fastload.PackedDataset(out).manifest.shards) > 1
    # `fastload info` says what was packed, and how: the folder, its layout, on Ray (issue 39, item 4)
    assert (packed["source"], packed["layout"], packed["cluster"]) == (str(root), "imagefolder", "ray")
    assert_same_records(out, local, fields=("path",))
    placement = {"shard.npy", "offset.npy", "position.npy"}  # where each record sits: the shards differ
    assert {n: b for n, b in index_bytes(out).items() if n not in placement} == {
        n: b for n, b in index_bytes(local).items() if n not in placement}  # checksums, paths, labels, sizes
    files = sorted(root.rglob("*.jpg"), key=lambda p: p.name, reverse=True)  # not in path order
    lines = [f'{{"path": "{p.relative_to(root.parent).as_posix()}", "label": "{p.parent.name}", "n": {k}, '
             f'"caption": "photo {k}"}}' for k, p in enumerate(files)]
    (root.parent / "list.jsonl").write_text("\n".join(lines) + "\n")
    listed = root.parent / "list.jsonl"
    fastload.pack(listed, tmp_path / "list-local.fl")
    assert main(["pack", str(listed), "-o", str(tmp_path / "list-ray.fl"), "--ray", "--ray-address", cluster.address, "--shard-size", "20KB", "--quiet"]) == 0
    assert_same_records(tmp_path / "list-ray.fl", tmp_path / "list-local.fl", fields=("path", "n", "caption"))
    assert main(["verify", str(tmp_path / "list-ray.fl")]) == 0


def test_cli_ray_packs_webdataset_tars_as_a_local_pack(cluster: Cluster, photos: tuple[Path, Path],
                                                       tmp_path: Path) -> None:
    """Tar members read in place by the tasks; numbered labels (.cls, no class names) and a .json field."""
    files = sorted(photos[0].rglob("*.jpg"))
    tars = tmp_path / "tars"
    tars.mkdir()
    for part in range(2):
        with tarfile.open(tars / f"data-{part}.tar", "w") as tar:
            for k, path in enumerate(files[part::2]):
                for ext, data in (("jpg", path.read_bytes()), ("cls", str(k % 3).encode()),
                                  ("json", json.dumps({"n": k}).encode())):
                    info = tarfile.TarInfo(f"{path.stem}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    fastload.pack(tars, tmp_path / "local.fl")
    assert main(["pack", str(tars), "-o", str(tmp_path / "ray.fl"), "--ray", "--ray-address", cluster.address, "--shard-size", "20KB",
                 "--quiet"]) == 0
    assert_same_records(tmp_path / "ray.fl", tmp_path / "local.fl", fields=("path", "n"))


def test_cli_ray_packs_a_class_tree_in_a_tar_gz_as_a_local_pack(cluster: Cluster, photos: tuple[Path, Path],
                                                               tmp_path: Path) -> None:
    """An ImageFolder tree tarred as it is (issue 44, item 5): labelled by its folders, read by the tasks."""
    root, local = photos
    path = tmp_path / "images.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(root, arcname="images")
    fastload.pack(path, tmp_path / "local.fl")
    assert main(["pack", str(path), "-o", str(tmp_path / "ray.fl"), "--ray", "--ray-address", cluster.address,
                 "--shard-size", "20KB", "--quiet"]) == 0
    assert_same_records(tmp_path / "ray.fl", tmp_path / "local.fl")
    assert fastload.PackedDataset(tmp_path / "ray.fl").classes == fastload.PackedDataset(local).classes


def test_cli_ray_rerun_after_a_failed_driver_reuses_the_parts_written(
        cluster: Cluster, photos: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A ``--ray`` pack that stops before its finalize (here: a bad picture in its last part fails it;
    the driver gives up as a killed one leaves things) keeps its tasks' finished parts; the same
    command again, the picture fixed, adopts those very shard files (their inodes), named by their
    listings, without packing them again."""
    root = tmp_path / "images"
    shutil.copytree(photos[0], root)
    last = max(root.rglob("*.jpg"))  # the listing's last record: the last part's
    good = last.read_bytes()
    last.write_bytes(b"not a picture")
    out = tmp_path / "a.fl"
    command = ["pack", str(root), "-o", str(out), "--ray", "--ray-address", cluster.address, "--shard-size", "8KB", "--quiet"]
    assert main(command) != 0
    assert f"{last}: not a readable image" in capsys.readouterr().err  # the task's error, as Ray passes it on
    assert not (out / MANIFEST_NAME).exists()
    finished = [m.parent for m in (out / PACK_STATE_DIR).rglob(MANIFEST_NAME)]
    written = {p.stat().st_ino for part in finished for p in part.glob("shard-*")}
    assert written  # the failed task's parts before its last, at least
    last.write_bytes(good)
    assert main(command) == 0
    assert written <= {p.stat().st_ino for p in out.glob("shard-*")}
    assert_same_records(out, photos[1], fields=("path",))
    assert main(["verify", str(out)]) == 0


def test_cli_ray_skips_a_bad_picture_as_a_local_pack_does(cluster: Cluster, photos: tuple[Path, Path],
                                                          tmp_path: Path) -> None:
    """``--on-error skip``: the bad picture is left out and reported, the others packed in the local pack's order."""
    root = tmp_path / "images"
    shutil.copytree(photos[0], root)
    bad = sorted(root.rglob("*.jpg"))[IMAGES // 2]
    bad.write_bytes(b"not a picture")
    fastload.pack(root, tmp_path / "local.fl", on_error="skip")
    out = tmp_path / "ray.fl"
    assert main(["pack", str(root), "-o", str(out), "--ray", "--ray-address", cluster.address, "--shard-size", "8KB", "--quiet",
                 "--on-error", "skip"]) == 0
    packed = fastload.PackedDataset(out)
    assert len(packed) == IMAGES - 1 and packed.manifest.packed["skipped"] == 1
    skipped = [json.loads(line) for line in (out / packed.manifest.packed["skipped_report"]).read_text().splitlines()]
    assert [s["path"] for s in skipped] == [bad.relative_to(root).as_posix()]
    assert_same_records(out, tmp_path / "local.fl", fields=("path",))
    assert main(["verify", str(out)]) == 0
