"""Bad source files: each one stops the pack under --on-error fail and is counted and listed under skip."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from fastload.converters import pack
from fastload import PackedDataset, PackError, SourceError
from fastload.format import read_manifest
from fastload.verifier import verify
from tests.conftest import make_jpeg, make_png, run_unprivileged, write_tree

GOOD = {"a/good1.jpg": make_jpeg(seed=1), "a/good2.png": make_png(seed=2), "b/good3.jpg": make_jpeg(seed=3)}


def _truncated_jpeg(path: Path) -> None:
    data = make_jpeg(96, 72, seed=4)
    path.write_bytes(data[: len(data) * 3 // 4])  # header intact, scan data cut, no end-of-image marker


def _truncated_png(path: Path) -> None:
    data = make_png(96, 72, seed=5)
    path.write_bytes(data[: len(data) * 3 // 4])


def _symlink_loop(path: Path) -> None:
    path.symlink_to("..")  # a/loop -> the source root, which contains a/


def _self_link(path: Path) -> None:
    path.symlink_to(path.name)


# rel path of the bad entry, how to make it, the reason every message and report gives
BAD: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "zero-byte file": ("a/empty.jpg", lambda p: p.write_bytes(b""), "empty file (0 bytes)"),
    "truncated JPEG": ("a/cut.jpg", _truncated_jpeg, "truncated JPEG (ends inside the image data, no end-of-image marker)"),
    "truncated PNG": ("b/cut.png", _truncated_png, "truncated PNG (the 'IDAT' chunk runs past the end of the file, no IEND chunk)"),
    "JPEG cut inside its header": ("a/stub.jpg", lambda p: p.write_bytes(make_jpeg()[:300]),
                                   "truncated JPEG (the segment at byte 210 runs past the end of the file)"),
    "non-image named .jpg": ("a/notes.jpg", lambda p: p.write_text("just some text\n" * 20),
                             "not a readable image (cannot identify image file)"),
    "dangling symlink": ("b/gone.jpg", lambda p: p.symlink_to("does-not-exist.jpg"),
                         "unreadable file (No such file or directory)"),
    "symlink to itself": ("b/self.jpg", _self_link, "unreadable file (Too many levels of symbolic links)"),
    "symlink loop": ("a/loop", _symlink_loop, "symlink loop (a link to a folder that contains it)"),
}


def _make(src: Path, case: str) -> tuple[str, str]:
    write_tree(src, GOOD)
    rel, make, reason = BAD[case]
    make(src / rel)
    return rel, reason


def _assert_not_a_dataset(out: Path) -> None:
    assert not (out / "manifest.json").exists()
    with pytest.raises(FileNotFoundError, match="not a finished dataset|no such packed dataset"):
        PackedDataset(out)


def _assert_skipped_exactly(out: Path, skipped: list[tuple[str, str]]) -> None:
    lines = (out / "skipped.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"path": p, "reason": r} for p, r in skipped]
    manifest = read_manifest(out)
    assert manifest.packed["skipped"] == len(skipped) and manifest.packed["skipped_report"] == "skipped.jsonl"
    ds = PackedDataset(out)
    packed = {ds.record(i)["path"]: ds.record(i)["data"] for i in range(len(ds))}
    assert packed == GOOD  # every good file, and nothing of the bad ones


@pytest.mark.parametrize("case", list(BAD))
def test_fail_stops_at_the_bad_file_and_names_it(tmp_path, cli, case):
    src, out = tmp_path / "src", tmp_path / "out"
    rel, reason = _make(src, case)
    result = cli("pack", src, "-o", out)
    assert result.rc == 2
    assert result.err.strip() == (f"fastload: error: {src / rel}: {reason}; "
                                  "fix or remove it, or pass --on-error skip")
    assert result.out == ""
    _assert_not_a_dataset(out)


@pytest.mark.parametrize("case", list(BAD))
def test_skip_counts_and_lists_the_bad_file(tmp_path, cli, case):
    src, out = tmp_path / "src", tmp_path / "out"
    rel, reason = _make(src, case)
    result = cli("pack", src, "-o", out, "--on-error", "skip")
    assert result.rc == 0, result.err
    assert "; skipped 1;" in result.out and f"skipped files listed in {out / 'skipped.jsonl'}" in result.out
    _assert_skipped_exactly(out, [(rel, reason)])
    assert "skipped: 1" in cli("info", out).out


def test_skip_counts_every_bad_file_together(tmp_path):
    src = tmp_path / "src"
    expected = [_make(src, case) for case in BAD]
    report = pack(src, tmp_path / "out", on_error="skip", progress=False, shard_size="2KB")
    assert report.skipped == len(BAD) == len(report.skipped_files)
    assert {(s.rel, s.reason) for s in report.skipped_files} == set(expected)
    lines = [json.loads(x) for x in (tmp_path / "out" / "skipped.jsonl").read_text().splitlines()]
    assert sorted((x["path"], x["reason"]) for x in lines) == sorted(expected)
    assert report.num_records == len(GOOD) and f"skipped {len(BAD)}" in report.summary()


def test_fail_names_only_the_first_bad_file_in_record_order(tmp_path):
    write_tree(tmp_path / "src", {**GOOD, "a/x1.jpg": b"", "b/x2.jpg": b"garbage"})
    with pytest.raises(SourceError) as err:
        pack(tmp_path / "src", tmp_path / "out", progress=False)
    assert "a/x1.jpg: empty file (0 bytes)" in str(err.value) and "x2" not in str(err.value)
    assert isinstance(err.value, ValueError)
    _assert_not_a_dataset(tmp_path / "out")


@pytest.mark.parametrize("storage", ["lmdb", "hdf5"])
def test_a_shard_whose_files_are_all_skipped_is_empty_but_valid(tmp_path, storage):
    write_tree(tmp_path / "src", {**{f"a/{i}.jpg": b"" for i in range(4)}, "b/ok.jpg": make_jpeg()})
    report = pack(tmp_path / "src", tmp_path / "out", format=storage, shard_size=1, on_error="skip",
                  progress=False)
    manifest = read_manifest(tmp_path / "out")
    assert report.skipped == 4 and [s.num_records for s in manifest.shards] == [0, 1]
    ds = PackedDataset(tmp_path / "out")
    assert len(ds) == 1 and ds.record(0)["data"] == make_jpeg() and ds[0][1] == 1
    assert verify(tmp_path / "out", decode=True).ok


def test_when_every_file_is_bad_there_is_no_dataset(tmp_path):
    write_tree(tmp_path / "src", {"a.jpg": b"", "b.jpg": b"nope"})
    with pytest.raises(PackError, match=r"no file could be packed \(2 skipped: first a\.jpg: empty file"):
        pack(tmp_path / "src", tmp_path / "out", on_error="skip", progress=False)
    _assert_not_a_dataset(tmp_path / "out")


def test_symlink_loop_back_to_the_root_does_not_relabel_other_classes(tmp_path):
    # Regression: a/loop -> .. used to walk b/ under a's label and then report b/ itself as a loop.
    _make(tmp_path / "src", "symlink loop")
    report = pack(tmp_path / "src", tmp_path / "out", on_error="skip", progress=False)
    ds = PackedDataset(tmp_path / "out")
    got = [(ds.record(i)["path"], ds.record(i)["label"]) for i in range(len(ds))]
    assert got == [("a/good1.jpg", 0), ("a/good2.png", 0), ("b/good3.jpg", 1)]
    assert [(s.rel, s.reason) for s in report.skipped_files] == [("a/loop", BAD["symlink loop"][2])]


def test_symlink_loops_in_a_flat_folder(tmp_path):
    write_tree(tmp_path / "src", {"x.jpg": make_jpeg(), "sub/y.jpg": make_jpeg(seed=2)})
    (tmp_path / "src" / "sub" / "up").symlink_to("..")  # the source root itself
    (tmp_path / "src" / "sub" / "here").symlink_to(".")
    report = pack(tmp_path / "src", tmp_path / "out", layout="flat", on_error="skip", progress=False)
    assert sorted((s.rel, s.reason) for s in report.skipped_files) == [
        ("sub/here", BAD["symlink loop"][2]), ("sub/up", BAD["symlink loop"][2])]
    ds = PackedDataset(tmp_path / "out")
    assert [ds.record(i)["path"] for i in range(len(ds))] == ["sub/y.jpg", "x.jpg"]


def test_full_decode_check_catches_damage_the_header_check_lets_through(tmp_path, cli):
    data = bytearray(make_png(64, 48, seed=9))
    at = data.find(b"IDAT") + 20
    data[at] ^= 0xFF  # inside the compressed pixels: header and IEND intact
    write_tree(tmp_path / "src", {**GOOD, "a/broken.png": bytes(data)})
    result = cli("pack", tmp_path / "src", "-o", tmp_path / "strict", "--check", "decode")
    assert result.rc == 2
    assert f"{tmp_path / 'src' / 'a/broken.png'}: image does not decode (" in result.err
    _assert_not_a_dataset(tmp_path / "strict")
    assert cli("pack", tmp_path / "src", "-o", tmp_path / "fast").rc == 0  # header check only
    assert read_manifest(tmp_path / "fast").num_records == 4


def test_images_over_max_pixels_are_refused_as_bombs(tmp_path, cli):
    write_tree(tmp_path / "src", {"a/big.jpg": make_jpeg(64, 48), "a/small.jpg": make_jpeg(20, 10)})
    result = cli("pack", tmp_path / "src", "-o", tmp_path / "out", "--max-pixels", "1000")
    assert result.rc == 2
    assert "a/big.jpg: image too large: 64x48 = 3072 pixels exceeds the limit of 1000" in result.err
    assert "--max-pixels" in result.err
    report = pack(tmp_path / "src", tmp_path / "out", max_pixels=1000, on_error="skip", progress=False)
    assert report.num_records == 1 and report.skipped_files[0].rel == "a/big.jpg"


@pytest.mark.parametrize("mode", ["fail", "skip"])
def test_missing_file_in_a_list(tmp_path, cli, mode):
    write_tree(tmp_path, GOOD)
    (tmp_path / "l.csv").write_text("path,label\na/good1.jpg,0\na/missing.jpg,1\nb/good3.jpg,1\n")
    result = cli("pack", tmp_path / "l.csv", "--on-error", mode)
    out = tmp_path / "l.fl"
    if mode == "fail":
        assert result.rc == 2
        assert f"{tmp_path / 'a/missing.jpg'}: unreadable file (No such file or directory)" in result.err
        _assert_not_a_dataset(out)
    else:
        assert result.rc == 0
        assert json.loads((out / "skipped.jsonl").read_text()) == {
            "path": "a/missing.jpg", "reason": "unreadable file (No such file or directory)"}
        assert read_manifest(out).num_records == 2


def test_other_extensions_and_hidden_files_are_ignored_not_skipped(tmp_path):
    write_tree(tmp_path / "src", {**GOOD, "a/readme.md": b"x", "a/.DS_Store": b"x", "b/Thumbs.db": b"",
                                  "b/noext": b"x", "LICENSE.txt": b"x", ".cache/c.jpg": make_jpeg()})
    report = pack(tmp_path / "src", tmp_path / "out", progress=False)
    assert report.skipped == 0 and report.num_records == 3
    assert report.ignored == {".md": 1, "(hidden)": 2, ".db": 1, "(no extension)": 1, ".txt": 1}
    assert "ignored 6 files not selected by extension" in report.summary()


# --- files and folders the packing user cannot read (run as uid 65534: root reads everything) -----

def _unprivileged_tree(world_tmp: Path) -> Path:
    src = world_tmp / "src"
    write_tree(src, GOOD)
    for dirpath, dirnames, filenames in os.walk(src):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    return src


UNREADABLE = {
    "unreadable file": ("a/secret.jpg", "unreadable file (Permission denied)"),
    "unreadable folder": ("a/private", "cannot list folder (Permission denied)"),
}


def _make_unreadable(src: Path, case: str) -> tuple[str, str]:
    rel, reason = UNREADABLE[case]
    if case == "unreadable file":
        (src / rel).write_bytes(make_jpeg(seed=7))
    else:
        (src / rel).mkdir()
        (src / rel / "inside.jpg").write_bytes(make_jpeg(seed=8))
    os.chmod(src / rel, 0)
    return rel, reason


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_unreadable_entry_fails_the_pack(world_tmp, case):
    src, out = _unprivileged_tree(world_tmp), world_tmp / "out"
    rel, reason = _make_unreadable(src, case)
    result = run_unprivileged(["pack", src, "-o", out, "--quiet"])
    assert result.rc == 2, result.err
    assert f"fastload: error: {src / rel}: {reason}; fix or remove it, or pass --on-error skip" in result.err
    assert not (out / "manifest.json").exists()


@pytest.mark.parametrize("case", list(UNREADABLE))
def test_unreadable_entry_is_skipped_and_listed(world_tmp, case):
    src, out = _unprivileged_tree(world_tmp), world_tmp / "out"
    rel, reason = _make_unreadable(src, case)
    result = run_unprivileged(["pack", src, "-o", out, "--quiet", "--on-error", "skip"])
    assert result.rc == 0, result.err
    assert "skipped 1;" in result.out
    _assert_skipped_exactly(out, [(rel, reason)])
