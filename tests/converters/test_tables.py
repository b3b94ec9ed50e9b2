"""Parquet / Arrow tables and Hugging Face datasets as a pack source (issue 27): one record per row,
the image read from its column a row group at a time, and the same records as the same samples
packed from files; a bad row or column named, or skipped and reported."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from fastload.converters import pack
from fastload.converters.sources.table_columns import numbers
from fastload.converters.sources.table_files import ParquetTable
from fastload.converters.sources.table_pages import Unsupported

import fastload
from fastload.errors import SourceError
from tests.conftest import make_jpeg

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

COUNT = 12
CLASSES = ["bird", "cat", "dog"]


def _samples() -> list[dict]:
    return [{"jpg": make_jpeg(40 + i, 30 + i % 4, seed=i), "label": CLASSES[i % 3], "caption": f"photo {i}",
             "score": i / 4, "n": i * 7, "tags": list(range(i % 3))} for i in range(COUNT)]


def _table(samples: list[dict]):
    return pa.table({"jpg": [s["jpg"] for s in samples], "label": [s["label"] for s in samples],
                     "caption": [s["caption"] for s in samples], "score": [s["score"] for s in samples],
                     "n": pa.array([s["n"] for s in samples], pa.int32()),
                     "tags": pa.array([s["tags"] for s in samples], pa.list_(pa.int16()))})


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("tables")
    samples = _samples()
    table = _table(samples)
    pq.write_table(table, root / "t.parquet", row_group_size=5)  # row groups of 5, 5 and 2
    (root / "parts").mkdir()
    pq.write_table(table.slice(0, 7), root / "parts" / "a.parquet", row_group_size=3)
    pq.write_table(table.slice(7), root / "parts" / "b.parquet")
    pq.write_table(table, root / "plain.parquet", row_group_size=5, compression="none")  # read in place
    files = root / "files"
    files.mkdir()
    with open(files / "list.csv", "w", newline="") as f:  # the same samples as files and a list
        rows = csv.writer(f)
        rows.writerow(["path", "label", "caption", "score", "n", "tags"])
        for i, s in enumerate(samples):
            (files / f"{i:06d}.jpg").write_bytes(s["jpg"])
            rows.writerow([f"{i:06d}.jpg", s["label"], s["caption"], s["score"], s["n"], json.dumps(s["tags"])])
    out = root / "files.fl"
    pack(files / "list.csv", out, progress=False)
    return root, samples, fastload.PackedDataset(out)


def _same_records(packed, from_files, samples, paths) -> None:
    assert packed.manifest.fields == from_files.manifest.fields == {
        "caption": "str", "score": "float64", "n": "int64", "tags": "int64[*]"}
    assert packed.classes == from_files.classes == CLASSES and packed.manifest.kind == "images"
    for i, s in enumerate(samples):
        a, b = packed.record(i), from_files.record(i)
        assert a["data"] == b["data"] == s["jpg"]
        assert (a["label"], a["caption"], a["score"], a["n"]) == (b["label"], b["caption"], b["score"], b["n"])
        assert np.array_equal(a["tags"], b["tags"]) and list(a["tags"]) == s["tags"]
        assert (a["width"], a["height"]) == (b["width"], b["height"])
        assert a["path"] == paths[i]


def test_parquet_row_groups_pack_to_the_records_their_samples_pack_to_from_files(made, tmp_path):
    root, samples, from_files = made
    report = pack(root / "t.parquet", tmp_path / "t.fl", progress=False, image_column="jpg", label_column="label")
    assert report.num_records == COUNT and report.skipped == 0
    packed = fastload.PackedDataset(tmp_path / "t.fl")
    _same_records(packed, from_files, samples, [f"t.parquet/{i:06d}" for i in range(COUNT)])
    assert packed.manifest.packed["layout"] == "table" and fastload.verify(tmp_path / "t.fl", decode=True).ok
    again = pack(root / "t.parquet", tmp_path / "t.fl", progress=False)  # the plan is the same: nothing to redo
    assert again.already_packed
    pack(root / "plain.parquet", tmp_path / "plain.fl", progress=False)  # uncompressed: each image read in place
    _same_records(fastload.PackedDataset(tmp_path / "plain.fl"), from_files, samples,
                  [f"plain.parquet/{i:06d}" for i in range(COUNT)])
    pack(root / "parts", tmp_path / "parts.fl", progress=False, shard_size=20_000)  # a folder: files sorted
    parts = fastload.PackedDataset(tmp_path / "parts.fl")
    assert len(parts.manifest.shards) > 1
    _same_records(parts, from_files, samples, [f"a.parquet/{i:06d}" for i in range(7)] +
                  [f"b.parquet/{i:06d}" for i in range(COUNT - 7)])


def test_feather_files_and_fixed_size_lists(made, tmp_path):
    _, samples, from_files = made
    feather = pytest.importorskip("pyarrow.feather")
    box = pa.array([[i, i + 1.5, 10, 20] for i in range(COUNT)], pa.list_(pa.float32(), 4))
    feather.write_feather(_table(samples).append_column("box", box), tmp_path / "t.feather", chunksize=4)
    pack(tmp_path / "t.feather", tmp_path / "f.fl", progress=False, columns=["caption", "score", "n", "tags"])
    _same_records(fastload.PackedDataset(tmp_path / "f.fl"), from_files, samples,
                  [f"t.feather/{i:06d}" for i in range(COUNT)])
    pack(tmp_path / "t.feather", tmp_path / "box.fl", progress=False, columns=["box"])
    boxed = fastload.PackedDataset(tmp_path / "box.fl")
    assert boxed.manifest.fields == {"box": "float64[4]"}
    assert list(boxed.record(5)["box"]) == [5, 6.5, 10, 20]


@pytest.fixture(scope="module")
def hf(made):
    datasets = pytest.importorskip("datasets")
    samples = made[1]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES),
                                  "caption": datasets.Value("string"), "score": datasets.Value("float64"),
                                  "n": datasets.Value("int32"), "tags": datasets.List(datasets.Value("int64"))})
    return datasets, datasets.Dataset.from_dict(
        {"image": [{"bytes": s["jpg"], "path": None} for s in samples],
         "label": [CLASSES.index(s["label"]) for s in samples], "caption": [s["caption"] for s in samples],
         "score": [s["score"] for s in samples], "n": [s["n"] for s in samples],
         "tags": [s["tags"] for s in samples]}, features=features)


def test_a_hf_dataset_and_its_save_to_disk_folder_pack_to_the_same_records(made, hf, tmp_path):
    _, samples, from_files = made
    datasets, ds = hf
    pack(ds, tmp_path / "mem.fl", progress=False)
    _same_records(fastload.PackedDataset(tmp_path / "mem.fl"), from_files, samples,
                  [f"dataset/{i:06d}" for i in range(COUNT)])
    ds.save_to_disk(str(tmp_path / "saved"))
    pack(tmp_path / "saved", tmp_path / "disk.fl", progress=False)
    _same_records(fastload.PackedDataset(tmp_path / "disk.fl"), from_files, samples,
                  [f"data-00000-of-00001.arrow/{i:06d}" for i in range(COUNT)])
    shuffled = ds.shuffle(seed=3)  # an indices mapping over the same table: packed in its order
    pack(shuffled, tmp_path / "shuffled.fl", progress=False)
    order = [samples.index(next(s for s in samples if s["caption"] == c)) for c in shuffled["caption"]]
    packed = fastload.PackedDataset(tmp_path / "shuffled.fl")
    assert [packed.record(i)["data"] for i in range(COUNT)] == [samples[k]["jpg"] for k in order]
    with pytest.raises(ValueError, match="needs out="):
        pack(ds)
    with pytest.raises(ValueError, match="sidecars= is for sources on disk"):
        pack(ds, tmp_path / "x.fl", sidecars=True)
    assert pack(ds, tmp_path / "mem.fl", progress=False).already_packed  # its fingerprint, rows and sizes: the same plan
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(SourceError, match=r"dict: a Hugging Face DatasetDict \(splits: train\); pack one split"):
        pack(tmp_path / "dict", tmp_path / "dict.fl", progress=False)


def test_a_null_or_undecodable_image_is_named_or_skipped_and_reported(made, tmp_path):
    samples = made[1][:6]
    images = [s["jpg"] for s in samples]
    images[2], images[4] = None, b"not an image at all"
    table = _table(samples).set_column(0, "jpg", pa.array(images, pa.binary()))
    pq.write_table(table, tmp_path / "bad.parquet", row_group_size=4)
    with pytest.raises(SourceError, match=r"bad.parquet/000002: .*no image: column 'jpg' is null in this row"):
        pack(tmp_path / "bad.parquet", tmp_path / "a.fl", progress=False)
    report = pack(tmp_path / "bad.parquet", tmp_path / "b.fl", on_error="skip", progress=False)
    assert report.num_records == 4 and [s.rel for s in report.skipped_files] == ["bad.parquet/000002",
                                                                                 "bad.parquet/000004"]
    assert "not a readable image" in report.skipped_files[1].reason
    ds = fastload.PackedDataset(tmp_path / "b.fl")
    assert [ds.record(i)["path"] for i in range(4)] == [f"bad.parquet/{i:06d}" for i in (0, 1, 3, 5)]
    pq.write_table(table.slice(3), tmp_path / "undecodable.parquet")
    with pytest.raises(SourceError, match=r"undecodable.parquet/000001: not a readable image"):
        pack(tmp_path / "undecodable.parquet", tmp_path / "c.fl", progress=False)
    pq.write_table(table, tmp_path / "plain.parquet", row_group_size=4, compression="none")  # read in place
    with pytest.raises(SourceError, match=r"plain.parquet/000002: .*no image: column 'jpg' is null in this row"):
        pack(tmp_path / "plain.parquet", tmp_path / "d.fl", progress=False)
    big = max(range(6), key=lambda i: len(images[i] or b""))  # the row over the limit is named, not read
    report = pack(tmp_path / "plain.parquet", tmp_path / "e.fl", on_error="skip", progress=False,
                  max_file_size=len(images[big]) - 1)
    reasons = {s.rel: s.reason for s in report.skipped_files}
    assert report.num_records == 3 and (f"holds {len(images[big])} bytes, over --max-file-size "
                                        f"{len(images[big]) - 1}") in reasons[f"plain.parquet/{big:06d}"]
    assert "not a readable image" in reasons["plain.parquet/000004"] and "null" in reasons["plain.parquet/000002"]


def test_an_hf_image_with_a_path_and_no_bytes_names_its_path(made, tmp_path):
    images = [{"bytes": s["jpg"], "path": None} for s in made[1][:3]]
    images[1] = {"bytes": None, "path": "/photos/b.jpg"}
    for compression in ("none", "snappy"):  # read in place, and through pyarrow
        pq.write_table(pa.table({"image": images}), tmp_path / f"{compression}.parquet", compression=compression)
        with pytest.raises(SourceError, match=rf"{compression}.parquet/000001: .*its path '/photos/b.jpg' is not read"):
            pack(tmp_path / f"{compression}.parquet", tmp_path / f"{compression}.fl", progress=False)


def test_a_wrong_or_missing_column_is_named(made, tmp_path):
    table = _table(made[1][:3])
    path = tmp_path / "t.parquet"
    pq.write_table(table.append_column("when", pa.array([1, 2, 3], pa.timestamp("s"))), path)
    with pytest.raises(SourceError, match=r"t.parquet: column 'when' holds timestamp\[m?s\].*--columns"):
        pack(path, tmp_path / "a.fl", progress=False)
    assert pack(path, tmp_path / "b.fl", progress=False, columns=["caption"]).num_records == 3
    with pytest.raises(SourceError, match=r"no image column 'photo' \(columns: jpg, label"):
        pack(path, tmp_path / "c.fl", progress=False, image_column="photo", columns=[])
    with pytest.raises(SourceError, match=r"image column 'caption' holds string, not image bytes"):
        pack(path, tmp_path / "d.fl", progress=False, image_column="caption", columns=[])
    with pytest.raises(SourceError, match=r"label column 'score' holds double"):
        pack(path, tmp_path / "e.fl", progress=False, label_column="score", columns=[])
    pq.write_table(table.drop_columns(["jpg"]), tmp_path / "none.parquet")
    with pytest.raises(SourceError, match=r"none.parquet: no column holds image bytes.*--image-column"):
        pack(tmp_path / "none.parquet", tmp_path / "f.fl", progress=False)
    pq.write_table(table.append_column("png", table.column("jpg")), tmp_path / "two.parquet")
    with pytest.raises(SourceError, match=r"two.parquet: 2 columns hold bytes \(jpg, png\)"):
        pack(tmp_path / "two.parquet", tmp_path / "g.fl", progress=False)


def test_the_cli_packs_a_table_with_its_columns_named(made, tmp_path, cli):
    root = made[0]
    done = cli("pack", root / "t.parquet", "-o", tmp_path / "t.fl", "--image-column", "jpg",
               "--label-column", "label", "--columns", "caption,n")
    assert done.rc == 0, done.err
    ds = fastload.PackedDataset(tmp_path / "t.fl")
    assert ds.manifest.fields == {"caption": "str", "n": "int64"} and ds.record(4)["n"] == 28
    done = cli("pack", root / "t.parquet", "-o", tmp_path / "x.fl", "--image-column", "photo")
    assert done.rc == 2 and "no image column 'photo'" in done.err


LAYOUTS = {  # how writers lay an image column out in an uncompressed Parquet file
    "dictionary, pages v1": {}, "dictionary, pages v2": {"data_page_version": "2.0"},
    "plain, pages v1": {"use_dictionary": False},
    "plain, pages v2": {"use_dictionary": False, "data_page_version": "2.0"},
    "plain, small pages": {"use_dictionary": False, "data_page_size": 2000},
    "dictionary full, then plain": {"data_page_size": 500, "dictionary_pagesize_limit": 3000},
}


@pytest.mark.parametrize("kind", ["nullable", "required", "large_binary", "hf image", "one image repeated"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_uncompressed_parquet_images_are_found_where_they_lie_byte_for_byte(made, tmp_path, layout, kind):
    rng = np.random.default_rng(len(layout) + len(kind))
    images = [rng.bytes(int(n)) for n in rng.integers(0, 1500, 70)]
    if kind == "one image repeated":
        images = [images[0]] * 70
    elif kind != "required":
        for i in (0, 9, 10, 41):
            images[i] = None
    column = (pa.array(images, pa.large_binary()) if kind == "large_binary" else
              pa.array([None if v is None else {"bytes": v, "path": None} for v in images],
                       pa.struct([("bytes", pa.binary()), ("path", pa.string())])) if kind == "hf image" else
              pa.array(images, pa.binary()))
    schema = pa.schema([pa.field("jpg", column.type, nullable=kind != "required")])
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"jpg": column}, schema=schema), path, row_group_size=32, compression="none",
                   **LAYOUTS[layout])
    table = ParquetTable(path, "t.parquet")
    fd = os.open(path, os.O_RDONLY)
    try:
        found = []
        for k in range(len(table.starts) - 1):
            starts, lengths = table.image_spans(k, "jpg", fd)
            found += [None if a < 0 else os.pread(fd, int(n), int(a)) for a, n in zip(starts, lengths)]
    finally:
        os.close(fd)
    assert found == images


def test_a_compressed_chunk_is_read_through_pyarrow(made):
    table = ParquetTable(made[0] / "t.parquet", "t.parquet")  # snappy, pyarrow's default
    fd = os.open(table.path, os.O_RDONLY)
    try:
        with pytest.raises(Unsupported, match="compressed"):
            table.image_spans(0, "jpg", fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("kind", ["int8", "uint64", "int64", "float16", "float32", "bool"])
def test_numbers_are_read_from_their_buffers_with_nulls_and_slices(kind):
    values = [True, False, None, True] * 5 if kind == "bool" else [1, None, 7, 2**63 + 5 if kind == "uint64" else 3, None] * 4
    typ = {"float16": pa.float16(), "bool": pa.bool_()}.get(kind) or getattr(pa, kind)()
    column = pa.chunked_array([pa.array(values[:9], typ).slice(2), pa.array(values[9:], typ).slice(1, 6), pa.array([], typ)])
    got, null = numbers(column)
    want = column.to_pylist()
    assert list(null) == [v is None for v in want]
    assert [None if n else (v.item() if kind != "float16" else float(v)) for v, n in zip(got, null)] == want


def test_packing_a_table_never_imports_pandas(made, tmp_path):
    """pyarrow's to_numpy, fill_null and pa.scalar import pandas (0.12-0.3 s of a pack): not used."""
    code = ("import sys; from fastload.converters import pack; "
            f"pack({str(made[0] / 'plain.parquet')!r}, {str(tmp_path / 'p.fl')!r}, progress=False); "
            "assert 'pandas' not in sys.modules, 'pandas imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
