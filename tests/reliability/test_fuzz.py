"""Property-based fuzzing (hypothesis) of everything a dataset directory feeds the reader: the
manifest, the index columns, the shard bytes and the record bytes given to the decoder. The only
failures allowed are our documented errors (FastloadError subclasses); never another exception,
a crashed process, or a record read back different from what was packed.

Each property runs a few dozen examples in the default suite and many more with `make test-all`.
"""

from __future__ import annotations

import copy
import io
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload
from fastload.decode.crops import decode_crop
from fastload.decode.images import decode_rgb, image_size
from fastload.errors import CorruptRecordError, FastloadError, ManifestError
from fastload.format import file_digest, parse_manifest, read_manifest
from fastload.decode.transforms import EvalCrop, TrainCrop
from tests.conftest import load_manifest_json, make_jpeg, make_png, save_manifest_json

from .conftest import in_child

DEPTH = [pytest.param(40, id="quick"), pytest.param(400, id="deep", marks=pytest.mark.reliability)]


def run(examples: int):
    """Hypothesis settings for one property: no example database, no deadline (a loaded machine)."""
    return settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def sound(id_set) -> dict:
    """The lmdb and hdf5 id datasets, their manifests as JSON and every record's bytes."""
    out = {}
    for storage in ("lmdb", "hdf5"):
        path = id_set(storage)
        ds = fastload.PackedDataset(path)
        out[storage] = {"path": path, "raw": load_manifest_json(path),
                        "records": [ds.record(i)["data"] for i in range(len(ds))],
                        "labels": ds.targets.tolist()}
    return out


def copy_of(path: Path) -> Path:
    return Path(shutil.copytree(path, Path(tempfile.mkdtemp(prefix="fastload-fuzz-")) / "ds"))


def read_all(dataset: Path) -> tuple[str, object, object]:
    """Open and read every record: ``("open", error, None)`` when opening is refused with one of
    our errors, else ``("read", documented errors met, [(bytes, label) or None per record])``."""
    try:
        ds = fastload.PackedDataset(dataset)
    except FastloadError as exc:
        return "open", type(exc).__name__, None
    records, errors = [], set()
    for i in range(len(ds)):
        try:
            records.append((ds.record(i)["data"], int(ds.targets[i])))
        except (CorruptRecordError, ManifestError) as exc:
            errors.add(type(exc).__name__)
            records.append(None)
    return "read", sorted(errors), records


def read_in_child(dataset: Path) -> tuple[str, object, object]:
    """:func:`read_all` in a child process: a crash there fails the property instead of the run."""
    return in_child(read_all, dataset)  # type: ignore[return-value]


# --- the manifest ---------------------------------------------------------------------------------

SCALARS = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20)
JSON = st.recursive(SCALARS,
                    lambda inner: (st.lists(inner, max_size=4)
                                   | st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=10)


def _paths(value, prefix=()):
    """Every path into a JSON value (dict keys and list positions)."""
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for k, v in enumerate(value):
            yield from _paths(v, (*prefix, k))


@pytest.mark.parametrize("examples", DEPTH)
def test_manifest_parsing_fails_only_with_manifest_errors(sound, examples):
    raw = sound["lmdb"]["raw"]
    paths = [p for p in _paths(raw) if p]

    @run(examples)
    @given(st.sampled_from(paths), JSON, st.booleans())
    def replace_or_delete(path, value, delete):
        doc = copy.deepcopy(raw)
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if delete and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
        try:
            parse_manifest(json.dumps(doc), "manifest.json")
        except ManifestError:
            pass

    @run(examples)
    @given(st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")))
    def any_text(text):
        try:
            parse_manifest(text, "manifest.json")
        except ManifestError:
            pass

    replace_or_delete()
    any_text()


@pytest.mark.parametrize("examples", DEPTH)
def test_a_manifest_byte_changed_is_refused_or_harmless(sound, examples):
    """Any one byte of manifest.json changed: refused at open, or every record still reads back
    with its bytes and label (a change in free text, such as the creation date, is harmless)."""
    base = sound["lmdb"]
    text = (base["path"] / "manifest.json").read_bytes()
    expected = list(zip(base["records"], base["labels"]))

    @run(max(10, examples // 4))
    @given(st.integers(0, len(text) - 1), st.integers(1, 255))
    def flip(at, xor):
        dataset = copy_of(base["path"])
        try:
            data = bytearray(text)
            data[at] ^= xor
            (dataset / "manifest.json").write_bytes(bytes(data))
            stage, errors, records = read_in_child(dataset)
            if stage == "read":
                assert not errors and records == expected, (at, xor, chr(text[at]))
        finally:
            shutil.rmtree(dataset.parent)

    flip()


# --- the index columns ----------------------------------------------------------------------------

COLUMNS = ["label", "shard", "position", "offset", "size", "checksum", "width", "height",
           "path.offsets", "path.blob"]
DTYPES = ["int64", "int32", "uint64", "uint8", "float64", "int8", "bool", "<U3", "object"]


@st.composite
def arrays(draw, n: int):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.sampled_from([(n,), (n + 1,), (n - 1,), (0,), (n, 2), ()]))
    size = int(np.prod(shape)) if shape else 1
    if dtype == "object":
        values = np.array(draw(st.lists(st.integers(), min_size=size, max_size=size)), dtype=object)
    elif dtype.startswith("<U"):
        values = np.array(draw(st.lists(st.text(max_size=3), min_size=size, max_size=size)), dtype=dtype)
    else:
        info = np.iinfo(dtype) if dtype not in ("float64", "bool") else None
        elements = (st.floats(allow_nan=True) if dtype == "float64" else st.booleans() if dtype == "bool"
                    else st.integers(int(info.min), int(info.max)) | st.integers(-2, n + 2).filter(
                        lambda v: info.min <= v <= info.max))
        values = np.array(draw(st.lists(elements, min_size=size, max_size=size)), dtype=dtype)
    return values.reshape(shape)


@pytest.mark.parametrize("examples", DEPTH)
def test_hostile_index_columns_fail_only_with_our_errors(sound, examples):
    """A column replaced by any array, with the manifest's digest and dtype made to match (what a
    careless or hostile tool could write): refused at open, or every read is a documented error or
    the right bytes for whatever record the index now points to. Never a crash or another error."""
    base = sound["lmdb"]
    n = len(base["records"])

    @run(max(10, examples // 2))
    @given(st.sampled_from(COLUMNS), arrays(n), st.booleans())
    def replace(column, array, claim_expected_dtype):
        dataset = copy_of(base["path"])
        try:
            buf = io.BytesIO()
            np.save(buf, array, allow_pickle=True)
            (dataset / "index" / f"{column}.npy").write_bytes(buf.getvalue())
            raw = load_manifest_json(dataset)
            raw["index"][column]["digest"] = file_digest(buf.getvalue())
            if not claim_expected_dtype:
                raw["index"][column]["dtype"] = str(array.dtype)
            save_manifest_json(dataset, raw)
            stage, errors, records = read_in_child(dataset)
            if stage == "read":  # any record read is one of the packed payloads
                assert all(r is None or r[0] in base["records"] for r in records)
        finally:
            shutil.rmtree(dataset.parent)

    replace()


@pytest.mark.parametrize("examples", DEPTH)
def test_damaged_index_files_are_refused_at_open(sound, examples):
    """Index bytes changed, cut or extended (their digests not updated): always a ManifestError."""
    base = sound["hdf5"]
    manifest = read_manifest(base["path"])
    files = sorted(entry.file for entry in manifest.index.values())

    @run(examples)
    @given(st.sampled_from(files), st.integers(0, 10**6), st.integers(1, 255),
           st.sampled_from(["flip", "cut", "extend"]))
    def damage(name, at, xor, how):
        dataset = copy_of(base["path"])
        try:
            data = bytearray((dataset / name).read_bytes())
            if how == "flip":
                data[at % len(data)] ^= xor
            elif how == "cut":
                del data[at % len(data):]
            else:
                data += bytes([xor]) * (1 + at % 64)
            (dataset / name).write_bytes(bytes(data))
            with pytest.raises(ManifestError, match=name.replace(".", r"\.")):
                fastload.PackedDataset(dataset)
        finally:
            shutil.rmtree(dataset.parent)

    damage()


# --- shard bytes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("examples", DEPTH)
@pytest.mark.parametrize("storage", ["lmdb", "hdf5"])
def test_shard_bytes_changed_in_place_never_read_back_wrong(sound, storage, examples):
    """Up to 8 bytes of a shard file changed anywhere (B-tree pages, HDF5 headers, payloads):
    every record reads back exactly as packed or raises a documented error; the process survives."""
    base = sound[storage]
    shards = [s["file"] for s in base["raw"]["shards"]]
    expected = list(zip(base["records"], base["labels"]))

    @run(max(10, examples // 2))
    @given(st.sampled_from(shards), st.lists(st.tuples(st.integers(0, 10**7), st.integers(1, 255)),
                                            min_size=1, max_size=8))
    def change(name, edits):
        dataset = copy_of(base["path"])
        try:
            data = bytearray((dataset / name).read_bytes())
            for at, xor in edits:
                data[at % len(data)] ^= xor
            (dataset / name).write_bytes(bytes(data))
            try:
                stage, errors, records = read_in_child(dataset)
            except AssertionError as exc:
                raise AssertionError(f"{name} with bytes changed {edits} (offset, xor): {exc}") from None
            assert stage == "read", (stage, errors)  # same size: opening cannot tell
            assert all(r is None or r == e for r, e in zip(records, expected))
        finally:
            shutil.rmtree(dataset.parent)

    change()


# --- record bytes given to the decoder ------------------------------------------------------------

SEEDS = [make_jpeg(64, 48, seed=3), make_png(40, 30, seed=4), make_jpeg(300, 200, seed=5, quality=70)]


@st.composite
def mutated(draw):
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(0, 6))):
        how = draw(st.sampled_from(["flip", "cut", "insert", "zero"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if how == "flip" and data:
            data[at] ^= draw(st.integers(1, 255))
        elif how == "cut":
            del data[at:at + draw(st.integers(1, 400))]
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif data:
            data[at:at + 64] = bytes(len(data[at:at + 64]))
    return bytes(data)


@pytest.mark.parametrize("examples", DEPTH)
def test_decoding_damaged_bytes_fails_only_with_corrupt_record_error(examples):
    plans = [EvalCrop(24).sample(64, 48), TrainCrop(16).sample(300, 200, np.random.default_rng(0))]

    @run(examples * 3)
    @given(mutated() | st.binary(max_size=200), st.sampled_from(plans))
    def decode(data, plan):
        for call in (lambda: decode_rgb(data, where="r"), lambda: image_size(data, where="r"),
                     lambda: decode_crop(data, plan, where="r")):
            try:
                call()
            except CorruptRecordError as exc:
                assert str(exc).startswith("r: ")

    decode()
