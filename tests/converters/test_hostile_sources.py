"""Hostile source folders and lists: deep trees, symlink DAGs, non-UTF-8 names, FIFOs, devices, huge
files, out-of-range numbers. Each is listed without a hang or a crash, and every bad entry is named."""

from __future__ import annotations

import json
import os
from itertools import pairwise
from pathlib import Path

import pytest

from fastload.converters import pack
from fastload.converters.sources.folders import list_source
from fastload.converters.sources.items import Skip
from fastload import PackedDataset, SourceError
from tests.conftest import make_jpeg, write_tree

pytestmark = pytest.mark.timeout(20)  # a FIFO or a device that is opened would hang, not fail

GB = 2**30
SAME = "same folder as {} (reached through a symlink); listed once"
NOT_UTF8 = "file name is not valid UTF-8; rename it"


def _skips(listing) -> list[tuple[str, str]]:
    return [(s.rel, s.reason) for s in listing.skipped]


def _bytes_file(folder: Path, name: bytes, data: bytes) -> None:
    with open(os.path.join(os.fsencode(folder), name), "wb") as f:
        f.write(data)


def _sparse(path: Path, size: int) -> None:
    with open(path, "wb") as f:
        f.truncate(size)  # no blocks written: costs no disk


# --- deep trees and symlink DAGs -------------------------------------------------------------------

def test_a_tree_500_folders_deep_is_listed(tmp_path):
    deep = tmp_path / "src" / "/".join(["d"] * 500)
    deep.mkdir(parents=True)
    (deep / "x.jpg").write_bytes(b"x")
    (tmp_path / "src" / "y.jpg").write_bytes(b"y")
    listing = list_source(tmp_path / "src", layout="flat")
    assert [i.rel for i in listing.items] == ["/".join(["d"] * 500) + "/x.jpg", "y.jpg"]


def test_the_walk_is_sorted_and_depth_first(tmp_path):
    write_tree(tmp_path / "src", {p: b"x" for p in ["b.jpg", "a/z.jpg", "a/c.jpg", "a/b/1.jpg", "a/b/e/2.jpg"]})
    listing = list_source(tmp_path / "src", layout="flat")
    assert [i.rel for i in listing.items] == ["a/b/1.jpg", "a/b/e/2.jpg", "a/c.jpg", "a/z.jpg", "b.jpg"]


def _dag(tmp_path: Path, levels: int) -> Path:
    """src/{a,b} -> l1, l1/{a,b} -> l2, ... : 2**levels paths down to the one JPEG in the last level."""
    folders = [tmp_path / "src"] + [tmp_path / f"l{k}" for k in range(1, levels + 1)]
    for d in folders:
        d.mkdir()
    for upper, lower in pairwise(folders):
        (upper / "a").symlink_to(lower)
        (upper / "b").symlink_to(lower)
    (folders[-1] / "x.jpg").write_bytes(make_jpeg())
    return folders[0]


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_symlink_dag_lists_each_folder_once(tmp_path, on_error):
    src = _dag(tmp_path, 16)  # 65,536 paths to x.jpg
    listing = list_source(src, on_error=on_error)
    assert [i.rel for i in listing.items] == ["/".join(["a"] * 16) + "/x.jpg"]
    # one report per level: the `b` link beside each `a` reaches the folder `a` listed already
    assert _skips(listing) == [("/".join(["a"] * k + ["b"]), SAME.format("/".join(["a"] * (k + 1))))
                               for k in reversed(range(16))]


def test_loops_are_still_loops_and_links_to_a_class_folder_do_not_relabel(tmp_path):
    write_tree(tmp_path / "src", {"cat/1.jpg": b"1", "dog/2.jpg": b"2", "dog/sub/3.jpg": b"3", "emu/4.jpg": b"4"})
    (tmp_path / "src" / "cat" / "up").symlink_to("..")  # SRC: a loop, not a walk of dog/ under cat
    (tmp_path / "src" / "cat" / "self").symlink_to(".")
    (tmp_path / "src" / "cat" / "to_emu").symlink_to("../emu")  # a class folder keeps its own label
    (tmp_path / "src" / "cat" / "to_sub").symlink_to("../dog/sub")  # any other folder: first reach wins
    with pytest.raises(SourceError, match=r"cat/self: symlink loop \(a link to a folder that contains it\)"):
        list_source(tmp_path / "src")
    listing = list_source(tmp_path / "src", on_error="skip")
    loop = "symlink loop (a link to a folder that contains it)"
    assert listing.classes == ["cat", "dog", "emu"]
    assert [(i.rel, i.label) for i in listing.items] == [
        ("cat/1.jpg", 0), ("cat/to_sub/3.jpg", 0), ("dog/2.jpg", 1), ("emu/4.jpg", 2)]
    assert _skips(listing) == [("cat/self", loop), ("cat/to_emu", SAME.format("emu")),
                               ("cat/up", loop), ("dog/sub", SAME.format("cat/to_sub"))]


def test_two_class_folders_that_are_one_real_folder(tmp_path):
    write_tree(tmp_path / "real", {"1.jpg": b"1"})
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a").symlink_to(tmp_path / "real")
    (tmp_path / "src" / "b").symlink_to(tmp_path / "real")
    listing = list_source(tmp_path / "src")
    assert [(i.rel, i.label) for i in listing.items] == [("a/1.jpg", 0)]
    assert _skips(listing) == [("b", SAME.format("a"))]


# --- names that are not UTF-8 ----------------------------------------------------------------------

def test_a_file_name_that_is_not_utf8(tmp_path):
    write_tree(tmp_path / "src", {"a/ok.jpg": b"x"})
    _bytes_file(tmp_path / "src" / "a", b"caf\xe9.jpg", b"y")
    _bytes_file(tmp_path / "src" / "a", b"notes\xe9.t\xe9", b"z")  # not selected: only counted
    with pytest.raises(SourceError) as err:
        list_source(tmp_path / "src")
    assert str(err.value) == (f"{tmp_path / 'src'}/a/caf\\xe9.jpg: {NOT_UTF8}, or pass --on-error skip")
    listing = list_source(tmp_path / "src", on_error="skip")
    assert [i.rel for i in listing.items] == ["a/ok.jpg"]
    assert _skips(listing) == [("a/caf\\xe9.jpg", NOT_UTF8)]
    assert listing.ignored == {".t\\xe9": 1}


def test_folder_names_that_are_not_utf8(tmp_path):
    write_tree(tmp_path / "src", {"a/ok.jpg": b"x", "b/ok.jpg": b"y"})
    for parent, name in [(tmp_path / "src", b"cl\xe4ss"), (tmp_path / "src" / "b", b"s\xfcb")]:
        folder = os.path.join(os.fsencode(parent), name)
        os.mkdir(folder)
        _bytes_file(Path(os.fsdecode(folder)), b"in.jpg", b"z")
    with pytest.raises(SourceError, match=r"cl\\xe4ss: folder name is not valid UTF-8; rename it, or pass"):
        list_source(tmp_path / "src")
    listing = list_source(tmp_path / "src", on_error="skip")
    assert listing.classes == ["a", "b"]  # the bad class is left out, and the labels stay dense
    assert [(i.rel, i.label) for i in listing.items] == [("a/ok.jpg", 0), ("b/ok.jpg", 1)]
    reason = "folder name is not valid UTF-8; rename it"
    assert _skips(listing) == [("cl\\xe4ss", reason), ("b/s\\xfcb", reason)]


# --- FIFOs, devices, huge files --------------------------------------------------------------------

def _specials(src: Path) -> list[tuple[str, str]]:
    """A FIFO, a link to /dev/zero and a sparse 3 GB file, each named .jpg; their skip reasons."""
    os.mkfifo(src / "a" / "fifo.jpg")
    (src / "a" / "zero.jpg").symlink_to("/dev/zero")
    _sparse(src / "b" / "huge.jpg", 3 * GB)
    return [("a/fifo.jpg", "not a regular file (a FIFO)"), ("a/zero.jpg", "not a regular file (a character device)"),
            ("b/huge.jpg", f"{3 * GB} bytes is over --max-file-size {GB}; raise the limit or remove it")]


def test_fifos_devices_and_huge_files_are_bad_entries(tmp_path):
    src = tmp_path / "src"
    write_tree(src, {"a/ok.jpg": b"x", "b/ok.jpg": b"y"})
    _specials(src)
    with pytest.raises(SourceError) as err:
        list_source(src, max_file_size=GB)
    assert str(err.value) == f"{src}/a/fifo.jpg: not a regular file (a FIFO); remove it, or pass --on-error skip"
    (src / "a" / "fifo.jpg").unlink()
    with pytest.raises(SourceError, match=r"zero\.jpg: not a regular file \(a character device\); remove it"):
        list_source(src, max_file_size=GB)
    (src / "a" / "zero.jpg").unlink()
    with pytest.raises(SourceError, match=rf"huge\.jpg: {3 * GB} bytes is over --max-file-size {GB}; "
                                          "raise the limit or remove it, or pass --on-error skip"):
        list_source(src, max_file_size=GB)
    assert [i.size for i in list_source(src).items] == [1, 3 * GB, 1]  # no limit: listed, not read
    src2 = tmp_path / "src2"
    write_tree(src2, {"a/ok.jpg": b"x", "b/ok.jpg": b"y"})
    expected = _specials(src2)
    listing = list_source(src2, on_error="skip", max_file_size=GB)
    assert [i.rel for i in listing.items] == ["a/ok.jpg", "b/ok.jpg"] and _skips(listing) == expected


def test_a_file_list_refuses_fifos_devices_and_huge_files_and_keeps_fields_aligned(tmp_path):
    src = tmp_path / "src"
    write_tree(src, {"a/ok.jpg": b"x", "b/ok.jpg": b"y"})
    expected = _specials(src)
    rows = ["a/fifo.jpg", "a/ok.jpg", "a/zero.jpg", "b/huge.jpg", "b/ok.jpg", "a/gone.jpg"]
    (src / "l.jsonl").write_text("".join(json.dumps({"path": p, "n": i}) + "\n" for i, p in enumerate(rows)))
    with pytest.raises(SourceError, match=r"a/fifo\.jpg: not a regular file \(a FIFO\); remove it, or pass"):
        list_source(src / "l.jsonl", max_file_size=GB)
    # the link to /dev/zero points out of the list's folder: allowed out, it is refused as a device
    listing = list_source(src / "l.jsonl", on_error="skip", max_file_size=GB, allow_outside_root=True)
    assert _skips(listing) == expected
    assert [i.rel for i in listing.items] == ["a/ok.jpg", "b/ok.jpg", "a/gone.jpg"]  # gone: reported when read
    assert listing.field_values == {"n": [1, 4, 5]}


# --- numbers out of range, and an image file given as SRC -------------------------------------------

def test_labels_and_int_fields_out_of_int64_range_name_the_line(tmp_path):
    (tmp_path / "l.csv").write_text(f"path,label\na.jpg,1\nb.jpg,{10**20}\n")
    with pytest.raises(SourceError, match=rf"l\.csv:3: label {10**20} is out of range \(0\.\.2\*\*63-1\)"):
        list_source(tmp_path / "l.csv")
    (tmp_path / "l.jsonl").write_text(json.dumps({"path": "a.jpg", "big": -(2**63) - 1}) + "\n")
    with pytest.raises(SourceError, match=r"l\.jsonl:1: field 'big' is -9223372036854775809, out of range"):
        list_source(tmp_path / "l.jsonl")
    (tmp_path / "ok.jsonl").write_text(json.dumps({"path": "a.jpg", "label": 2**63 - 1, "f": 1e308}) + "\n")
    assert list_source(tmp_path / "ok.jsonl").items[0].label == 2**63 - 1


def test_an_image_file_as_src_says_to_pass_its_folder(tmp_path):
    write_tree(tmp_path / "images", {"cat/x.jpg": b"x"})
    with pytest.raises(SourceError, match=r"x\.jpg: is an image file; SRC is a folder of images .*, a "
                                          r"\.csv/\.jsonl file list, .*: pass the folder it is in"):
        list_source(tmp_path / "images" / "cat" / "x.jpg")


# --- end to end ------------------------------------------------------------------------------------

def test_a_hostile_folder_packs_under_skip_and_reports_every_entry(tmp_path):
    src = tmp_path / "src"
    good = {"a/ok.jpg": make_jpeg(seed=1), "b/ok.jpg": make_jpeg(seed=2), "b/deep/l1/x.jpg": make_jpeg(seed=3)}
    write_tree(src, good)
    expected = _specials(src)
    _bytes_file(src / "a", b"caf\xe9.jpg", make_jpeg(seed=4))
    (src / "a" / "again").symlink_to("../b/deep")
    report = pack(src, tmp_path / "out", on_error="skip", max_file_size=GB, progress=False)
    expected += [("a/caf\\xe9.jpg", NOT_UTF8), ("b/deep", SAME.format("a/again"))]
    assert sorted((s.rel, s.reason) for s in report.skipped_files) == sorted(expected)
    assert report.skipped == len(expected)
    lines = [json.loads(x) for x in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    assert sorted((x["path"], x["reason"]) for x in lines) == sorted(expected)
    ds = PackedDataset(tmp_path / "out")
    got = {ds.record(i)["path"]: ds.record(i)["data"] for i in range(len(ds))}
    assert got == {"a/again/l1/x.jpg": good["b/deep/l1/x.jpg"], "a/ok.jpg": good["a/ok.jpg"],
                   "b/ok.jpg": good["b/ok.jpg"]}
    assert isinstance(report.skipped_files[0], Skip)


def test_a_symlink_dag_packs_its_one_jpeg_once(tmp_path):
    src = _dag(tmp_path, 16)
    report = pack(src, tmp_path / "out", progress=False)  # on_error="fail": the links are no error
    assert report.num_records == 1 and report.skipped == 16
