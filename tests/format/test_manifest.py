"""The manifest and index contract: strict parsing, versions, hostile paths, damaged index columns."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from fastload import DatasetNotFoundError, ManifestError, PackedDataset
from fastload.format import (
    FORMAT_VERSION, RecordIndex, encode_strings, file_digest, parse_manifest, read_manifest, write_manifest,
)
from tests.conftest import copy_dataset, load_manifest_json, save_manifest_json

STORAGES = ["lmdb", "hdf5"]


@pytest.fixture
def dataset(packed, tmp_path):
    """A private copy of a packed LMDB dataset, free to damage."""
    return copy_dataset(packed("lmdb")[0], tmp_path / "ds")


def refused(dataset, match: str) -> ManifestError:
    with pytest.raises(ManifestError, match=match) as err:
        PackedDataset(dataset)
    assert isinstance(err.value, ValueError)
    return err.value


# --- round trip -------------------------------------------------------------------------------------

@pytest.mark.parametrize("storage", STORAGES)
def test_manifest_round_trips(packed, storage, tmp_path):
    out, files = packed(storage)
    manifest = read_manifest(out)
    assert manifest.format_version == FORMAT_VERSION and manifest.storage == storage
    assert manifest.num_records == len(files) and manifest.kind == "images"
    assert manifest.classes == ["cat", "dog", "emu"] and len(manifest.shards) > 1
    assert parse_manifest(manifest.to_json(), "x") == manifest
    raw = json.loads(manifest.to_json())
    assert raw["format"] == "fastload" and raw["format_version"] == FORMAT_VERSION
    copy = tmp_path / "copy"
    copy.mkdir()
    write_manifest(copy, manifest)
    assert read_manifest(copy) == manifest and not list(copy.glob("*.tmp"))


def test_index_holds_no_python_objects(packed):
    out, _ = packed("hdf5")
    index = RecordIndex(out, read_manifest(out))
    for name in ("label", "shard", "position", "offset", "size", "checksum", "width", "height"):
        column = getattr(index, name)
        assert isinstance(column, np.ndarray) and column.dtype != object and not column.flags.writeable
    assert index.path.offsets.dtype == np.int64 and index.path.blob.dtype == np.uint8


# --- format versions and garbled manifests ------------------------------------------------------------

@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, 0, str(FORMAT_VERSION), None, 1.0 + 0.5])
def test_other_format_versions_are_refused_with_a_repack_hint(dataset, version):
    raw = load_manifest_json(dataset)
    if version is None:
        del raw["format_version"]
    else:
        raw["format_version"] = version
    save_manifest_json(dataset, raw)
    err = refused(dataset, f"format_version is {version!r}, this fastload reads {FORMAT_VERSION}")
    assert "re-pack" in str(err) and str(dataset / "manifest.json") in str(err)


@pytest.mark.parametrize("text", [
    "", "{", '{"format": "fastload", "format_version": 1', "not json at all", "[" * 100_000,
    '{"format": "fastload"} trailing', "\udcff\udcfe",
])
def test_garbled_json_is_refused(dataset, text):
    (dataset / "manifest.json").write_bytes(text.encode("utf-8", errors="surrogateescape"))
    refused(dataset, r"manifest\.json: not valid JSON .*re-pack the dataset")


@pytest.mark.parametrize("text", ["[]", "null", "42", '"fastload"', '{"format": "ffcv", "format_version": 1}'])
def test_json_that_is_not_a_fastload_manifest_is_refused(dataset, text):
    (dataset / "manifest.json").write_text(text)
    refused(dataset, "not a fastload manifest")


@pytest.mark.parametrize("change, match", [
    (lambda m: m.update(storage="zip"), "storage must be one of"),
    (lambda m: m.update(num_records=m["num_records"] + 1), "do not add up to num_records"),
    (lambda m: m.update(num_records=-1), "num_records must be an integer >= 0"),
    (lambda m: m.update(num_records=True), "num_records must be an integer"),
    (lambda m: m.update(total_bytes="12"), "total_bytes must be an integer"),
    (lambda m: m.update(kind="videos"), "kind must be 'images' or 'files'"),
    (lambda m: m.update(classes="cat"), "classes must be a list of strings"),
    (lambda m: m.update(classes=[1, 2]), "classes must be a list of strings"),
    (lambda m: m.update(shards={}), "shards must be a list"),
    (lambda m: m["shards"][0].update(data_bytes=m["shards"][0]["data_bytes"] + 1), "data_bytes do not add up"),
    (lambda m: m["shards"][0].pop("records_digest"), r"shards\[0\]: records_digest must be a string"),
    (lambda m: m["shards"][1].update(data_offset=-7), "data_offset must be an integer >= -1"),
    (lambda m: m["shards"][0].update(num_entries=0), r"shards\[0\]: num_entries is below num_records"),
    (lambda m: m.update(fields={"mask": "mask"}), "index column 'field.mask.position' is missing"),
    (lambda m: m["shards"].reverse(), "not the expected shard name for position 0"),
    (lambda m: m["index"].pop("checksum"), "index column 'checksum' is missing"),
    (lambda m: m["index"].pop("path.blob"), "index column 'path.blob' is missing"),
    (lambda m: m.update(fields={"w": "complex128"}), "fields must map names to one of"),
    (lambda m: m.update(fields={"w": "int64"}), "index column 'field.w' is missing"),
    (lambda m: m.update(index=[]), "index must be an object"),
    (lambda m: m.update(packed=[]), "packed must be an object"),
])
def test_inconsistent_manifests_are_refused(dataset, change, match):
    raw = load_manifest_json(dataset)
    change(raw)
    save_manifest_json(dataset, raw)
    err = refused(dataset, match)
    assert "re-pack" in str(err)


# --- paths that would leave the dataset directory -------------------------------------------------------

@pytest.mark.parametrize("name", [
    "../../etc/passwd", "/etc/passwd", "../shard-00000.lmdb", "/tmp/shard-00000.lmdb",
    "sub/../shard-00000.lmdb", "./shard-00000.lmdb", "shard-00000.lmdb/..", "..\\shard-00000.lmdb",
    "shard-00000.lmdb\x00.txt", "", "shard-00000.lmdb/",
])
def test_shard_paths_escaping_the_directory_are_refused(dataset, name):
    raw = load_manifest_json(dataset)
    raw["shards"][0]["file"] = name
    save_manifest_json(dataset, raw)
    refused(dataset, r"shards\[0\]: file .* points outside the dataset directory")


@pytest.mark.parametrize("name, match", [
    ("shard-00000.h5", "not the expected shard name"),  # an LMDB dataset's shard must be .lmdb
    ("shard-0.lmdb", "not the expected shard name"),
    ("data/shard-00000.lmdb", "not the expected shard name"),
    ("passwd", "not the expected shard name"),
])
def test_shard_names_must_be_the_expected_ones(dataset, name, match):
    raw = load_manifest_json(dataset)
    raw["shards"][0]["file"] = name
    save_manifest_json(dataset, raw)
    refused(dataset, match)


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "index/../../x.npy", "index/../label.npy"])
def test_index_paths_escaping_the_directory_are_refused(dataset, name):
    raw = load_manifest_json(dataset)
    raw["index"]["label"]["file"] = name
    save_manifest_json(dataset, raw)
    refused(dataset, r"index\['label'\]: file .* points outside the dataset directory")


@pytest.mark.parametrize("name", ["label.npy", "index/label.txt", "manifest.json"])
def test_index_files_must_be_npy_files_under_index(dataset, name):
    raw = load_manifest_json(dataset)
    raw["index"]["label"]["file"] = name
    save_manifest_json(dataset, raw)
    refused(dataset, "must be an .npy file under index/")


# --- missing manifests and directories ------------------------------------------------------------------

def test_a_missing_directory_or_manifest_is_not_found(tmp_path, dataset):
    with pytest.raises(DatasetNotFoundError, match="no such packed dataset"):
        PackedDataset(tmp_path / "nothing")
    (dataset / "manifest.json").unlink()
    with pytest.raises(DatasetNotFoundError, match="holds an unfinished pack .*not a finished dataset"):
        PackedDataset(dataset)
    with pytest.raises(FileNotFoundError):  # the builtin a caller catches
        read_manifest(dataset)
    (tmp_path / "file").write_text("{}")
    with pytest.raises(ManifestError, match="is a file"):
        read_manifest(tmp_path / "file")


# --- damaged or missing index columns -------------------------------------------------------------------

@pytest.mark.parametrize("column", ["label", "checksum", "path.offsets", "path.blob", "shard"])
def test_a_damaged_index_column_is_refused_on_open(dataset, column):
    path = dataset / "index" / f"{column}.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    refused(dataset, rf"{column}\.npy: index column '{column}' does not match the digest in the manifest")


@pytest.mark.parametrize("column", ["label", "offset", "path.blob"])
def test_a_missing_or_truncated_index_column_is_refused_on_open(dataset, column):
    path = dataset / "index" / f"{column}.npy"
    path.write_bytes(path.read_bytes()[:40])
    refused(dataset, "does not match the digest")
    path.unlink()
    refused(dataset, rf"{column}\.npy: index column '{column}' cannot be read \(No such file or directory\)")


def _replace_column(dataset, column: str, data: bytes, dtype: str | None = None) -> None:
    """Rewrite a column and its manifest digest consistently (the hostile case digests cannot catch)."""
    (dataset / "index" / f"{column}.npy").write_bytes(data)
    raw = load_manifest_json(dataset)
    raw["index"][column]["digest"] = file_digest(data)
    if dtype is not None:
        raw["index"][column]["dtype"] = dtype
    save_manifest_json(dataset, raw)


def _npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=allow_pickle)
    return buf.getvalue()


def test_a_pickled_index_column_is_never_loaded(dataset):
    n = read_manifest(dataset).num_records
    _replace_column(dataset, "label", _npy(np.array([0] * n, dtype=object), allow_pickle=True), "object")
    refused(dataset, r"label\.npy: not a valid \.npy file")


def test_an_index_column_that_is_not_npy_is_refused(dataset):
    _replace_column(dataset, "size", b"PK\x03\x04 a zip file, not an array")
    refused(dataset, r"size\.npy: not a valid \.npy file")


@pytest.mark.parametrize("column, array, match", [
    ("label", lambda n: np.zeros(n, dtype=np.float32), r"expected a 1-D int64 column, found 1-D float32"),
    ("label", lambda n: np.zeros((n, 1), dtype=np.int64), r"expected a 1-D int64 column, found 2-D"),
    ("label", lambda n: np.zeros(n - 1, dtype=np.int64), r"has \d+ entries, expected \d+"),
    ("label", lambda n: np.full(n, 3, dtype=np.int64), "has label 3, outside the class list"),
    ("label", lambda n: np.full(n, -2, dtype=np.int64), "has label -2, outside the class list"),
    ("shard", lambda n: np.full(n, 99, dtype=np.int32), "shard numbers outside"),
    ("offset", lambda n: np.full(n, 10**9, dtype=np.int64), "record 0 points outside shard shard-00000"),
    ("size", lambda n: np.full(n, -1, dtype=np.int64), "record 0 points outside shard"),
    ("position", lambda n: np.arange(n, dtype=np.int64) + 1000, "record 0 points outside shard"),
])
def test_consistent_but_wrong_index_columns_are_refused(dataset, column, array, match):
    n = read_manifest(dataset).num_records
    _replace_column(dataset, column, _npy(array(n)))
    refused(dataset, match)


def test_string_offsets_outside_the_blob_are_refused(dataset):
    n = read_manifest(dataset).num_records
    offsets, _ = encode_strings(["x" * 1000] * n)
    _replace_column(dataset, "path.offsets", _npy(offsets))
    refused(dataset, "offsets are not monotonic within the blob")


def test_a_file_field_pointing_outside_its_shard_is_refused(tmp_path):
    """A file field's places are checked as the records' own are, naming the field."""
    from fastload.converters import pack
    from tests.conftest import make_jpeg, make_png

    (tmp_path / "a.jpg").write_bytes(make_jpeg(32, 24))
    (tmp_path / "a.png").write_bytes(make_png(32, 24))
    (tmp_path / "list.csv").write_text("path,second\na.jpg,a.png\n")
    pack(tmp_path / "list.csv", tmp_path / "d.fl", file_columns=("second",), progress=False)
    _replace_column(tmp_path / "d.fl", "field.second.position", _npy(np.array([2], dtype=np.int64)))
    refused(tmp_path / "d.fl", r"record 0 field 'second' points outside shard shard-00000.lmdb \(position 2")
    _replace_column(tmp_path / "d.fl", "field.second.offset", _npy(np.array([0.5])), "float64")
    refused(tmp_path / "d.fl", r"column 'field.second.offset' is float64, expected int64")
