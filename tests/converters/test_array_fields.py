"""Array fields from a CSV/JSONL list (issue 17): detection boxes, multi-labels and embeddings pack as
typed arrays with their shapes (``float64[*,4]``: the first dimension may vary) and read back exactly;
a list that cannot be one array is refused naming its line."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

import fastload
from fastload.converters import pack
from fastload.errors import SourceError
from tests.conftest import make_jpeg

ROWS = [
    {"path": f"{i}.jpg", "label": i % 3,
     "boxes": [[0.1 * i + k, 2.5, 30.25 + k, 1e-7 * i] for k in range(i % 4)],  # 0 to 3 boxes
     "tags": list(range(i % 3)),  # multi-label, 0 to 2 labels
     "embedding": [float(np.float64(i) / 7), -0.0, 1e300],
     "flags": [i % 2 == 0, True],
     "caption": f"a photo, number {i}"}
    for i in range(9)
]
TYPES = {"boxes": "float64[*,4]", "tags": "int64[*]", "embedding": "float64[3]", "flags": "bool[2]",
         "caption": "str"}


def write_images(root) -> None:
    for i in range(len(ROWS)):
        (root / f"{i}.jpg").write_bytes(make_jpeg(40, 30, seed=i))


def check(ds: fastload.PackedDataset) -> None:
    assert ds.manifest.fields == TYPES
    for i, row in enumerate(ROWS):
        got = ds.record(i)
        assert got["caption"] == row["caption"] and got["label"] == row["label"]
        boxes = got["boxes"]
        assert boxes.dtype == np.float64 and boxes.shape == (len(row["boxes"]), 4)
        assert boxes.tolist() == row["boxes"]  # bit-exact: float64 from the text, and back
        assert got["tags"].dtype == np.int64 and got["tags"].tolist() == row["tags"]
        assert got["embedding"].tolist() == row["embedding"] and got["embedding"].shape == (3,)
        assert got["flags"].dtype == np.bool_ and got["flags"].tolist() == row["flags"]
        assert not boxes.flags.writeable  # a view of the shared index, never a copy to change


def test_a_jsonl_list_packs_array_fields_exactly(tmp_path):
    write_images(tmp_path)
    (tmp_path / "list.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    for fmt in ("lmdb", "hdf5"):
        pack(tmp_path / "list.jsonl", tmp_path / f"{fmt}.fl", format=fmt, progress=False)
        check(fastload.PackedDataset(tmp_path / f"{fmt}.fl"))


def test_a_csv_list_with_json_cells_packs_the_same(tmp_path):
    write_images(tmp_path)
    with open(tmp_path / "list.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(ROWS[0]))
        writer.writeheader()
        for row in ROWS:  # an empty list as an empty cell too: no boxes
            writer.writerow({k: (json.dumps(v) if isinstance(v, list) and v else "" if v == [] else v)
                             for k, v in row.items()})
    pack(tmp_path / "list.csv", tmp_path / "csv.fl", progress=False)
    check(fastload.PackedDataset(tmp_path / "csv.fl"))


@pytest.mark.parametrize("values, message", [
    ([[[1, 2]], [[1, 2, 3]]], r"list.jsonl:2: field 'boxes' has shape \[1, 3\], the first row with one has \[1, 2\]"),
    ([[[1, 2], [3]], [[1, 2]]], r"list.jsonl:1: field 'boxes' is a ragged list"),
    ([[1, 2], "7"], r"list.jsonl:2: field 'boxes' is '7', not a list"),
    ([[1, 2], ["a", "b"]], r"list.jsonl:2: field 'boxes' holds something other than numbers"),
])
def test_lists_that_are_not_one_array_are_refused_naming_the_line(tmp_path, values, message):
    (tmp_path / "a.jpg").write_bytes(make_jpeg(20, 20))
    rows = [{"path": "a.jpg", "boxes": v} for v in values]
    (tmp_path / "list.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(SourceError, match=message):
        pack(tmp_path / "list.jsonl", tmp_path / "x.fl", progress=False)
