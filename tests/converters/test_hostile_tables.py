"""Tables written to hurt (issue 37): a save_to_disk state.json that names files outside its folder
(or is no state file at all), labels the index cannot store, a column name given twice. Each is a
SourceError naming the file (and row), before anything outside the folder is opened."""

from __future__ import annotations

import json
import os

import pytest
from fastload.converters import pack

from fastload.errors import SourceError
from tests.conftest import make_jpeg

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
feather = pytest.importorskip("pyarrow.feather")

JPEG = make_jpeg(16, 12, seed=1)


def _saved(folder, files) -> None:
    """A save_to_disk folder: its state.json listing ``files`` (as given), one real data file."""
    folder.mkdir()
    feather.write_feather(pa.table({"image": [JPEG], "label": [0]}), folder / "data-00000-of-00001.arrow")
    (folder / "state.json").write_text(json.dumps({"_data_files": files, "_fingerprint": "x"}))


@pytest.mark.parametrize("name", ["../outside.arrow", "/etc/passwd", "../../../../proc/self/environ"])
def test_state_json_names_outside_its_folder_are_refused(tmp_path, name):
    feather.write_feather(pa.table({"image": [JPEG], "label": [5]}), tmp_path / "outside.arrow")
    _saved(tmp_path / "saved", [{"filename": name}])
    with pytest.raises(SourceError) as err:
        pack(tmp_path / "saved", tmp_path / "out.fl", progress=False)
    assert str(err.value) == (f"{tmp_path / 'saved' / 'state.json'}: _data_files[0] names {name!r}, not a data file "
                              "in its folder (a plain file name); save the dataset again with save_to_disk")
    assert not (tmp_path / "out.fl").exists()


def test_a_data_file_that_links_out_of_the_folder_is_refused_as_a_list_path_is(tmp_path):
    feather.write_feather(pa.table({"image": [JPEG], "label": [5]}), tmp_path / "outside.arrow")
    _saved(tmp_path / "saved", [{"filename": "linked.arrow"}])
    os.symlink(tmp_path / "outside.arrow", tmp_path / "saved" / "linked.arrow")
    with pytest.raises(SourceError, match=rf"state.json: data file 'linked.arrow' resolves to {tmp_path}/outside.arrow, "
                                          rf"outside {tmp_path}/saved, where the data files its state.json names"):
        pack(tmp_path / "saved", tmp_path / "out.fl", progress=False)


def test_a_data_file_listed_twice_is_refused_naming_it_not_packed_twice(tmp_path):
    """Issue 44, H4: its rows were packed twice, rc 0."""
    data = "data-00000-of-00001.arrow"
    _saved(tmp_path / "saved", [{"filename": data}, {"filename": data}])
    with pytest.raises(SourceError, match=rf"saved/state.json: _data_files\[1\] names '{data}' again \(as "
                                          rf"_data_files\[0\] does\), so its rows would be packed twice"):
        pack(tmp_path / "saved", tmp_path / "a.fl", progress=False)
    os.symlink(data, tmp_path / "saved" / "again.arrow")  # the same file under another name
    (tmp_path / "saved" / "state.json").write_text(json.dumps({"_data_files": [{"filename": data},
                                                                               {"filename": "again.arrow"}]}))
    with pytest.raises(SourceError, match=rf"saved/state.json: data files '{data}' and 'again.arrow' are the same "
                                          r"file \(a link\), so its rows would be packed twice"):
        pack(tmp_path / "saved", tmp_path / "b.fl", progress=False)
    assert not (tmp_path / "a.fl").exists() and not (tmp_path / "b.fl").exists()


@pytest.mark.parametrize("state, reason", [
    ({"_data_files": [{"filename": 7}]}, r"_data_files\[0\] names 7, not a data file"),
    ({"_data_files": []}, r"its _data_files is \[\], not a list of one or more data files"),
    ({"_data_files": "data.arrow"}, r"its _data_files is 'data.arrow', not a list"),
    ([], r"its _data_files is None"),
    ({"_data_files": [3]}, r"_data_files\[0\] names 3, not a data file"),
], ids=["int-filename", "empty", "a-string", "not-an-object", "not-an-entry"])
def test_a_state_json_that_is_no_state_file_is_named(tmp_path, state, reason):
    _saved(tmp_path / "saved", [])
    (tmp_path / "saved" / "state.json").write_text(json.dumps(state))
    with pytest.raises(SourceError, match=rf"saved/state.json: .*{reason}"):
        pack(tmp_path / "saved", tmp_path / "out.fl", progress=False)


def test_a_state_json_nested_100000_deep_is_named(tmp_path):
    _saved(tmp_path / "saved", [])
    (tmp_path / "saved" / "state.json").write_text('{"_data_files": ' + "[" * 100_000)
    with pytest.raises(SourceError, match=r"saved/state.json: not a save_to_disk state file \(it is nested 100001 "
                                          r"levels deep, over the 64 accepted"):
        pack(tmp_path / "saved", tmp_path / "out.fl", progress=False)


@pytest.mark.parametrize("label", [-5, -(2**63)])
def test_a_label_the_index_cannot_store_is_named_with_its_file_and_row(tmp_path, label):
    table = pa.table({"image": [JPEG, JPEG, JPEG], "label": pa.array([0, -1, label], pa.int64())})
    pq.write_table(table, tmp_path / "t.parquet")
    with pytest.raises(SourceError, match=rf"t.parquet: row 2: label {label} is out of the range a label is stored "
                                          r"in \(-1 for none, or a class id 0..2\*\*63-1\)"):
        pack(tmp_path / "t.parquet", tmp_path / "out.fl", progress=False)
    assert not (tmp_path / "out.fl").exists()


def test_two_columns_named_label_are_named(tmp_path):
    table = pa.Table.from_arrays([pa.array([JPEG]), pa.array([1]), pa.array([2])], names=["image", "label", "label"])
    pq.write_table(table, tmp_path / "t.parquet")
    with pytest.raises(SourceError, match=r"t.parquet: 1 name\(s\) given to more than one column \('label'\); "
                                          r"rename the columns"):
        pack(tmp_path / "t.parquet", tmp_path / "out.fl", progress=False)
