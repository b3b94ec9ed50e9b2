"""Field names (issue 24, item 7): no name can land on a column the format derives for another
field (``x.values`` beside an array ``x``, ``mask.width`` beside a file field ``mask``), nor on no
file at all (empty, ``/``, ``..``, NUL, over-long). Refused when the pack starts, before any
shard, and in a manifest that was written by hand."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

import fastload
from fastload.converters import pack
from fastload.errors import ManifestError, SourceError
from fastload.format.layout import MAX_FIELD_NAME_BYTES
from tests.conftest import load_manifest_json, make_jpeg, save_manifest_json, write_tree
from tests.converters.test_file_fields import mask_png

N = 3


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A folder of N small JPEGs with an L-mode mask beside each (``<i>.png``)."""
    root = tmp_path_factory.mktemp("names")
    write_tree(root, {f"{i}.jpg": make_jpeg(40, 30, seed=i) for i in range(N)})
    write_tree(root, {f"{i}.png": mask_png(40, 30, seed=i) for i in range(N)})
    return root


def write_list(root, name: str, extra: dict) -> object:
    """A JSONL list of the N images, each row also holding ``extra`` (values: a function of i)."""
    rows = [{"path": f"{i}.jpg", **{k: f(i) for k, f in extra.items()}} for i in range(N)]
    (root / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root / name


@pytest.mark.parametrize("extra, file_columns, bad", [
    ({"x": lambda i: [i, i + 1], "x.values": lambda i: 7 * i}, (), "x.values"),  # x's own values column
    ({"mask": lambda i: f"{i}.png", "mask.width": lambda i: 5, "mask.height": lambda i: 6}, ("mask",),
     "mask.height"),  # the file field's width/height columns
    ({"a": lambda i: "text", "a.offsets": lambda i: i}, (), "a.offsets"),  # a's string offsets
    ({"": lambda i: i}, (), ""),
    ({"a/b": lambda i: i}, (), "a/b"),
    ({"..": lambda i: i}, (), ".."),
    ({"a\x00b": lambda i: i}, (), "a\x00b"),
    ({"n" * (MAX_FIELD_NAME_BYTES + 1): lambda i: i}, (), "n" * (MAX_FIELD_NAME_BYTES + 1)),
    ({"image": lambda i: i}, (), "image"),  # would hide the image from fields=("image",)
], ids=["x-and-x.values", "mask-and-mask.width", "a-and-a.offsets", "empty", "slash", "dotdot", "nul",
        "too-long", "image"])
def test_a_name_that_lands_on_another_column_is_refused_before_any_shard(images, tmp_path, extra,
                                                                        file_columns, bad):
    listed = write_list(images, f"{tmp_path.name}.jsonl", extra)
    out = tmp_path / "out.fl"
    with pytest.raises(SourceError) as err:
        pack(listed, out, file_columns=file_columns, progress=False)
    assert str(err.value).startswith(f"{listed}: field name {bad!r} (a column of the list) ")
    assert not out.exists()  # refused while listing: no folder, no shard


def test_a_sidecar_key_on_a_file_fields_column_is_refused(tmp_path):
    src = tmp_path / "src"
    write_tree(src, {"0.jpg": make_jpeg(40, 30), "0.png": mask_png(40, 30, seed=0),
                     "0.json": json.dumps({"png.width": 3}).encode()})
    with pytest.raises(SourceError, match=r"0\.json: field name 'png\.width' \(a key of this sidecar\) ends "
                                          r"in '\.width'"):
        pack(src, tmp_path / "out.fl", sidecars=True, progress=False)


def test_names_with_dots_that_derive_nothing_pack_and_read_back(images, tmp_path):
    listed = write_list(images, "dotted.jsonl", {"box.sizes": lambda i: [[i, 2]], "a.b": lambda i: i / 4,
                                                 "values": lambda i: f"v{i}"})
    pack(listed, tmp_path / "out.fl", progress=False)
    ds = fastload.PackedDataset(tmp_path / "out.fl")
    for i in range(N):
        got = ds.record(i)
        assert got["box.sizes"].tolist() == [[i, 2]] and got["a.b"] == i / 4 and got["values"] == f"v{i}"


@pytest.fixture(scope="module")
def with_array(images, tmp_path_factory):
    """A packed dataset with an array field ``x``, one value a record (field.x.offsets, field.x.values)."""
    out = tmp_path_factory.mktemp("packed") / "x.fl"
    pack(write_list(images, "array.jsonl", {"x": lambda i: [10 + i]}), out, progress=False)
    return out


@pytest.mark.parametrize("name", ["x.values", "x.offsets", "", "../x", "label"])
def test_a_manifest_naming_a_field_onto_another_fields_column_is_refused(with_array, tmp_path, name):
    dataset = tmp_path / "d.fl"
    shutil.copytree(with_array, dataset)
    raw = load_manifest_json(dataset)
    raw["fields"][name] = "int64"  # its column would be field.x.values: x's values read as this field
    raw["index"][f"field.{name}"] = raw["index"]["field.x.values"]
    save_manifest_json(dataset, raw)
    with pytest.raises(ManifestError, match=rf"field name {name!r}|fields must map names"):
        fastload.PackedDataset(dataset)


def test_a_hostile_manifest_cannot_read_one_fields_values_as_anothers(with_array, tmp_path):
    """The issue's case: a scalar x.values whose column is x's values (N int64: it would load)."""
    dataset = tmp_path / "d.fl"
    shutil.copytree(with_array, dataset)
    raw = load_manifest_json(dataset)
    raw["fields"]["x.values"] = "int64"
    save_manifest_json(dataset, raw)
    assert np.load(dataset / raw["index"]["field.x.values"]["file"]).tolist() == [10 + i for i in range(N)]
    with pytest.raises(ManifestError, match=r"field name 'x\.values' ends in '\.values'.*re-pack"):
        fastload.PackedDataset(dataset)


def test_pad_fields_cannot_hide_a_field_named_like_its_lengths(images, tmp_path):
    listed = write_list(images, "lengths.jsonl", {"tags": lambda i: list(range(i)), "tags_lengths": lambda i: 9})
    pack(listed, tmp_path / "out.fl", progress=False)
    with pytest.raises(ValueError, match=r"pad_fields: 'tags' adds tags_lengths to each batch"):
        fastload.PackedDataset(tmp_path / "out.fl", fields=("tags", "tags_lengths"), pad_fields={"tags": -1})


# Issue 37, item 2: a field named like a key the record already has (``record(i)["data"]`` is the
# image's bytes, ``width`` its width, ...) would shadow it; one rule (fastload.format.layout), every way in.
SHADOWING = ["data", "width", "height", "checksum", "shard", "offset", "size", "position", "index"]


@pytest.mark.parametrize("name", SHADOWING)
def test_a_list_column_named_like_a_records_own_key_is_refused(images, tmp_path, name):
    listed = write_list(images, f"{tmp_path.name}.jsonl", {name: lambda i: i})
    with pytest.raises(SourceError, match=rf"^{listed}: field name {name!r} \(a column of the list\) is taken "
                                          r"\(a record has .*data.*\): rename it"):
        pack(listed, tmp_path / "out.fl", progress=False)
    assert not (tmp_path / "out.fl").exists()


def _tar(path, members: dict[str, bytes]) -> None:
    import io
    import tarfile

    with tarfile.open(path, "w") as archive:
        for member, data in members.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def _parquet(path, name: str) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"jpg": [make_jpeg(20, 20, seed=i) for i in range(N)], name: list(range(N))}), path)


@pytest.mark.parametrize("way", ["sidecar", "tar-json", "tar-member", "parquet", "writer", "writer-fields",
                                 "samples"])
def test_every_way_in_refuses_a_field_that_shadows_a_records_key(tmp_path, way):
    out = tmp_path / "out.fl"
    src = tmp_path / "src"
    src.mkdir()
    if way == "sidecar":
        write_tree(src, {"0.jpg": make_jpeg(20, 20), "0.json": json.dumps({"width": 3}).encode()})
        with pytest.raises(SourceError, match=r"0\.json: key 'width' is taken"):
            pack(src, out, sidecars=True, progress=False)
    elif way.startswith("tar"):
        member = ("0.json", json.dumps({"offset": 3}).encode()) if way == "tar-json" else ("0.size", b"7")
        _tar(src / "data-0.tar", {"0.jpg": make_jpeg(20, 20), member[0]: member[1]})
        with pytest.raises(SourceError, match=r"'offset' is taken|field name 'size' .* is taken"):
            pack(src / "data-0.tar", out, progress=False)
    elif way == "parquet":
        _parquet(src / "t.parquet", "checksum")
        with pytest.raises(SourceError, match=r"t\.parquet: field name 'checksum' \(a column.*\) is taken"):
            pack(src / "t.parquet", out, progress=False)
    elif way == "writer":
        with pytest.raises(SourceError, match=r"sample 0 \(key '00000000'\): field name 'data' is taken"), \
                fastload.Writer(out) as writer:
            writer.write({"image": make_jpeg(20, 20), "data": b"\x00"})
    elif way == "writer-fields":
        with pytest.raises(ValueError, match=r"fields=: field name 'height' is taken"):
            fastload.Writer(out, fields={"height": "int64"})
    else:  # a map-style dataset of samples, packed in worker processes
        with pytest.raises(SourceError, match=r"field name 'shard' is taken"):
            pack([{"image": make_jpeg(20, 20, seed=i), "shard": i} for i in range(N)], out, workers=1,
                 progress=False)
    assert not (out / "manifest.json").exists()  # no dataset (a dataset's pack keeps its working folder)


def test_a_dataset_written_before_the_rule_with_a_field_named_width_still_opens(with_array, tmp_path):
    """Reading is not refused for names reserved since (only for those that land on another column)."""
    dataset = tmp_path / "d.fl"
    shutil.copytree(with_array, dataset)
    raw = load_manifest_json(dataset)
    raw["fields"] = {"width": "int64"}
    raw["index"] = {("field.width" if k == "field.x.values" else k): v for k, v in raw["index"].items()
                    if k != "field.x.offsets"}
    save_manifest_json(dataset, raw)
    assert fastload.PackedDataset(dataset).manifest.fields == {"width": "int64"}
