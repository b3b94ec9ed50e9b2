"""File fields (issue 17): a record's other files (a mask, a .npy) packed beside its image from a
file list's columns or from files sharing its basename, bit-exact, checked, typed, and refused
(or skipped and reported) with the record named when they break a rule."""

from __future__ import annotations

import csv
import io
import json
import zlib

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.converters import pack
from fastload.errors import SourceError
from fastload.verifier import verify
from tests.conftest import make_jpeg

N = 8


def mask_png(width: int, height: int, seed: int, mode: str = "L") -> bytes:
    values = (np.arange(width * height).reshape(height, width) // 7 + seed) % 5
    out = io.BytesIO()
    Image.fromarray(values.astype(np.uint8), mode="L").convert(mode).save(out, format="PNG")
    return out.getvalue()


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def garbled_pixels(png: bytes) -> bytes:
    """The PNG with its compressed pixels replaced by junk of the same length, every chunk's CRC
    still right: its structure checks out, its pixels do not decode."""
    start = png.index(b"IDAT") - 4
    length = int.from_bytes(png[start:start + 4], "big")
    junk = bytes((7 * k + 3) % 256 for k in range(length))
    crc = zlib.crc32(b"IDAT" + junk).to_bytes(4, "big")
    return png[:start + 8] + junk + crc + png[start + 12 + length:]


def write_rows(path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture(scope="module")
def listed(tmp_path_factory):
    """A CSV with boxes, multi-labels, captions, a flag, a mask column and a depth (.npy) column."""
    root = tmp_path_factory.mktemp("file-fields")
    (root / "img").mkdir()
    (root / "ann").mkdir()
    rows = []
    for i in range(N):
        width, height = 40 + 3 * i, 30 + 2 * i
        (root / "img" / f"{i}.jpg").write_bytes(make_jpeg(width, height, seed=i))
        (root / "ann" / f"{i}.png").write_bytes(mask_png(width, height, i, "P" if i % 2 else "L"))
        (root / "ann" / f"{i}.npy").write_bytes(npy(np.random.default_rng(i).random((height, width), dtype=np.float32)))
        rows.append({"path": f"img/{i}.jpg", "label": i % 3, "boxes": json.dumps([[1, 2, 10, 12]] * (i % 3 + 1)),
                     "tags": json.dumps([i, i + 4]), "caption": f"a picture, number {i}",
                     "flipped": "true" if i % 2 else "false", "mask": f"ann/{i}.png", "depth": f"ann/{i}.npy"})
    write_rows(root / "list.csv", rows)
    return root, rows


@pytest.mark.parametrize("fmt", ["lmdb", "hdf5"])
def test_a_list_with_file_columns_round_trips_bit_exact(listed, fmt, tmp_path):
    root, rows = listed
    out = tmp_path / "d.fl"
    pack(root / "list.csv", out, format=fmt, file_columns=("mask", "depth"), shard_size="20KB", progress=False,
         mask_storage="file")  # the mask file as given (by default its rows: tests/samples/test_mask_rows.py)
    ds = fastload.PackedDataset(out)
    assert len(ds.manifest.shards) > 1  # records and their files cross shard boundaries
    assert ds.manifest.fields == {"boxes": "int64[*,4]", "caption": "str", "flipped": "bool",
                                  "tags": "int64[2]", "mask": "mask", "depth": "npy"}
    for i, row in enumerate(rows):
        record = ds.record(i)
        assert record["data"] == (root / row["path"]).read_bytes()
        assert record["mask"] == (root / row["mask"]).read_bytes()
        assert record["depth"] == (root / row["depth"]).read_bytes()
        assert record["boxes"].tolist() == json.loads(row["boxes"]) and record["tags"].tolist() == json.loads(row["tags"])
        assert record["caption"] == row["caption"] and record["flipped"] is (row["flipped"] == "true")
    report = verify(out, decode=True)
    assert report.ok and report.checked == N and report.file_fields == ("mask", "depth")


def test_verify_names_a_damaged_file_field(listed, tmp_path):
    root, _ = listed
    out = tmp_path / "d.fl"
    pack(root / "list.csv", out, format="hdf5", file_columns=("mask",), progress=False)
    ds = fastload.PackedDataset(out)
    start = ds.manifest.shards[0].data_offset + int(ds.index.files["mask"].offset[3])
    with open(out / "shard-00000.h5", "r+b") as f:
        f.seek(start + 30)
        f.write(b"\0\1\2\3")
    report = verify(out)
    assert [(b.record, b.field, b.problem) for b in report.bad] == [(3, "mask", "checksum mismatch")]
    assert "record 3 (img/3.jpg) field 'mask': checksum mismatch" in str(report.bad[0])
    with pytest.raises(fastload.errors.CorruptRecordError, match=r"record 3 \(img/3.jpg\) field 'mask'"):
        fastload.PackedDataset(out, fields=("mask",))[3]


def test_the_cli_packs_lists_and_verifies_file_fields(listed, tmp_path, cli):
    root, _ = listed
    done = cli("pack", root / "list.csv", "-o", tmp_path / "d.fl", "--file-columns", "mask,depth")
    assert done.rc == 0, done.err
    info = cli("info", tmp_path / "d.fl")
    assert "file fields (a file per record, beside its own): mask (mask-rows), depth (npy)" in info.out
    assert "extra fields: boxes (int64[*,4]), caption (str), flipped (bool), tags (int64[2])" in info.out
    checked = cli("verify", tmp_path / "d.fl")
    assert "8 of 8 records checked with their file fields (mask, depth)" in checked.out


def bad_list(root, name: str, change) -> object:
    """The listed folder's CSV with one row changed by ``change(row, root)``."""
    rows = list(csv.DictReader((root / "list.csv").read_text().splitlines()))
    change(rows[5], root)
    write_rows(root / name, rows)
    return root / name


def test_a_mask_of_another_size_is_refused_or_skipped_naming_the_record(listed, tmp_path):
    root, _ = listed
    (root / "ann" / "small.png").write_bytes(mask_png(12, 9, 0))
    src = bad_list(root, "small.csv", lambda row, _: row.update(mask="ann/small.png"))
    with pytest.raises(SourceError, match=r"img/5.jpg: its mask file ann/small.png: 12x9, its image is 55x40"):
        pack(src, tmp_path / "a.fl", file_columns=("mask",), progress=False)
    report = pack(src, tmp_path / "b.fl", file_columns=("mask",), on_error="skip", progress=False)
    assert report.num_records == N - 1 and [s.rel for s in report.skipped_files] == ["img/5.jpg"]
    assert "its mask file ann/small.png: 12x9" in report.skipped_files[0].reason


def test_missing_unreadable_or_mistyped_files_are_refused(listed, tmp_path):
    root, _ = listed
    src = bad_list(root, "missing.csv", lambda row, _: row.update(mask="ann/nothing.png"))
    with pytest.raises(SourceError, match=r"img/5.jpg: its mask file ann/nothing.png: unreadable file"):
        pack(src, tmp_path / "a.fl", file_columns=("mask",), progress=False)
    (root / "ann" / "colour.png").write_bytes(mask_png(55, 40, 0, "RGB"))
    src = bad_list(root, "colour.csv", lambda row, _: row.update(mask="ann/colour.png"))
    with pytest.raises(SourceError, match=r"img/5.jpg: its mask file ann/colour.png: is a colour image, the "
                                          r"field's first file is a one-channel mask"):
        pack(src, tmp_path / "b.fl", file_columns=("mask",), progress=False)
    src = bad_list(root, "empty.csv", lambda row, _: row.update(mask=""))
    with pytest.raises(SourceError, match=r"img/5.jpg: its row has no 'mask' file; every row needs one"):
        pack(src, tmp_path / "f.fl", file_columns=("mask",), progress=False)
    report = pack(src, tmp_path / "g.fl", file_columns=("mask",), on_error="skip", progress=False)
    assert report.num_records == N - 1 and [s.rel for s in report.skipped_files] == ["img/5.jpg"]
    ds = fastload.PackedDataset(tmp_path / "g.fl")
    assert [ds.record(i)["caption"] for i in (4, 5)] == ["a picture, number 4", "a picture, number 6"]
    with pytest.raises(SourceError, match=r"--file-columns names 'masks', but the list has no such column"):
        pack(root / "list.csv", tmp_path / "c.fl", file_columns=("masks",), progress=False)
    with pytest.raises(SourceError, match=r"column 'tags' holds int64\[2\] values, not paths"):
        pack(root / "list.csv", tmp_path / "d.fl", file_columns=("tags",), progress=False)
    with pytest.raises(SourceError, match=r"--max-side would shrink the images but not their file fields \(mask\)"):
        pack(root / "list.csv", tmp_path / "e.fl", file_columns=("mask",), max_side=20, progress=False)


def test_a_damaged_first_file_does_not_decide_the_field_type(listed, tmp_path):
    root, _ = listed
    (root / "ann" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    rows = list(csv.DictReader((root / "list.csv").read_text().splitlines()))
    rows[0]["mask"] = "ann/broken.png"
    write_rows(root / "broken.csv", rows)
    report = pack(root / "broken.csv", tmp_path / "d.fl", file_columns=("mask",), on_error="skip", progress=False)
    assert report.num_records == N - 1 and [s.rel for s in report.skipped_files] == ["img/0.jpg"]
    assert fastload.PackedDataset(tmp_path / "d.fl").manifest.fields["mask"] == "mask-rows"


def test_check_decode_decodes_file_fields_too(listed, tmp_path):
    root, _ = listed
    (root / "ann" / "cut.png").write_bytes(garbled_pixels((root / "ann" / "3.png").read_bytes()))
    rows = list(csv.DictReader((root / "list.csv").read_text().splitlines()))
    rows[3]["mask"] = "ann/cut.png"
    write_rows(root / "cut.csv", rows)
    assert pack(root / "cut.csv", tmp_path / "h.fl", file_columns=("mask",), mask_storage="file",
                progress=False).num_records == N  # as given, a header check reads the header alone
    report = pack(root / "cut.csv", tmp_path / "d.fl", file_columns=("mask",), check="decode", on_error="skip",
                  progress=False)
    assert [s.rel for s in report.skipped_files] == ["img/3.jpg"]
    assert "its mask file ann/cut.png" in report.skipped_files[0].reason


def test_a_renamed_file_column_is_another_pack(listed, tmp_path):
    root, _ = listed
    pack(root / "list.csv", tmp_path / "d.fl", file_columns=("mask",), progress=False)
    text = (root / "list.csv").read_text().splitlines()
    (root / "renamed.csv").write_text("\n".join([text[0].replace(",mask,", ",seg,"), *text[1:]]) + "\n")
    again = pack(root / "renamed.csv", tmp_path / "d.fl", file_columns=("seg",), overwrite=True, progress=False)
    assert not again.already_packed
    assert "seg" in fastload.PackedDataset(tmp_path / "d.fl").manifest.fields


def test_a_changed_mask_redoes_its_shard_on_resume(listed, tmp_path):
    root, _ = listed
    work = tmp_path / "src"
    work.mkdir()
    for name in ("img", "ann"):
        (work / name).mkdir()
        for f in (root / name).glob("[0-9].*"):
            (work / name / f.name).write_bytes(f.read_bytes())
    (work / "list.csv").write_bytes((root / "list.csv").read_bytes())
    first = pack(work / "list.csv", tmp_path / "d.fl", file_columns=("mask",), shard_size="20KB", progress=False)
    (work / "ann" / "7.png").write_bytes(mask_png(61, 44, 3))
    again = pack(work / "list.csv", tmp_path / "d.fl", file_columns=("mask",), shard_size="20KB",
                 overwrite=True, progress=False)
    assert not again.already_packed and first.num_shards == again.num_shards
    assert fastload.PackedDataset(tmp_path / "d.fl").record(7)["mask"] == (work / "ann" / "7.png").read_bytes()


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """An ImageFolder tree where 0001.jpg has 0001.json, 0001.png (a mask) and 0001.npy beside it."""
    root = tmp_path_factory.mktemp("grouped") / "src"
    for i in range(N):
        folder = root / ("cat" if i % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        width, height = 36 + i, 28 + i
        (folder / f"{i:04d}.jpg").write_bytes(make_jpeg(width, height, seed=i))
        (folder / f"{i:04d}.png").write_bytes(mask_png(width, height, i))
        (folder / f"{i:04d}.npy").write_bytes(npy(np.arange(5, dtype=np.int16) + i))
        (folder / f"{i:04d}.json").write_text(json.dumps({"score": i / 4, "objects": [[i, 1, 2, 3]]}))
    return root


def test_a_basename_grouped_folder_round_trips(grouped, tmp_path):
    report = pack(grouped, tmp_path / "d.fl", sidecars=True, mask_storage="file", progress=False)
    assert report.num_records == N and report.ignored == {}  # every .npy and .json is a field, none left out
    ds = fastload.PackedDataset(tmp_path / "d.fl")
    assert ds.classes == ["cat", "dog"]
    assert ds.manifest.fields == {"objects": "int64[1,4]", "score": "float64", "npy": "npy", "png": "mask"}
    for i in range(N):
        record = ds.record(i)
        image = grouped / record["path"]
        assert record["data"] == image.read_bytes() and record["path"].endswith(".jpg")
        assert record["png"] == image.with_suffix(".png").read_bytes()
        assert record["npy"] == image.with_suffix(".npy").read_bytes()
    sample = fastload.PackedDataset(tmp_path / "d.fl", fields=("npy", "score"))[0]
    assert sample["npy"].dtype.is_floating_point is False and sample["npy"].shape == (5,)  # not spatial: as stored
    assert verify(tmp_path / "d.fl", decode=True).ok


def test_a_missing_grouped_file_is_refused_or_skipped(grouped, tmp_path):
    src = tmp_path / "src"
    for f in grouped.rglob("*"):
        if f.is_file():
            (src / f.relative_to(grouped)).parent.mkdir(parents=True, exist_ok=True)
            (src / f.relative_to(grouped)).write_bytes(f.read_bytes())
    (src / "dog" / "0002.png").unlink()
    with pytest.raises(SourceError, match=r"dog/0002.jpg: no 0002.png beside it, though other images have one"):
        pack(src, tmp_path / "a.fl", sidecars=True, progress=False)
    report = pack(src, tmp_path / "b.fl", sidecars=True, on_error="skip", progress=False)
    assert report.num_records == N - 1 and [s.rel for s in report.skipped_files] == ["dog/0002.jpg"]
    (src / "cat" / "0001.jpg").unlink()  # its mask left alone: an orphan, not an image
    with pytest.raises(SourceError, match=r"cat/0001.png: a .png with no image of its basename beside it"):
        pack(src, tmp_path / "o.fl", sidecars=True, progress=False)
    orphan = pack(src, tmp_path / "p.fl", sidecars=True, on_error="skip", progress=False)
    assert sorted(s.rel for s in orphan.skipped_files) == ["cat/0001.png", "dog/0002.jpg"]
    (src / "dog" / "0004.jpg").rename(src / "dog" / "0004.bmp")
    Image.open(io.BytesIO(make_jpeg(40, 32, seed=4))).save(src / "dog" / "0004.bmp")
    with pytest.raises(SourceError, match=r"0004\.\*: 2 images share this basename and none"):
        pack(src, tmp_path / "c.fl", sidecars=True, on_error="skip", progress=False)
