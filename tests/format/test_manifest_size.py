"""A manifest costs memory in proportion to its size: JSON far denser in objects, arrays or strings
than any manifest, or class names by the million for a handful of records, is refused before it is
built (a 229 MB manifest of class names once took 6 GB to `fastload info`)."""

from __future__ import annotations

import json

import pytest

from fastload import ManifestError
from fastload.format import parse_manifest, read_manifest
from fastload.format.manifest import Manifest, ShardInfo
from tests.conftest import copy_dataset, load_manifest_json, save_manifest_json


@pytest.fixture
def dataset(packed, tmp_path):
    return copy_dataset(packed("lmdb")[0], tmp_path / "ds")


@pytest.mark.parametrize("junk", [[[]] * 500_000, [{}] * 500_000, ["a"] * 500_000])
def test_json_denser_than_a_manifest_is_refused_before_it_is_built(dataset, junk) -> None:
    raw = load_manifest_json(dataset)
    raw["packed"]["junk"] = junk
    save_manifest_json(dataset, raw)
    with pytest.raises(ManifestError, match=r"manifest.json: \d+ JSON objects and arrays and \d+ strings in \d+ "
                                            r"characters, out of all proportion to a manifest's"):
        read_manifest(dataset)


def test_class_names_by_the_million_for_few_records_are_refused(dataset) -> None:
    raw = load_manifest_json(dataset)
    raw["classes"] = [f"class-{i:07d}" for i in range(raw["num_records"] + 2**16 + 1)]
    save_manifest_json(dataset, raw)
    with pytest.raises(ManifestError, match=rf"{65536 + 1 + raw['num_records']} class names for "
                                            rf"{raw['num_records']} records, more than 65536 classes without a record"):
        read_manifest(dataset)
    raw["classes"] = raw["classes"][:-1]  # empty class folders are classes: up to 65,536 of them
    save_manifest_json(dataset, raw)
    assert len(read_manifest(dataset).classes) == raw["num_records"] + 2**16


@pytest.mark.parametrize("indent", [None, 2])
def test_a_manifest_of_many_shards_is_in_proportion(dataset, indent) -> None:
    manifest = read_manifest(dataset)
    shard = ShardInfo(file="", num_records=0, bytes=0, data_bytes=0, records_digest="0" * 32)
    many = [ShardInfo(**{**shard.__dict__, "file": f"shard-{i:05d}.lmdb"}) for i in range(len(manifest.shards), 50_000)]
    grown = Manifest(**{**manifest.__dict__, "shards": [*manifest.shards, *many]})
    text = grown.to_json() if indent else json.dumps(json.loads(grown.to_json()), separators=(",", ":"))
    assert len(parse_manifest(text, "grown").shards) == 50_000
