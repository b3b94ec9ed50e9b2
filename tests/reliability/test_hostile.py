"""Hostile input: nothing in a dataset is executed (no pickle is read anywhere), and oversized
images (decompression bombs) are refused at read time with an error naming the record.

(Shard and index paths escaping the directory: tests/format/test_manifest.py; bombs at pack time:
tests/converters/test_bad_inputs.py.)
"""

from __future__ import annotations

import ast
import io
import shutil
import struct
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.errors import CorruptRecordError, ManifestError, SkippedRecordWarning
from fastload.format import file_digest
from tests.conftest import REPO, load_manifest_json, make_jpeg, save_manifest_json, write_tree

from .conftest import shard_of

PACKAGES = ["fastload", "converters"]
# Calls that can run code from the bytes they read.
UNSAFE_CALLS = {("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"), ("marshal", "load"),
                ("marshal", "loads"), ("shelve", "open"), ("dill", "load"), ("dill", "loads"),
                ("cloudpickle", "load"), ("cloudpickle", "loads"), ("joblib", "load"), ("torch", "load"),
                ("yaml", "load"), ("yaml", "unsafe_load")}
UNSAFE_MODULES = {"pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib", "_pickle"}


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                yield node, ast.unparse(func.value), func.attr
            elif isinstance(func, ast.Name):
                yield node, "", func.id


def unsafe_calls(source: str, where: str) -> list[str]:
    """A grep with a parser: calls that unpickle, NumPy loads that may, eval/exec, pickle imports."""
    problems = []
    tree = ast.parse(source, where)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if any(str(n).split(".")[0] in UNSAFE_MODULES for n in names):
                problems.append(f"{where}:{node.lineno}: imports {names}")
    for node, owner, name in _calls(tree):
        module = owner.split(".")[-1]
        keywords = {k.arg: ast.unparse(k.value) for k in node.keywords}
        if (module, name) in UNSAFE_CALLS or (module in ("np", "numpy") and name == "load"):
            problems.append(f"{where}:{node.lineno}: {owner}.{name}(...)")
        elif name in ("read_array", "save", "load") and owner.endswith(("np", "numpy", "format")) \
                and keywords.get("allow_pickle") != "False":
            problems.append(f"{where}:{node.lineno}: {owner}.{name} without allow_pickle=False")
        elif owner == "" and name in ("eval", "exec", "__import__"):
            problems.append(f"{where}:{node.lineno}: {name}(...)")
    return problems


def test_the_check_finds_what_it_looks_for():
    snippet = """
import pickle
from joblib import load
np.load(path)
numpy.load(path, allow_pickle=False)
np.lib.format.read_array(f)
np.save(buf, a)
torch.load(f)
eval(text)
# pickle.loads(b) in a comment is fine
"""
    found = unsafe_calls(snippet, "x.py")
    assert [line.split(":")[1] for line in found] == ["2", "3", "4", "5", "6", "7", "8", "9"], found


def test_no_pickle_is_read_anywhere_in_the_package():
    sources = [p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))]
    assert len(sources) > 20
    problems = [line for path in sources for line in unsafe_calls(path.read_text(), str(path.relative_to(REPO)))]
    assert not problems, "\n".join(problems)


class _Payload:
    """What a hostile pickle would run: it leaves a file behind."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "the pickle ran"))


def test_a_pickle_planted_in_an_index_column_is_never_run(id_set, tmp_path):
    """An object-dtype .npy holding a pickle whose loading would write a file, with the manifest's
    digest and dtype updated to match (as an attacker would): refused, and the file never appears."""
    dataset = shutil.copytree(id_set(), tmp_path / "ds")
    marker = tmp_path / "pwned"
    n = len(np.load(dataset / "index" / "label.npy", allow_pickle=False))
    column = np.empty(n, dtype=object)
    column[:] = [_Payload(marker)] * n
    buf = io.BytesIO()
    np.save(buf, column, allow_pickle=True)
    (dataset / "index" / "label.npy").write_bytes(buf.getvalue())
    raw = load_manifest_json(dataset)
    raw["index"]["label"].update(digest=file_digest(buf.getvalue()), dtype="object")
    save_manifest_json(dataset, raw)
    refused = r"label\.npy: not a valid \.npy file \(Object arrays cannot be loaded"
    with pytest.raises(ManifestError, match=refused):
        fastload.PackedDataset(dataset)
    assert not marker.exists()
    with pytest.raises(ManifestError):  # verify reads the same index: refused the same way
        fastload.verify(dataset)
    assert not marker.exists()


# --- decompression bombs at read time -----------------------------------------------------------------

def png_header(width: int, height: int) -> bytes:
    """A complete, tiny PNG (IHDR, a little IDAT, IEND) that declares ``width`` x ``height`` pixels."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
            + chunk(b"IEND", b""))


@pytest.fixture
def bomb_dataset(tmp_path, monkeypatch) -> Path:
    """A dataset holding a 40000x40000 PNG of a few hundred bytes among ordinary JPEGs, packed as a
    hostile tool would (pack's own bomb checks turned off)."""
    from fastload.converters import pack

    write_tree(tmp_path / "src", {"a.jpg": make_jpeg(seed=1), "b.png": png_header(40_000, 40_000),
                                  "c.jpg": make_jpeg(seed=2)})
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    pack(tmp_path / "src", tmp_path / "ds", max_pixels=10**12, progress=False)
    monkeypatch.undo()
    assert Image.MAX_IMAGE_PIXELS is not None
    return tmp_path / "ds"


@pytest.mark.parametrize("image_size", [None, 32])
def test_a_decompression_bomb_is_refused_at_read_time(bomb_dataset, image_size):
    ds = fastload.PackedDataset(bomb_dataset, image_size=image_size, train=True)
    assert ds.record(1)["width"] == 40_000  # packed, and the header says so
    with pytest.raises(CorruptRecordError) as info:
        ds[1]
    message = str(info.value)
    assert message.startswith(f"{shard_of(bomb_dataset, 1)} record 1 (b.png): ")
    assert "decompression bomb" in message
    assert ds[0] and ds[2]


def test_max_pixels_refuses_big_images_and_skip_counts_them(tmp_path):
    from fastload.converters import pack

    write_tree(tmp_path / "src", {"big.jpg": make_jpeg(400, 300, seed=1),
                                  "small.jpg": make_jpeg(40, 30, seed=2)})
    pack(tmp_path / "src", tmp_path / "ds", progress=False)
    ds = fastload.PackedDataset(tmp_path / "ds", image_size=16, train=True, max_pixels=50_000)
    with pytest.raises(CorruptRecordError, match=r"record 0 \(big.jpg\): 400x300 = 120000 pixels is over the "
                                                 r"limit of 50000 .*raise max_pixels if you trust this data"):
        ds[0]
    skipping = fastload.PackedDataset(tmp_path / "ds", image_size=16, train=True, max_pixels=50_000, on_error="skip")
    loader = fastload.DataLoader(skipping, batch_size=2, num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedRecordWarning)
        (images, labels), = list(loader)
    assert images.shape == (1, 3, 16, 16) and loader.stats()["skipped"] == 1


def test_an_index_that_says_an_image_is_bigger_than_it_is_is_refused(id_set, tmp_path):
    """Crop boxes are planned from the index's width and height: if they do not describe the
    bytes (a rewritten index, digests recomputed), the record is refused, not cropped out of range."""
    dataset = shutil.copytree(id_set(), tmp_path / "ds")
    n = len(fastload.PackedDataset(dataset))
    for column in ("width", "height"):
        buf = io.BytesIO()
        np.save(buf, np.full(n, 5000, dtype=np.int32), allow_pickle=False)
        (dataset / "index" / f"{column}.npy").write_bytes(buf.getvalue())
        raw = load_manifest_json(dataset)
        raw["index"][column]["digest"] = file_digest(buf.getvalue())
        save_manifest_json(dataset, raw)
    for train in (True, False):
        ds = fastload.PackedDataset(dataset, image_size=16, train=train)
        with pytest.raises(CorruptRecordError, match=r"record 3 \(img0003.jpg\): the JPEG is \d+x\d+, too "
                                                     r"small for the crop box .* the index does not match"):
            ds[3]
