"""``fastload pack --sidecars`` (issue 17): files sharing an image's basename are one sample, as in
WebDataset: a JSON sidecar's keys and a .txt become its fields; a missing or bad sidecar is named,
or skipped and reported."""

from __future__ import annotations

import json

import pytest
from PIL import Image

import fastload
from fastload.converters import pack
from fastload.errors import SourceError
from tests.conftest import make_jpeg


def tree(root, count: int = 5) -> None:
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(count):
            (root / c / f"{i:04d}.jpg").write_bytes(make_jpeg(40, 30, seed=i))
            (root / c / f"{i:04d}.json").write_text(json.dumps(
                {"boxes": [[1, 2, 3 + i, 4]] * (i % 3), "score": i / 4, "source": f"{c}-{i}"}))
            (root / c / f"{i:04d}.txt").write_text(f"a {c}, number {i}")


def test_sidecars_become_fields(tmp_path, cli):
    tree(tmp_path / "src")
    done = cli("pack", tmp_path / "src", "-o", tmp_path / "d.fl", "--sidecars")
    assert done.rc == 0, done.err
    ds = fastload.PackedDataset(tmp_path / "d.fl")
    assert ds.manifest.fields == {"boxes": "int64[*,4]", "score": "float64", "source": "str", "txt": "str"}
    assert ds.classes == ["cat", "dog"] and len(ds) == 10
    record = ds.record(7)  # dog/0002
    assert record["path"] == "dog/0002.jpg" and record["source"] == "dog-2" and record["txt"] == "a dog, number 2"
    assert record["boxes"].tolist() == [[1, 2, 5, 4]] * 2 and record["score"] == 0.5
    assert ".json" not in ds.manifest.packed["ignored"] and ".txt" not in ds.manifest.packed["ignored"]
    info = cli("info", tmp_path / "d.fl")
    assert "boxes (int64[*,4])" in info.out


def test_a_missing_or_bad_sidecar_is_named_or_skipped(tmp_path):
    tree(tmp_path / "src")
    (tmp_path / "src" / "cat" / "0003.json").unlink()
    (tmp_path / "src" / "dog" / "0001.json").write_text("[1, 2]")
    with pytest.raises(SourceError, match=r"cat/0003.jpg: no 0003.json beside it"):
        pack(tmp_path / "src", tmp_path / "a.fl", sidecars=True, progress=False)
    report = pack(tmp_path / "src", tmp_path / "b.fl", sidecars=True, on_error="skip", progress=False)
    reasons = {s.rel: s.reason for s in report.skipped_files}
    assert set(reasons) == {"cat/0003.jpg", "dog/0001.jpg"} and report.num_records == 8
    assert "must hold a JSON object" in reasons["dog/0001.jpg"]
    (tmp_path / "src" / "cat" / "0003.json").write_text("{}")
    (tmp_path / "src" / "dog" / "0001.json").write_text('{"label": 3}')
    with pytest.raises(SourceError, match=r"0001.json: key 'label' is taken"):
        pack(tmp_path / "src", tmp_path / "c.fl", sidecars=True, on_error="raise", progress=False)


def seg_folder(root, count: int = 3) -> None:
    """``0001.jpg`` + ``0001.png`` (a one-channel mask) + ``0001.txt``: a segmentation folder."""
    root.mkdir(parents=True)
    for i in range(count):
        (root / f"{i:04d}.jpg").write_bytes(make_jpeg(40, 30, seed=i))
        Image.new("L", (40, 30), i + 1).save(root / f"{i:04d}.png")
        (root / f"{i:04d}.txt").write_text(f"picture {i}")


def test_sidecar_names_give_the_fields_the_names_a_user_asks_for(tmp_path, cli):
    # Issue 25 item 7: the README's segmentation loop asks for "mask"; --sidecars alone names it "png".
    seg_folder(tmp_path / "seg")
    done = cli("pack", tmp_path / "seg", "--sidecars", "--sidecar-names", "png=mask,txt=caption")
    assert done.rc == 0, done.err
    ds = fastload.PackedDataset(tmp_path / "seg.fl", image_size=16, train=True, fields=("image", "mask", "caption"))
    assert ds.manifest.fields == {"caption": "str", "mask": "mask-rows"}
    sample = ds[2]
    assert sample["mask"].shape == (16, 16) and set(sample["mask"].unique().tolist()) == {3}
    assert sample["caption"] == "picture 2"
    again = cli("pack", tmp_path / "seg", "--sidecars", "--sidecar-names", "png=label_map", "--overwrite")
    assert again.rc == 0, again.err  # another name is another pack, not "already packed"
    assert fastload.PackedDataset(tmp_path / "seg.fl").manifest.fields == {"label_map": "mask-rows", "txt": "str"}


@pytest.mark.parametrize("names, message", [
    ("tif=mask", r"renames tif, but no image has such a file beside it"),
    ("png=label", r"field name 'label' \(a name given by --sidecar-names\) is taken"),
    ("png=caption,txt=caption", r"gives two kinds of sidecar one name \(their fields would be caption, caption\)"),
])
def test_sidecar_names_that_name_nothing_or_clash_are_refused(tmp_path, names, message):
    seg_folder(tmp_path / "seg")
    with pytest.raises(SourceError, match=message):
        pack(tmp_path / "seg", tmp_path / "d.fl", sidecars=True, sidecar_names=dict(
            pair.split("=") for pair in names.split(",")), progress=False)


def test_sidecar_names_need_sidecars_and_pairs(tmp_path, cli):
    seg_folder(tmp_path / "seg")
    with pytest.raises(SourceError, match=r"--sidecar-names renames the fields of --sidecars; add --sidecars"):
        pack(tmp_path / "seg", tmp_path / "d.fl", sidecar_names={"png": "mask"}, progress=False)
    with pytest.raises(SystemExit):
        cli("pack", tmp_path / "seg", "--sidecars", "--sidecar-names", "mask")
