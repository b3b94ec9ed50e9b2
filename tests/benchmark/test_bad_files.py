"""bench and doctor on a real folder holding a 0-byte and a truncated JPEG among good ones."""

from __future__ import annotations

import json

import pytest

from fastload.benchmark import validate
from tests.benchmark.conftest import photo_files
from tests.benchmark.test_cli_bench import BENCH, QUICK, flat, table_rows
from tests.conftest import make_jpeg, write_tree

EMPTY, CUT = "c0/empty.jpg", "c1/cut.jpg"


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """A folder of 12 good JPEGs, one 0-byte and one truncated; and its pack (--on-error skip)."""
    from fastload.converters import pack

    folder = tmp_path_factory.mktemp("broken") / "images"
    write_tree(folder, {**photo_files(4), EMPTY: b"", CUT: make_jpeg(96, 72, seed=7)[:300]})
    pack(folder, folder.with_name("images.fl"), on_error="skip", workers=2, progress=False)
    return folder


def test_bench_skips_and_names_the_bad_files_and_gives_the_verdict(cli, broken, tmp_path):
    result = cli("bench", broken, *BENCH, "--no-dali", "--torch-workers", "1", "--json", tmp_path / "b.json")
    assert result.rc == 0, result.out + result.err
    assert ("note: skipped 2 files that cannot be decoded: c0/empty.jpg (empty file (0 bytes)), "
            "c1/cut.jpg (truncated JPEG") in flat(result.out)
    assert "Traceback" not in result.out + result.err
    assert all(" failed " not in f" {row} " for row in table_rows(result.out).values())
    assert "\nverdict: " in result.out and "(fastload lmdb) — " in flat(result.out)  # SRC.fl: the user's pack
    assert "do not read the same records" not in flat(result.out)  # 12 readable files, 12 packed records
    doc = json.loads((tmp_path / "b.json").read_text())
    assert validate(doc) == []
    assert [s["path"] for s in doc["skipped"]] == [EMPTY, CUT]
    assert doc["skipped"][0]["reason"] == "empty file (0 bytes)"
    assert all(r["status"] == "ok" for r in doc["runs"])


def test_bench_with_no_pack_leaves_the_bad_files_out_of_its_temporary_pack(cli, broken, tmp_path):
    src = tmp_path / "images"
    write_tree(src, {**photo_files(3), EMPTY: b""})
    result = cli("bench", src, *BENCH, "--no-dali", "--torch-workers", "1", "--work", tmp_path)
    assert result.rc == 0, result.out + result.err
    assert "note: skipped 1 file that cannot be decoded: c0/empty.jpg (empty file (0 bytes))" in flat(result.out)
    assert "packed the 9 readable of the 10 files" in flat(result.out)
    assert "\nverdict: " in result.out and "(torch ImageFolder, " in flat(result.out)  # nothing packed by the user


def test_doctor_skips_and_names_the_bad_files_and_gives_the_verdict(cli, broken):
    result = cli("doctor", broken, *QUICK, "--num-workers", "1")
    assert result.rc == 0, result.out + result.err
    assert "note: skipped 2 files that cannot be decoded: c0/empty.jpg" in flat(result.out)
    rows = table_rows(result.out)
    assert list(rows) == ["doctor: torch ImageFolder (folder, Pillow)"]
    assert " ok " not in rows and "failed" not in rows["doctor: torch ImageFolder (folder, Pillow)"]
    assert "\nverdict: " in result.out and "Traceback" not in result.out + result.err


def test_a_folder_of_only_bad_files_fails_clearly(cli, tmp_path):
    write_tree(tmp_path / "bad", {"a/x.jpg": b"", "a/y.jpg": b"\xff\xd8\xff"})
    result = cli("doctor", tmp_path / "bad", *QUICK)
    assert result.rc == 2 and result.err.startswith(f"fastload: error: {tmp_path / 'bad'}: none of its 2 image "
                                                    "files can be decoded (first: a/x.jpg: empty file")
