""""Already packed" means every value the dataset stores (issue 37, item 1): a file list whose images
are unchanged but whose field values, field types or class names changed is another pack, refused
without --overwrite and packed anew with it; only an unchanged list is "already packed"."""

from __future__ import annotations

import json

import pytest
from fastload.converters import pack

import fastload
from fastload.errors import PackError
from tests.conftest import make_jpeg, write_tree

N = 4


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("values")
    write_tree(root, {f"{i}.jpg": make_jpeg(30, 20, seed=i) for i in range(N)})
    return root


def rows() -> list[dict]:
    return [{"path": f"{i}.jpg", "label": ["cat", "dog"][i % 2], "caption": f"c{i}", "score": i,
             "boxes": [[0, 0, 5, 5 + i]]} for i in range(N)]


def write_list(root, name: str, listed: list[dict]):
    (root / name).write_text("".join(json.dumps(row) + "\n" for row in listed))
    return root / name


def _changed(change: str) -> list[dict]:
    listed = rows()
    if change == "value":
        listed[1]["caption"] = "another caption"
    elif change == "type":  # the same numbers, now float64 (1.0 is not 1 in JSON)
        for row in listed:
            row["score"] = float(row["score"])
    elif change == "class-name":  # the same label ids: only the name of class 1 changed
        for row in listed:
            row["label"] = row["label"].replace("dog", "wolf")
    else:
        listed[2]["boxes"] = [[0, 0, 5, 99]]
    return listed


@pytest.mark.parametrize("change", ["value", "type", "class-name", "array-value"])
def test_a_list_with_unchanged_images_and_changed_values_is_not_already_packed(images, tmp_path, change):
    out = tmp_path / "out.fl"
    listed = write_list(images, f"{tmp_path.name}.jsonl", rows())
    pack(listed, out, progress=False)
    assert pack(listed, out, progress=False).already_packed  # unchanged: nothing to do
    write_list(images, f"{tmp_path.name}.jsonl", _changed(change))
    with pytest.raises(PackError, match="already holds a finished dataset.*pass --overwrite"):
        pack(listed, out, progress=False)
    report = pack(listed, out, overwrite=True, progress=False)
    assert not report.already_packed and report.num_records == N
    ds = fastload.PackedDataset(out)
    want = _changed(change)
    assert ds.classes == sorted({row["label"] for row in want})
    assert ds.manifest.fields["score"] == ("float64" if change == "type" else "int64")
    for i, row in enumerate(want):
        got = ds.record(i)
        assert (ds.classes[got["label"]], got["caption"], got["score"], got["boxes"].tolist()) == (
            row["label"], row["caption"], row["score"], row["boxes"])
        assert type(got["score"]) is type(row["score"])
    assert pack(listed, out, progress=False).already_packed  # and now the new values are "this exact pack"


def test_the_cli_says_already_packed_only_for_the_same_values(images, tmp_path, cli):
    out = tmp_path / "out.fl"
    listed = write_list(images, f"{tmp_path.name}.jsonl", rows())
    assert cli("pack", listed, "-o", out, "--quiet").rc == 0
    write_list(images, f"{tmp_path.name}.jsonl", _changed("value"))
    result = cli("pack", listed, "-o", out, "--quiet")
    assert result.rc == 2 and "already packed" not in result.out and "--overwrite" in result.err
