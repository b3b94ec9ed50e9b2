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
