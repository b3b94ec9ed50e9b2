"""Packing good sources: bit-exact round trip, labels, record order, file lists, shards, re-encode."""

from __future__ import annotations

import io
import json
import os
import random

import numpy as np
import pytest
from PIL import Image

from fastload.converters import default_out, pack
from fastload import PackedDataset, SourceError
from fastload.verifier import verify
from fastload.format import read_manifest, shard_name
from tests.conftest import imagefolder_files, make_jpeg, make_png, write_tree

STORAGES = ["lmdb", "hdf5"]


def records(out) -> list[dict]:
    ds = PackedDataset(out)
    return [ds.record(i) for i in range(len(ds))]


# --- bit-exact round trip -------------------------------------------------------------------------

@pytest.mark.parametrize("storage", STORAGES)
def test_round_trip_is_bit_exact(tmp_path, storage):
    files = imagefolder_files({"a": 7, "b": 6}, size=(80, 60))
    files["a/odd.bin"] = bytes(range(256)) * 3 + b"\x00" * 5  # non-image bytes: copied too
    files["b/empty-ish.bin"] = b"\xff"
    write_tree(tmp_path / "src", files)
    out = tmp_path / "out"
    report = pack(tmp_path / "src", out, format=storage, shard_size="3KB", workers=3, progress=False,
                  extensions=["jpg", ".PNG", "bin"])
    assert report.num_records == len(files) and report.skipped == 0 and report.num_shards > 3
    got = {r["path"]: r["data"] for r in records(out)}
    assert got == files
    assert read_manifest(out).total_bytes == sum(len(b) for b in files.values())
    assert verify(out).ok


@pytest.mark.parametrize("storage", STORAGES)
def test_shards_roll_over_by_size_and_are_named_in_order(tmp_path, storage):
    files = write_tree(tmp_path / "src", {f"{i:03d}.jpg": make_jpeg(64, 48, seed=i) for i in range(30)})
    size = sum(len(b) for b in files.values()) // 6
    pack(tmp_path / "src", tmp_path / "out", format=storage, shard_size=size, progress=False)
    manifest = read_manifest(tmp_path / "out")
    names = [s.file for s in manifest.shards]
    assert names == [shard_name(storage, i) for i in range(len(names))]
    assert 5 <= len(names) <= 8
    assert sum(s.num_records for s in manifest.shards) == manifest.num_records == 30
    assert all(s.data_bytes <= size for s in manifest.shards)  # every file here is smaller than a shard
    assert sorted(p.name for p in (tmp_path / "out").glob("shard-*")) == names
    assert not list((tmp_path / "out").rglob("*.tmp")) and not (tmp_path / "out" / ".pack").exists()


def test_a_file_larger_than_the_shard_size_gets_a_shard_of_its_own(tmp_path):
    big = make_png(300, 200, seed=1)
    write_tree(tmp_path / "src", {"a.jpg": make_jpeg(seed=0), "b.png": big, "c.jpg": make_jpeg(seed=2)})
    pack(tmp_path / "src", tmp_path / "out", shard_size=len(big) // 2, progress=False)
    manifest = read_manifest(tmp_path / "out")
    assert [s.num_records for s in manifest.shards] == [1, 1, 1]
    assert records(tmp_path / "out")[1]["data"] == big


# --- labels and layouts -----------------------------------------------------------------------------

def test_imagefolder_labels_follow_sorted_class_folders(tmp_path):
    files = write_tree(tmp_path / "src", {
        "zebra/1.jpg": make_jpeg(seed=1), "Ant/1.jpg": make_jpeg(seed=2), "bee/2.png": make_png(seed=3),
        "bee/deeper/nested/3.jpg": make_jpeg(seed=4),  # nested folders keep their class folder's label
        "bee/.hidden.jpg": make_jpeg(seed=5), ".git/x.jpg": make_jpeg(seed=6),  # hidden: ignored
        "zebra/notes.txt": b"not packed",
    })
    report = pack(tmp_path / "src", tmp_path / "out", progress=False)
    ds = PackedDataset(tmp_path / "out")
    assert ds.classes == ["Ant", "bee", "zebra"]  # sorted by name, as torchvision's ImageFolder
    assert ds.class_to_idx == {"Ant": 0, "bee": 1, "zebra": 2}
    got = {r["path"]: r["label"] for r in records(tmp_path / "out")}
    assert got == {"Ant/1.jpg": 0, "bee/2.png": 1, "bee/deeper/nested/3.jpg": 1, "zebra/1.jpg": 2}
    assert all(files[p] == r["data"] for r in records(tmp_path / "out") for p in [r["path"]])
    assert report.ignored == {"(hidden)": 2, ".txt": 1}  # .git/ counts as one hidden entry
    manifest = read_manifest(tmp_path / "out")
    assert manifest.packed["layout"] == "imagefolder" and manifest.packed["ignored"] == report.ignored
    assert "ignored 3 files" in report.summary()


def test_flat_folder_has_no_labels(tmp_path):
    write_tree(tmp_path / "src", {"b.jpg": make_jpeg(seed=1), "a.png": make_png(seed=2)})
    pack(tmp_path / "src", tmp_path / "out", progress=False)
    ds = PackedDataset(tmp_path / "out")
    assert ds.classes == [] and ds.manifest.classes is None and ds.manifest.packed["layout"] == "flat"
    assert ds.targets.tolist() == [-1, -1]
    assert [ds.record(i)["path"] for i in range(2)] == ["a.png", "b.jpg"]


def test_classes_and_top_level_files_together_need_a_layout(tmp_path):
    write_tree(tmp_path / "src", {"cat/1.jpg": make_jpeg(seed=1), "stray.jpg": make_jpeg(seed=2)})
    with pytest.raises(SourceError, match=r"both class folders \(cat/.*stray\.jpg.*--layout"):
        pack(tmp_path / "src", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
    report = pack(tmp_path / "src", tmp_path / "out", layout="imagefolder", progress=False)
    assert report.num_records == 1 and report.ignored == {"(file outside a class folder)": 1}
    report = pack(tmp_path / "src", tmp_path / "flat", layout="flat", progress=False)
    assert [r["path"] for r in records(tmp_path / "flat")] == ["cat/1.jpg", "stray.jpg"]


def test_symlinked_class_folder_is_followed(tmp_path):
    write_tree(tmp_path / "elsewhere", {"1.jpg": make_jpeg(seed=1)})
    write_tree(tmp_path / "src", {"a/1.jpg": make_jpeg(seed=2)})
    (tmp_path / "src" / "b").symlink_to(tmp_path / "elsewhere")
    pack(tmp_path / "src", tmp_path / "out", progress=False)
    got = [(r["path"], r["label"], r["data"]) for r in records(tmp_path / "out")]
    assert got == [("a/1.jpg", 0, make_jpeg(seed=2)), ("b/1.jpg", 1, make_jpeg(seed=1))]


def test_a_second_link_to_a_class_folder_is_not_a_loop(tmp_path):
    # cat/alias -> ../dog is no loop, but dog/ is one real folder: listed once, under its own name
    # and label; the link is reported (not an error, even under on_error="fail").
    write_tree(tmp_path / "src", {"cat/1.jpg": make_jpeg(seed=1), "dog/2.jpg": make_jpeg(seed=2)})
    (tmp_path / "src" / "cat" / "alias").symlink_to("../dog")
    report = pack(tmp_path / "src", tmp_path / "out", progress=False)
    got = [(r["path"], r["label"]) for r in records(tmp_path / "out")]
    assert got == [("cat/1.jpg", 0), ("dog/2.jpg", 1)]
    assert [(s.rel, s.reason) for s in report.skipped_files] == [
        ("cat/alias", "same folder as dog (reached through a symlink); listed once")]


# --- record order -----------------------------------------------------------------------------------

def test_order_is_sorted_by_name_whatever_the_creation_order(tmp_path):
    names = ["b.jpg", "A.jpg", "10.jpg", "2.jpg", "a.jpg", "_x.jpg", "é.jpg", "a b.jpg"]
    for attempt, seed in enumerate([1, 2]):
        shuffled = names[:]
        random.Random(seed).shuffle(shuffled)
        src = tmp_path / f"src{attempt}"
        src.mkdir()
        for name in shuffled:  # created in a different order each time
            (src / name).write_bytes(make_jpeg(seed=names.index(name)))
        pack(src, tmp_path / f"out{attempt}", progress=False, workers=1 + 6 * attempt)
    got = [[r["path"] for r in records(tmp_path / f"out{k}")] for k in range(2)]
    assert got[0] == got[1] == sorted(names)  # code-point order: digits, upper case, "_", lower case
    assert got[0][:4] == ["10.jpg", "2.jpg", "A.jpg", "_x.jpg"]


def test_nested_folders_are_walked_depth_first_each_folder_by_name(tmp_path):
    write_tree(tmp_path / "src", {n: make_jpeg(seed=k) for k, n in enumerate(
        ["a/b0.jpg", "a/b.jpg", "a/b/c.jpg", "a/a/z.jpg", "a/b/a/y.jpg"])})
    pack(tmp_path / "src", tmp_path / "out", layout="flat", progress=False)
    assert [r["path"] for r in records(tmp_path / "out")] == [
        "a/a/z.jpg", "a/b/a/y.jpg", "a/b/c.jpg", "a/b.jpg", "a/b0.jpg"]


@pytest.mark.parametrize("storage", STORAGES)
def test_packing_twice_gives_the_same_dataset(tmp_path, storage):
    write_tree(tmp_path / "src", imagefolder_files({"x": 9, "y": 8}))
    for k, workers in enumerate([1, 8]):
        pack(tmp_path / "src", tmp_path / f"out{k}", format=storage, shard_size="5KB", workers=workers,
             progress=False)
    manifests = [json.loads((tmp_path / f"out{k}" / "manifest.json").read_text()) for k in range(2)]
    for m in manifests:
        m["packed"].pop("created")
    a, b = manifests
    # shard file sizes may differ between runs only through the storage engine, never the records
    assert [(s["file"], s["num_records"], s["records_digest"]) for s in a["shards"]] == \
           [(s["file"], s["num_records"], s["records_digest"]) for s in b["shards"]]
    assert a["index"] == b["index"]  # every index column, byte for byte (digests)
    assert {k: v for k, v in a.items() if k != "shards"} == {k: v for k, v in b.items() if k != "shards"}


# --- file lists -------------------------------------------------------------------------------------

def _list_sources(tmp_path):
    files = write_tree(tmp_path / "data", {
        "img/b.jpg": make_jpeg(seed=1), "img/a.jpg": make_jpeg(seed=2), "img/c.png": make_png(seed=3),
        "other/d.jpg": make_jpeg(seed=4),
    })
    rows = [  # file order on purpose not sorted
        {"path": "img/b.jpg", "label": "zebra", "weight": 0.5, "count": 3, "note": "first"},
        {"path": "img/a.jpg", "label": "ant", "weight": 1.25, "count": -2, "note": "héllo, world"},
        {"path": "other/d.jpg", "label": "zebra", "weight": 2.0, "count": 0, "note": ""},
        {"path": "img/c.png", "label": "bee", "weight": -1.0, "count": 7, "note": "42x"},
    ]
    return files, rows


def _write_csv(path, rows):
    import csv

    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_file_list_keeps_row_order_labels_and_extra_fields(tmp_path, kind):
    files, rows = _list_sources(tmp_path)
    listfile = tmp_path / "data" / f"train.{kind}"
    if kind == "csv":
        _write_csv(listfile, rows)
    else:
        listfile.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")  # a blank line is fine
    report = pack(listfile, None, progress=False)
    out = tmp_path / "data" / "train.fl"
    assert report.out == out == default_out(listfile)
    ds = PackedDataset(out)
    assert ds.classes == ["ant", "bee", "zebra"]  # string labels numbered by sorted name
    assert ds.manifest.fields == {"count": "int64", "note": "str", "weight": "float64"}
    assert ds.manifest.packed["layout"] == "list"
    got = [ds.record(i) for i in range(len(ds))]
    assert [r["path"] for r in got] == [r["path"] for r in rows]  # the list's order, not sorted
    assert [r["label"] for r in got] == [2, 0, 2, 1]
    assert [r["data"] for r in got] == [files[r["path"]] for r in rows]
    assert [r["weight"] for r in got] == [0.5, 1.25, 2.0, -1.0]
    assert [r["count"] for r in got] == [3, -2, 0, 7] and all(type(r["count"]) is int for r in got)
    assert [r["note"] for r in got] == ["first", "héllo, world", "", "42x"]
    assert isinstance(ds.index.fields["weight"], np.ndarray) and ds.index.fields["weight"].dtype == np.float64


def test_file_list_with_integer_labels_and_no_labels(tmp_path):
    files, rows = _list_sources(tmp_path)
    int_rows = [{"path": r["path"], "label": str(i * 3)} for i, r in enumerate(rows)]
    _write_csv(tmp_path / "data" / "ints.csv", int_rows)
    pack(tmp_path / "data" / "ints.csv", tmp_path / "ints.fl", progress=False)
    ds = PackedDataset(tmp_path / "ints.fl")
    assert ds.targets.tolist() == [0, 3, 6, 9] and ds.manifest.classes is None
    (tmp_path / "data" / "paths.jsonl").write_text("".join(json.dumps({"path": r["path"]}) + "\n" for r in rows))
    pack(tmp_path / "data" / "paths.jsonl", tmp_path / "paths.fl", progress=False)
    ds = PackedDataset(tmp_path / "paths.fl")
    assert ds.targets.tolist() == [-1] * 4 and ds.manifest.fields == {}


def test_file_list_paths_are_relative_to_the_list_or_absolute(tmp_path):
    files, _ = _list_sources(tmp_path)
    lists = tmp_path / "data" / "lists"
    lists.mkdir()
    absolute = str(tmp_path / "data" / "img" / "a.jpg")
    _write_csv(lists / "l.csv", [{"path": "../img/b.jpg", "label": "1"}, {"path": absolute, "label": "0"}])
    pack(lists / "l.csv", tmp_path / "l.fl", progress=False, root=tmp_path / "data")  # both lie inside it
    got = records(tmp_path / "l.fl")
    assert [r["data"] for r in got] == [files["img/b.jpg"], files["img/a.jpg"]]
    assert [r["path"] for r in got] == ["../img/b.jpg", absolute]


@pytest.mark.parametrize("name, body, message", [
    ("bad.csv", "file,label\na.jpg,1\n", "needs a header row with a 'path' column"),
    ("bad.csv", "path,label\n", "has no rows"),
    ("bad.csv", "path,label\nimg/a.jpg,-1\n", "label -1 is negative"),
    ("bad.csv", "path,label\nimg/a.jpg,cat\nimg/b.jpg,\n", r":3: missing label"),
    ("bad.jsonl", '{"path": "img/a.jpg"}\nnot json\n', r"bad.jsonl:2: not valid JSON"),
    ("bad.jsonl", '["img/a.jpg"]\n', r"bad.jsonl:1: each line must be a JSON object"),
    ("bad.jsonl", '{"path": "img/a.jpg", "extra": {"a": 1}}\n', r"field 'extra' holds dict"),  # lists: arrays
    ("bad.jsonl", '{"label": 1}\n', r"bad.jsonl:1: missing 'path'"),
])
def test_bad_file_lists_are_refused_with_the_line(tmp_path, name, body, message):
    _list_sources(tmp_path)
    (tmp_path / "data" / name).write_text(body)
    with pytest.raises(SourceError, match=message):
        pack(tmp_path / "data" / name, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_source_file_of_no_known_kind_is_refused_naming_every_kind(tmp_path):
    (tmp_path / "list.txt").write_text("path\n")
    every_kind = r"list.txt: not a kind of file fastload packs; SRC is .*\.csv/\.jsonl file list.*WebDataset tars.*tables"
    with pytest.raises(SourceError, match=every_kind):
        pack(tmp_path / "list.txt", tmp_path / "out", progress=False)
    write_tree(tmp_path / "src", {"a.jpg": make_jpeg()})
    with pytest.raises(SourceError, match="--layout list needs a .csv or .jsonl file"):
        pack(tmp_path / "src", tmp_path / "out", layout="list", progress=False)


# --- re-encode --------------------------------------------------------------------------------------

def test_reencode_shrinks_records_and_is_recorded_in_the_manifest(tmp_path):
    files = write_tree(tmp_path / "src", {"a/wide.jpg": make_jpeg(160, 90, seed=1),
                                          "a/tall.png": make_png(50, 120, seed=2),
                                          "a/small.jpg": make_jpeg(20, 16, seed=3)})
    pack(tmp_path / "src", tmp_path / "out", max_side=64, quality=70, progress=False)
    manifest = read_manifest(tmp_path / "out")
    assert manifest.packed["reencode"] == {"max_side": 64, "quality": 70}
    sizes = {}
    for r in records(tmp_path / "out"):
        img = Image.open(io.BytesIO(r["data"]))
        assert img.format == "JPEG" and img.mode == "RGB"
        assert (r["width"], r["height"]) == img.size
        sizes[r["path"]] = img.size
    assert sizes == {"a/wide.jpg": (64, 36), "a/tall.png": (27, 64), "a/small.jpg": (20, 16)}
    assert records(tmp_path / "out")[0]["data"] != files["a/small.jpg"]
    assert verify(tmp_path / "out", decode=True).ok


def test_quality_alone_reencodes_at_full_size(tmp_path):
    write_tree(tmp_path / "src", {"a.png": make_png(70, 50, seed=1)})
    pack(tmp_path / "src", tmp_path / "out", quality=50, progress=False)
    assert read_manifest(tmp_path / "out").packed["reencode"] == {"max_side": None, "quality": 50}
    r = records(tmp_path / "out")[0]
    assert Image.open(io.BytesIO(r["data"])).format == "JPEG" and (r["width"], r["height"]) == (70, 50)


def test_raw_bytes_by_default_are_recorded_as_no_reencode(tmp_path, imagefolder):
    src, _ = imagefolder
    pack(src, tmp_path / "out", progress=False)
    manifest = read_manifest(tmp_path / "out")
    assert manifest.packed["reencode"] is None and manifest.kind == "images"
    assert manifest.packed["source"] == str(src) and manifest.packed["check"] == "header"


@pytest.mark.parametrize("kwargs, message", [
    ({"format": "zip"}, "format='zip'"), ({"on_error": "ignore"}, "on_error='ignore'"),
    ({"workers": 0}, "workers=0"), ({"max_side": 0}, "max_side=0"), ({"quality": 101}, "quality=101"),
    ({"shard_size": "lots"}, "cannot read 'lots' as a size"), ({"check": "full"}, "check='full'"),
])
def test_bad_options_are_refused_before_anything_is_written(tmp_path, imagefolder, kwargs, message):
    src, _ = imagefolder
    with pytest.raises(ValueError, match=message):
        pack(src, tmp_path / "out", progress=False, **kwargs)
    assert not (tmp_path / "out").exists()


# --- the report -------------------------------------------------------------------------------------

def test_report_and_summary(tmp_path, imagefolder):
    src, files = imagefolder
    report = pack(src, tmp_path / "out", format="hdf5", progress=False)
    assert (report.out, report.storage, report.num_records) == (tmp_path / "out", "hdf5", len(files))
    assert report.total_bytes == sum(len(b) for b in files.values())
    assert report.skipped == 0 and report.skipped_report is None and report.resumed_shards == 0
    text = report.summary()
    assert text.startswith(f"packed {len(files)} records") and "1 hdf5 shard at" in text
    assert "skipped 0" in text and "skipped.jsonl" not in text
    assert not (tmp_path / "out" / "skipped.jsonl").exists()
    assert sorted(os.listdir(tmp_path / "out")) == ["index", "manifest.json", "shard-00000.h5"]  # no lock file left
