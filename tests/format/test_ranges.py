"""Every number read from the manifest or the index is range-checked where it enters, with an error
naming the field or record and the value: no OverflowError later, no int64 sum that wraps."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from fastload import ManifestError, PackedDataset
from fastload.format import file_digest, parse_manifest, read_manifest
from tests.conftest import copy_dataset, load_manifest_json, save_manifest_json

BIG = 2**63  # what a hostile manifest or index would hold: one past int64


@pytest.fixture
def dataset(packed, tmp_path):
    """A private copy of a packed LMDB dataset (several shards, 3 classes), free to damage."""
    return copy_dataset(packed("lmdb")[0], tmp_path / "ds")


# --- manifest: every integer has an upper bound -------------------------------------------------------

@pytest.mark.parametrize("at, field, change", [
    ("", "num_records", lambda m, v: m.update(num_records=v)),
    ("", "total_bytes", lambda m, v: m.update(total_bytes=v)),
    ("shards[1]: ", "num_records", lambda m, v: m["shards"][1].update(num_records=v)),
    ("shards[1]: ", "bytes", lambda m, v: m["shards"][1].update(bytes=v)),
    ("shards[1]: ", "data_bytes", lambda m, v: m["shards"][1].update(data_bytes=v)),
    ("shards[1]: ", "data_offset", lambda m, v: m["shards"][1].update(data_offset=v)),
])
@pytest.mark.parametrize("value", [BIG, 2**53, 10**30])
def test_manifest_integers_over_the_bound_are_refused_naming_field_and_value(dataset, at, field, change, value):
    raw = load_manifest_json(dataset)
    change(raw, value)
    with pytest.raises(ManifestError) as err:
        parse_manifest(json.dumps(raw), "m.json")
    assert str(err.value) == (f"m.json: {at}{field} is {value}, over the largest count or size a manifest "
                              "holds (9007199254740991 = 2**53 - 1); the dataset is damaged, re-pack it "
                              "with `fastload pack`")


def test_the_bound_itself_is_accepted(dataset):
    raw = load_manifest_json(dataset)
    raw["shards"][1]["bytes"] = 2**53 - 1  # no sum to agree with: parses, the open then checks the file
    assert parse_manifest(json.dumps(raw), "m.json").shards[1].bytes == 2**53 - 1


def test_consistent_huge_sizes_are_refused_on_open_not_with_an_overflow(dataset):
    """Sums that agree used to pass the parse and crash building the int64 bounds array."""
    raw = load_manifest_json(dataset)
    raw["shards"][0]["data_bytes"] += BIG
    raw["total_bytes"] += BIG
    save_manifest_json(dataset, raw)
    with pytest.raises(ManifestError, match=rf"manifest\.json: total_bytes is {raw['total_bytes']}, over the "):
        PackedDataset(dataset)


# --- index: offsets and sizes cannot wrap the bounds check ---------------------------------------------

def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def _forge(dataset, column: str, change) -> None:
    """Rewrite index column ``column`` with ``change(array)`` applied, its digest made to match."""
    manifest = read_manifest(dataset)
    path = dataset / manifest.index[column].file
    array = np.load(path).copy()
    change(array)
    data = _npy(array)
    path.write_bytes(data)
    raw = load_manifest_json(dataset)
    raw["index"][column]["digest"] = file_digest(data)
    save_manifest_json(dataset, raw)


@pytest.mark.parametrize("column, value", [
    ("offset", 2**63 - 10),  # offset + size wraps negative: passed the old check
    ("size", 2**63 - 1),
    ("size", -1),
    ("offset", -(2**63)),
])
def test_offsets_and_sizes_near_int64_limits_are_refused_naming_the_record(dataset, column, value):
    def change(array):
        array[2] = value

    _forge(dataset, column, change)
    with pytest.raises(ManifestError) as err:
        PackedDataset(dataset)
    message = str(err.value)
    assert message.startswith(f"{dataset / 'index'}: record 2 points outside shard shard-00000.lmdb (")
    assert f"{column} {value}" in message and message.endswith("re-pack the dataset")


@pytest.mark.parametrize("width, height", [(0, 32), (40, 0), (-5, 32), (-1, 32), (40, -1), (0, 0)])
def test_widths_and_heights_are_minus_one_for_both_or_at_least_one(dataset, width, height):
    _forge(dataset, "width", lambda a: a.__setitem__(4, width))
    _forge(dataset, "height", lambda a: a.__setitem__(4, height))
    with pytest.raises(ManifestError) as err:
        PackedDataset(dataset)
    assert str(err.value) == (
        f"{dataset / 'index'}: record 4 (cat/004.jpg) has width {width} and height {height}; an image is "
        "at least 1x1, and a record without a size has -1 for both; re-pack the dataset")


def test_unmeasured_sizes_are_allowed(dataset):
    _forge(dataset, "width", lambda a: a.__setitem__(4, -1))
    _forge(dataset, "height", lambda a: a.__setitem__(4, -1))
    ds = PackedDataset(dataset, image_size=8, train=True)
    assert ds.record(4)["width"] == -1 and ds[4][0].shape == (3, 8, 8)  # measured from the header


# --- labels without class names ----------------------------------------------------------------------

def _without_classes(dataset) -> None:
    raw = load_manifest_json(dataset)
    raw["classes"] = None
    save_manifest_json(dataset, raw)


def test_labels_without_classes_are_still_checked(dataset):
    _without_classes(dataset)
    _forge(dataset, "label", lambda a: a.__setitem__(3, -(2**62)))
    with pytest.raises(ManifestError, match=rf"record 3 has label {-(2**62)}, outside -1 \(unlabeled\) and the "
                                            r"class ids 0 and up; re-pack the dataset"):
        PackedDataset(dataset)


def test_large_labels_without_classes_are_valid_and_nothing_allocates_by_them(dataset):
    _without_classes(dataset)
    _forge(dataset, "label", lambda a: a.__setitem__(3, 2**62))
    ds = PackedDataset(dataset, image_size=8, train=True)
    assert ds.targets[3] == 2**62 and ds[3][1] == 2**62
    batch = ds.__getitems__([2, 3])
    assert batch.images.shape == (2, 3, 8, 8) and batch.labels.tolist()[1] == 2**62
