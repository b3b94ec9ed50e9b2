"""Numbers in a list's fields (issue 24, item 8): a number float64 cannot hold as written (a whole
number past 2**53 in a column of fractions, ``1e400``, NaN, an infinity) is refused naming the list,
its line and the field, in scalar and array fields alike; what float64 or int64 holds exactly packs
and reads back bit for bit."""

from __future__ import annotations

import json

import pytest

import fastload
from fastload.converters import pack
from fastload.errors import SourceError
from tests.conftest import make_jpeg, write_tree

N = 3
BIG = 2**53 + 1  # 9007199254740993: the first whole number float64 cannot hold


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("numbers")
    write_tree(root, {f"{i}.jpg": make_jpeg(40, 30, seed=i) for i in range(N)})
    return root


def jsonl(root, name: str, values: list[str]) -> object:
    """A JSONL list whose rows hold ``"n": <value>``, each value written as given (raw JSON)."""
    rows = [f'{{"path": "{i}.jpg", "n": {value}}}' for i, value in enumerate(values)]
    (root / name).write_text("\n".join(rows) + "\n")
    return root / name


def csv(root, name: str, values: list[str]) -> object:
    (root / name).write_text("path,n\n" + "".join(f'{i}.jpg,"{v}"\n' for i, v in enumerate(values)))
    return root / name


@pytest.mark.parametrize("write, values, line, message", [
    (jsonl, ["0.5", str(BIG), "1"], 2, rf"is {BIG}, which float64 .* cannot hold exactly \(it would be {BIG - 1}\)"),
    (jsonl, ["[0.5]", f"[{BIG}]", "[]"], 2, rf"is {BIG}, which float64 .* cannot hold exactly"),  # an array
    (csv, ["0.5", str(BIG), "1"], 3, rf"is {BIG}, which float64 .* cannot hold exactly"),
    (csv, ["1.5", "1e400", "2"], 3, r"is '1e400', not a finite number"),
    (jsonl, ["1.5", "1e400", "2"], 2, r"is inf, not a finite number"),  # json reads 1e400 as inf
    (jsonl, ["1.5", str(10**400), "2"], 2, r"is 10{400}, not a finite number"),  # past float64's range
    (csv, ["1.5", "nan", "2"], 3, r"is 'nan', not a finite number"),
    (jsonl, ["[[0, 0, 10, 10]]", "[[0, 0, NaN, 10]]", "[]"], 2, r"is nan, not a finite number"),  # boxes
    (jsonl, ["[[0, 0, 10, 10]]", "[]", "[[0, -Infinity, 1, 1]]"], 3, r"is -inf, not a finite number"),
    (csv, ["[[0, 0, 10, 10]]", "[[0, 0, 1e999, 10]]", "[]"], 3, r"is inf, not a finite number"),
], ids=["big-int-among-fractions", "big-int-in-array", "big-int-csv", "1e400-csv", "1e400-jsonl",
        "int-past-float64", "nan-csv", "nan-box", "infinity-box", "inf-box-csv"])
def test_a_number_float64_cannot_hold_is_refused_naming_its_line(images, tmp_path, write, values, line,
                                                                  message):
    listed = write(images, f"{tmp_path.name}.{write.__name__}", values)
    with pytest.raises(SourceError, match=rf"^{listed}:{line}: field 'n' {message}"):
        pack(listed, tmp_path / "out.fl", progress=False)
    assert not (tmp_path / "out.fl").exists()


def test_numbers_float64_or_int64_hold_pack_and_read_back_exactly(images, tmp_path):
    rows = [{"path": f"{i}.jpg", "big": BIG + i, "exact": [2**53, 0.5][i % 2], "x": [0.1 * i, 1e308],
             "boxes": [[0, 0.5, 1e-300, 2**60]] * i} for i in range(N)]
    (images / "exact.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    pack(images / "exact.jsonl", tmp_path / "out.fl", progress=False)
    ds = fastload.PackedDataset(tmp_path / "out.fl")
    assert ds.manifest.fields == {"big": "int64", "exact": "float64", "x": "float64[2]", "boxes": "float64[*,4]"}
    for i, row in enumerate(rows):
        got = ds.record(i)
        assert got["big"] == row["big"] and got["exact"] == row["exact"]
        assert got["x"].tolist() == row["x"] and got["boxes"].tolist() == row["boxes"]


@pytest.mark.parametrize("value, reason", [("1" * 5000, r"not valid JSON \(.*Exceeds the limit"),
                                           ("[" * 100_000, r"nested 100001 levels deep, over the 64 accepted")],
                         ids=["5000-digits", "100000-deep"])
def test_a_json_number_or_list_python_cannot_parse_is_refused_naming_its_line(images, tmp_path, value, reason):
    listed = jsonl(images, f"{tmp_path.name}.jsonl", ["1", value])
    with pytest.raises(SourceError, match=rf"^{listed}:2: {reason}"):
        pack(listed, tmp_path / "out.fl", progress=False)
