"""What ``fastload show``, ``info`` and ``verify`` print and write (issue 44, items 7 and 8): a hostile
dataset's strings (keys, class and field names, text values, the pack's recorded arguments) printed
escaped, never as terminal escapes or forged lines; ``show`` never overwrites a file without
--overwrite, never writes through a link, and never writes inside a dataset."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import fastload
from tests.conftest import (
    copy_dataset,
    flip_payload_byte,
    load_manifest_json,
    make_jpeg,
    save_manifest_json,
)

KEY = "k1\n  label: 7 (dog)\x1b[31m"  # a forged line, then red
CLASSES = ["cat\x1b[2J\x1b]0;pwned\x07", "dog\nfake line"]  # clears the screen, retitles the terminal
FIELD, TEXT = "note\x1b[8m", "hidden\x1b[0m\u202eright-to-left"
PACKED = {"source": "/data\x1b[2K\rforged", "layout": "imagefolder\x1b[1A", "created": "2026\x9b31m",
          "fastload_version": "9\u2028x", "reencode": None, "skipped": "0\x07"}
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\u2028", "\r")  # what no line of output may hold


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset written by fastload.Writer with hostile names, its manifest's pack arguments planted."""
    out = tmp_path_factory.mktemp("hostile") / "evil.fl"
    with fastload.Writer(out, classes=CLASSES) as writer:
        writer.write({"image": make_jpeg(16, 12), "label": 1, "__key__": KEY, FIELD: TEXT})
    raw = load_manifest_json(out)
    raw["packed"].update(PACKED)
    save_manifest_json(out, raw)
    return out


def _clean(text: str) -> list[str]:
    """The lines of ``text``, checked to hold nothing a terminal acts on."""
    lines = text.splitlines()
    assert not [line for line in lines if any(ch in line for ch in RAW)], text
    return lines


def test_info_prints_a_hostile_datasets_names_and_pack_arguments_escaped(cli, hostile):
    done = cli("info", hostile)
    assert done.rc == 0, done.err
    lines = _clean(done.out + done.err)
    assert "        0  cat\\x1b[2J\\x1b]0;pwned\\x07: 0" in lines and "        1  dog\\nfake line: 1" in lines
    assert "  extra fields: note\\x1b[8m (str)" in lines
    assert ("  packed 2026\\x9b31m by fastload 9\\u2028x from /data\\x1b[2K\\rforged (imagefolder\\x1b[1A layout), "
            "re-encode: none (bytes copied exactly), skipped: 0\\x07") in lines
    assert not any(line.startswith("fake line") for line in lines)


def test_show_prints_a_hostile_records_key_class_and_fields_escaped(cli, hostile, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    done = cli("show", hostile, "0")
    assert done.rc == 0, done.err
    lines = _clean(done.out + done.err)
    assert lines[1:3] == ["  path: k1\\n  label: 7 (dog)\\x1b[31m", "  label: 1 (dog\\nfake line)"]
    assert "  note\\x1b[8m (str): 'hidden\\x1b[0m\\u202eright-to-left'" in lines


def test_verify_names_a_hostile_bad_record_escaped(cli, hostile, tmp_path):
    damaged = copy_dataset(hostile, tmp_path / "damaged.fl")
    flip_payload_byte(damaged, 0)
    done = cli("verify", damaged)
    assert done.rc == 1
    bad = [line for line in _clean(done.out + done.err) if line.startswith("BAD ")]
    assert len(bad) == 1 and "k1\\n  label: 7 (dog)\\x1b[31m" in bad[0]


def test_an_error_that_quotes_a_hostile_name_is_printed_escaped(cli, tmp_path):
    done = cli("info", tmp_path / "no\x1b[2Jsuch.fl")
    assert done.rc == 2 and "no\\x1b[2Jsuch.fl" in done.err
    _clean(done.err)


# --- item 7: where show writes -----------------------------------------------------------------------

@pytest.fixture
def dataset(packed, tmp_path) -> Path:
    """A copy of conftest's packed ImageFolder dataset, this test's to lose."""
    return copy_dataset(packed("lmdb")[0], tmp_path / "ds.fl")


def _record(dataset: Path) -> bytes:
    return fastload.PackedDataset(dataset).record(0)["data"]


def test_show_never_overwrites_a_file_without_overwrite(cli, dataset, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert cli("show", dataset, "0").rc == 0
    (name,) = os.listdir(work)  # record-0.<ext>, written new
    assert (work / name).read_bytes() == _record(dataset)
    (work / name).write_bytes(b"the user's own file")
    done = cli("show", dataset, "0")
    assert done.rc == 2 and done.err == (f"fastload: error: {name}: exists; pass --overwrite to replace it, "
                                         "or -o another path\n")
    assert (work / name).read_bytes() == b"the user's own file"
    assert cli("show", dataset, "0", "--overwrite").rc == 0
    assert (work / name).read_bytes() == _record(dataset) and os.listdir(work) == [name]  # no temp file left


def test_show_never_writes_through_a_link_nor_replaces_one(cli, dataset, tmp_path):
    target, dangling = tmp_path / "secret.txt", tmp_path / "created-by-the-link.txt"
    target.write_bytes(b"secret")
    for name, points_to in (("a.jpg", target), ("b.jpg", dangling)):
        (tmp_path / name).symlink_to(points_to)
        for extra in ((), ("--overwrite",)):
            done = cli("show", dataset, "0", "-o", tmp_path / name, *extra)
            assert done.rc == 2 and f"{tmp_path / name}: is a symbolic link (to {points_to}); fastload never " \
                                     "writes through a link nor replaces one: remove it, or pass -o another path" \
                                     in done.err
            assert (tmp_path / name).is_symlink()
    assert target.read_bytes() == b"secret" and not dangling.exists()


def test_show_never_writes_inside_a_dataset(cli, dataset, packed, tmp_path, monkeypatch):
    manifest = (dataset / "manifest.json").read_bytes()
    other = copy_dataset(packed("hdf5")[0], tmp_path / "other.fl")
    (tmp_path / "link").symlink_to(dataset)
    for out, inside in ((dataset / "manifest.json", dataset), (dataset / "new.jpg", dataset),
                        (tmp_path / "link" / "new.jpg", dataset), (dataset / ".." / "ds.fl" / "manifest.json", dataset),
                        (other / "manifest.json", other)):
        for extra in ((), ("--overwrite",)):
            done = cli("show", dataset, "0", "-o", out, *extra)
            assert done.rc == 2 and done.err == (f"fastload: error: {out}: is inside the dataset {inside}; "
                                                 "fastload never writes into a dataset: pass -o a path outside it\n")
    monkeypatch.chdir(dataset)  # the default file name, in a dataset's folder
    done = cli("show", dataset, "0")
    assert done.rc == 2 and "record-0." in done.err and f"is inside the dataset {dataset}" in done.err
    assert (dataset / "manifest.json").read_bytes() == manifest
    assert sorted(os.listdir(dataset)) == sorted(os.listdir(packed("lmdb")[0]))
    assert cli("verify", dataset).rc == 0 and cli("verify", other).rc == 0
