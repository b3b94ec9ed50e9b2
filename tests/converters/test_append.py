"""Append (issue 27, item 3): a dataset appended to twice (a folder with the CLI, then the Writer)
reads back as one pack of all the samples would, record by record; readers opened at each version
keep reading it; old files are never rewritten; what does not fit is refused, naming it; a killed
append leaves the old version readable and the same command finishes it."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fastload.converters import pack

import fastload
from fastload.errors import PackError
from tests.conftest import REPO, make_jpeg, with_comment, write_tree

CLASSES = ["cat", "dog", "fox"]


def _source(root: Path, classes: list[str], count: int, seed: int, bad: str) -> list[tuple[Path, str, str, dict]]:
    """An ImageFolder tree whose images have a .json sidecar (fields caption, score) and one
    broken image (skipped); its samples, in record order, as (root, path, class, fields)."""
    samples = []
    for c in classes:
        for i in range(count):
            rel, fields = f"{c}/{seed + i:03d}.jpg", {"caption": f"{c} {seed + i}", "score": seed + i + 0.5}
            write_tree(root, {rel: make_jpeg(24 + i, 20, seed=seed + i)})
            (root / rel).with_suffix(".json").write_text(json.dumps(fields))
            samples.append((root, rel, c, fields))
    write_tree(root, {bad: b"not an image"})
    (root / bad).with_suffix(".json").write_text(json.dumps({"caption": "bad", "score": 0.5}))
    return samples


def _writer_samples() -> list[dict]:
    return [{"image": make_jpeg(30, 22, seed=100 + k), "label": ["fox", "cat"][k % 2], "__key__": f"w/{k}.jpg",
             "caption": f"written {k}", "score": k + 0.25} for k in range(3)]


def _records(ds) -> list[dict]:
    return [ds.record(i) for i in range(len(ds))]


@pytest.fixture(scope="module")
def appended(tmp_path_factory):
    """Version 1 packed from a folder, 2 appended by the CLI from another (a new class), 3 by the
    Writer; a reader opened at each version, and what the old version's files were."""
    from fastload.cli import main

    tmp = tmp_path_factory.mktemp("append")
    first = _source(tmp / "a", ["cat", "dog"], 2, 0, "dog/broken.jpg")
    second = _source(tmp / "b", ["dog", "fox"], 2, 10, "fox/broken.jpg")
    out = tmp / "ds.fl"
    pack(tmp / "a", out, shard_size="2KB", sidecars=True, on_error="skip", progress=False)
    v1 = fastload.PackedDataset(out)
    v1_files = {p.relative_to(out): (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes())
                for p in out.rglob("*") if p.is_file()}
    assert main(["pack", str(tmp / "b"), "-o", str(out), "--append", "--sidecars", "--on-error", "skip",
                 "--shard-size", "2KB", "--quiet"]) == 0
    v2 = fastload.PackedDataset(out)
    with fastload.Writer(out, append=True, shard_size="2KB") as writer:
        for sample in _writer_samples():
            writer.write(sample)
    return {"tmp": tmp, "out": out, "v1": v1, "v2": v2, "v1_files": v1_files, "samples": first + second,
            "report": writer.report}


def test_the_appended_dataset_equals_one_pack_of_every_sample(appended, tmp_path):
    ds = fastload.PackedDataset(appended["out"])
    assert ds.manifest.version == 3 and ds.classes == CLASSES and appended["report"].version == 3
    reference = tmp_path / "one.fl"  # the same samples written at once, in the same order
    with fastload.Writer(reference, classes=CLASSES) as writer:
        for root, rel, label, fields in appended["samples"]:
            writer.write({"image": (root / rel).read_bytes(), "label": label, "__key__": rel, **fields})
        for sample in _writer_samples():
            writer.write(sample)
    one = fastload.PackedDataset(reference)
    assert len(ds) == len(one) == 11
    assert _records(ds) == _records(one)  # data, label, path, size and fields, record by record
    assert [s.file for s in ds.manifest.shards] == [f"shard-{k:05d}.lmdb" for k in range(len(ds.manifest.shards))]
    assert fastload.verify(appended["out"]).bad == []


def test_readers_opened_before_an_append_keep_their_version(appended):
    v1, v2 = appended["v1"], appended["v2"]
    assert len(v1) == 4 and v1.classes == ["cat", "dog"] and v1.manifest.version == 1
    assert len(v2) == 8 and v2.classes == CLASSES and v2.manifest.version == 2
    latest = fastload.PackedDataset(appended["out"])
    for old in (v1, v2):
        assert _records(old) == _records(latest)[:len(old)]  # old records keep their numbers
        again = pickle.loads(pickle.dumps(old))  # a spawned worker opens the dataset again: the same version
        assert len(again) == len(old) and _records(again) == _records(old)
    # dog keeps label 1; the appended source's fox (its class 1) is 2 after the dataset's classes
    assert [r["label"] for r in _records(latest)] == [0, 0, 1, 1, 1, 1, 2, 2, 2, 0, 2]


def test_no_file_of_the_old_version_was_written_again(appended):
    out = appended["out"]
    for rel, (inode, mtime, data) in appended["v1_files"].items():
        if rel.name == "manifest.json":  # swapped for the newest, and kept under versions/
            assert (out / "versions" / "v00001.json").read_bytes() == data
            continue
        if rel.name == "skipped.jsonl":  # the appended source's skips added after the old lines
            assert (out / rel).read_bytes().startswith(data)
            continue
        st = (out / rel).stat()
        assert (st.st_ino, st.st_mtime_ns, (out / rel).read_bytes()) == (inode, mtime, data), rel
    assert sorted(p.name for p in (out / "index").iterdir() if p.is_dir()) == ["v00002", "v00003"]
    assert sorted(os.listdir(out / "versions")) == ["v00001.json", "v00002.json"]


def test_the_skips_of_every_version_are_reported(appended):
    out = appended["out"]
    lines = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert [(line["path"], line.get("version")) for line in lines] == [("dog/broken.jpg", None),
                                                                      ("fox/broken.jpg", 2)]
    packed = fastload.PackedDataset(out).manifest.packed
    assert packed["skipped"] == 2
    assert [(v["version"], v["records"]) for v in packed["versions"]] == [(1, 4), (2, 4), (3, 3)]


def test_an_append_that_does_not_fit_is_refused_and_changes_nothing(appended, tmp_path):
    out = appended["out"]
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    plain = tmp_path / "plain"
    write_tree(plain, {"cat/x.jpg": make_jpeg(20, 20, seed=7)})
    with pytest.raises(PackError, match="no field 'caption'"):
        pack(plain, out, append=True, progress=False)
    with pytest.raises(PackError, match="holds lmdb shards.*not hdf5"):
        pack(appended["tmp"] / "b", out, append=True, format="hdf5", sidecars=True, progress=False)
    with pytest.raises(PackError, match="field 'score' is int64, it is float64"):
        fastload.Writer(out, append=True, fields={"caption": "str", "score": "int64"})
    with pytest.raises(PackError, match="not supported yet"):
        pack(plain, "s3://bucket/ds.fl", append=True)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


@pytest.mark.parametrize("what", ["missing", "empty", "images"])
def test_an_append_to_a_folder_that_is_not_a_dataset_is_refused(tmp_path, what):
    out = tmp_path / "out"
    if what != "missing":
        out.mkdir()
    if what == "images":
        write_tree(out, {"cat/x.jpg": make_jpeg(20, 20, seed=1)})
    src = tmp_path / "src"
    write_tree(src, {"cat/y.jpg": make_jpeg(20, 20, seed=2)})
    with pytest.raises(PackError, match="is not a fastload dataset"):
        pack(src, out, append=True, progress=False)
    with pytest.raises(PackError, match="is not a fastload dataset"):
        fastload.Writer(out, append=True)
    assert os.path.exists(out) == (what != "missing") and not (out / ".pack.lock").exists()


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_an_append_to_a_dataset_with_a_shard_gone_is_refused_naming_it_before_writing(tmp_path, damage):
    """Issue 44, A9: the append succeeded, making a version whose manifest lists a shard that is not there."""
    out = tmp_path / "out.fl"
    write_tree(tmp_path / "a", {f"cat/{k}.jpg": make_jpeg(24, 20, seed=k) for k in range(6)})
    pack(tmp_path / "a", out, shard_size="2KB", progress=False)
    shard = fastload.PackedDataset(out).manifest.shards[1].file
    if damage == "deleted":
        (out / shard).unlink()
    else:
        os.truncate(out / shard, 100)
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    write_tree(tmp_path / "b", {"cat/new.jpg": make_jpeg(24, 20, seed=9)})
    said = r"cannot be opened \(No such file" if damage == "deleted" else r"holds 100 bytes, its manifest says \d+"
    with pytest.raises(PackError, match=rf"out.fl/{shard}: the dataset's shard 2 of \d+ {said}"):
        pack(tmp_path / "b", out, append=True, progress=False)
    with pytest.raises(PackError, match=rf"out.fl/{shard}: the dataset's shard 2 of"):
        fastload.Writer(out, append=True)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


_KILLED_APPEND = """
import sys
from fastload.converters import pack
pack(sys.argv[1], sys.argv[2], append=True, shard_size="1KB", progress=False)
"""


def test_a_killed_append_leaves_the_old_version_and_a_rerun_finishes_it(tmp_path):
    base = make_jpeg(8, 8, seed=1)
    write_tree(tmp_path / "old", {f"c/{i:03d}.jpg": with_comment(base, f"old {i}") for i in range(3)})
    write_tree(tmp_path / "new", {f"c/{i:03d}.jpg": with_comment(base, f"new {i}") for i in range(150)})
    out = tmp_path / "ds.fl"
    pack(tmp_path / "old", out, progress=False)
    old = _records(fastload.PackedDataset(out))
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_KILLED_APPEND), str(tmp_path / "new"), str(out)],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    deadline = time.monotonic() + 240  # a guard against a hang, not a speed
    while not (out / "shard-00004.lmdb").exists():
        assert proc.poll() is None, "the append ended before it was killed"
        assert time.monotonic() < deadline, "the append wrote no shard-00004"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    ds = fastload.PackedDataset(out)  # version 1, whole, beside the killed append's shards
    assert ds.manifest.version == 1 and _records(ds) == old and fastload.verify(out).bad == []
    report = pack(tmp_path / "new", out, append=True, shard_size="1KB", progress=False)
    assert report.version == 2 and report.num_records == 150 and report.resumed_shards >= 3
    ds = fastload.PackedDataset(out)
    assert len(ds) == 153 and _records(ds)[:3] == old and ds.record(152)["path"] == "c/149.jpg"
    assert fastload.verify(out).bad == [] and not (out / ".pack").exists()
    again = pack(tmp_path / "new", out, append=True, shard_size="1KB", progress=False)
    assert again.already_packed and len(fastload.PackedDataset(out)) == 153


def test_an_append_stores_masks_as_the_dataset_does(tmp_path):
    """A dataset packed with PNG masks (mask_storage="file") takes an append of more masks without
    being told: its mask field keeps one type; a Writer append likewise. Asked for the other form,
    the append is refused naming the field."""
    import io

    import numpy as np
    from PIL import Image

    from tests.converters.test_sidecars import seg_folder

    seg_folder(tmp_path / "a")
    seg_folder(tmp_path / "b", count=2)
    out = tmp_path / "seg.fl"
    pack(tmp_path / "a", out, sidecars=True, sidecar_names={"png": "mask"}, mask_storage="file", progress=False)
    # b's two samples are a's first two: appended again on purpose
    pack(tmp_path / "b", out, sidecars=True, sidecar_names={"png": "mask"}, append=True, allow_duplicates=True,
         progress=False)
    with fastload.Writer(out, append=True) as w:
        w.write({"image": make_jpeg(40, 30, seed=9), "txt": "written", "mask": np.full((30, 40), 7, np.uint8)})
    ds = fastload.PackedDataset(out)
    assert ds.manifest.fields["mask"] == "mask" and len(ds) == 6
    assert [Image.open(io.BytesIO(ds.record(i)["mask"])).getpixel((0, 0)) for i in (3, 5)] == [1, 7]
    with pytest.raises(PackError, match="mask"):
        pack(tmp_path / "b", out, sidecars=True, sidecar_names={"png": "mask"}, append=True, mask_storage="rows",
             progress=False)


# Issue 37, item 4: an append leaves out the records the dataset holds already (the same path and
# content), says what it will add before adding it, and appends them again only when told to.

def _folder(root: Path, count: int) -> Path:
    write_tree(root, {f"c/{i:03d}.jpg": make_jpeg(16, 12, seed=i) for i in range(count)})
    return root


def test_appending_the_same_source_again_adds_nothing_whatever_the_shard_size(tmp_path, cli):
    src, out = _folder(tmp_path / "src", 10), tmp_path / "ds.fl"
    pack(src, out, shard_size="1KB", progress=False)
    before = _records(fastload.PackedDataset(out))
    result = cli("pack", src, "-o", out, "--append", "--shard-size", "4KB", "--quiet")
    assert result.rc == 0, result.err
    assert result.out.startswith(f"nothing to append: {out} holds all 10 records of the source already")
    assert "--allow-duplicates" in result.out
    ds = fastload.PackedDataset(out)
    assert ds.manifest.version == 1 and _records(ds) == before


def test_appending_a_folder_with_one_new_file_adds_that_file_alone_and_says_so_first(tmp_path, cli):
    import logging

    src, out = _folder(tmp_path / "src", 10), tmp_path / "ds.fl"
    pack(src, out, progress=False)
    write_tree(src, {"c/new.jpg": make_jpeg(16, 12, seed=99)})
    said: list[tuple[str, int, int]] = []  # each line, and the dataset's version and shards then

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append((record.getMessage(), fastload.PackedDataset(out).manifest.version,
                         len(list(out.glob("shard-*")))))

    log = logging.getLogger("fastload.converters.destination.append")
    seen = Seen()
    log.addHandler(seen)
    try:
        result = cli("pack", src, "-o", out, "--append")
    finally:
        log.removeHandler(seen)
    assert result.rc == 0, result.err
    line = (f"{out}: appending 1 record of {src} as version 2; 10 more are held by the dataset already "
            "(same path and content), left out: --allow-duplicates appends them")
    assert said == [(line, 1, 1)]  # said while the dataset was version 1, before a shard was written
    assert result.err == line + "\n"
    assert "left out 10 records the dataset holds already" in result.out
    ds = fastload.PackedDataset(out)
    assert len(ds) == 11 and ds.record(10)["path"] == "c/new.jpg" and ds.manifest.version == 2


def test_allow_duplicates_appends_held_records_again_and_only_with_append(tmp_path, cli):
    src, out = _folder(tmp_path / "src", 3), tmp_path / "ds.fl"
    pack(src, out, progress=False)
    report = pack(src, out, append=True, allow_duplicates=True, progress=False)
    assert report.version == 2 and report.num_records == 3 and report.held == 0
    ds = fastload.PackedDataset(out)
    assert len(ds) == 6 and _records(ds)[3:] == _records(ds)[:3]
    with pytest.raises(ValueError, match="allow_duplicates=True is for append=True"):
        pack(src, tmp_path / "other.fl", allow_duplicates=True, progress=False)
    assert cli("pack", src, "-o", out, "--allow-duplicates", "--quiet").rc == 2


def test_a_file_of_a_held_path_with_other_content_is_appended(tmp_path):
    src, out = _folder(tmp_path / "src", 3), tmp_path / "ds.fl"
    pack(src, out, progress=False)
    write_tree(src, {"c/001.jpg": make_jpeg(16, 12, seed=50)})  # the same name, another image
    report = pack(src, out, append=True, progress=False)
    assert report.num_records == 1 and report.held == 2
    ds = fastload.PackedDataset(out)
    assert [r["path"] for r in _records(ds)] == ["c/000.jpg", "c/001.jpg", "c/002.jpg", "c/001.jpg"]
    assert ds.record(3)["data"] == make_jpeg(16, 12, seed=50)
