"""`pack --restart-markers`: JPEGs rewritten losslessly, everything else copied, nothing lost."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastload.converters import pack
from fastload import DataLoader, PackedDataset
from fastload.decode.crops import REGION_DECODE
from fastload.format import read_manifest
from fastload.verifier import verify
from tests.conftest import make_png, write_tree
from tests.converters.test_pack import STORAGES, records
from tests.decode.test_decode import encode, photo
from tests.decode.test_jpeg_restarts import layout, rgb

pytestmark = pytest.mark.skipif(not REGION_DECODE, reason="fastload.decode._jpeg_region is not built")


def damaged_scan(jpeg: bytes) -> bytes:
    """Scan data cut short inside a complete file: Pillow loads it (grey blocks), libjpeg warns."""
    start = jpeg.index(b"\xff\xda")
    return jpeg[:start + (len(jpeg) - start) // 2] + b"\xff\xd9"


@pytest.fixture
def source(tmp_path):
    files = {f"{c}/{i}.jpg": encode(photo(200 + 40 * i, 150 + 16 * i, seed=i), quality=90)
             for i, c in enumerate("aabbcc")}
    files["a/grey.jpg"] = encode(photo(120, 90, seed=9).convert("L"), quality=85)
    files["b/progressive.jpg"] = encode(photo(160, 120, seed=10), quality=85, progressive=True)
    files["c/picture.png"] = make_png(64, 48, seed=3)
    files["c/damaged.jpg"] = damaged_scan(encode(photo(180, 140, seed=11), quality=90))
    write_tree(tmp_path / "src", files)
    return tmp_path / "src", files


@pytest.mark.parametrize("storage", STORAGES)
def test_jpegs_are_rewritten_with_the_same_pixels_and_the_rest_copied(tmp_path, source, storage):
    src, files = source
    report = pack(src, tmp_path / "out", format=storage, restart_markers=True, progress=False)
    assert report.num_records == len(files) and report.skipped == 0
    got = {r["path"]: r["data"] for r in records(tmp_path / "out")}
    for path, data in files.items():
        if path.endswith(".png") or path == "c/damaged.jpg":
            assert got[path] == data, path  # byte for byte
            continue
        assert got[path] != data and np.array_equal(rgb(got[path]), rgb(data)), path
        per_row, _, interval = layout(got[path])
        assert interval > 0 and per_row % interval == 0, path
    assert verify(tmp_path / "out", decode=True).ok


def test_a_jpeg_libjpeg_cannot_rewrite_is_kept_counted_and_named(tmp_path, source, cli):
    src, files = source
    result = cli("pack", src, "-o", tmp_path / "out", "--restart-markers", "--quiet")
    assert result.rc == 0
    assert ("1 JPEGs packed without restart markers, as they were (they load, without the faster "
            "crop decode; first: c/damaged.jpg: libjpeg: Corrupt JPEG data") in result.out
    assert read_manifest(tmp_path / "out").packed["restart_markers"] == {"kept_as_is": 1}
    info = cli("info", tmp_path / "out")
    assert "JPEGs rewritten losslessly with restart markers (fast crop decode); 1 kept as they were" \
        in info.out


def test_a_plain_pack_records_no_rewrite(tmp_path, source, cli):
    src, _ = source
    pack(src, tmp_path / "out", progress=False)
    assert read_manifest(tmp_path / "out").packed["restart_markers"] is None
    assert "restart markers" not in cli("info", tmp_path / "out").out


@pytest.mark.parametrize("num_workers", [0, 2])
def test_training_batches_are_the_same_from_either_pack(tmp_path, source, num_workers):
    src, _ = source
    pack(src, tmp_path / "plain", progress=False)
    pack(src, tmp_path / "restarts", restart_markers=True, progress=False)

    def batches(path):
        ds = PackedDataset(path, image_size=64, train=True)
        loader = DataLoader(ds, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5),
                            num_workers=num_workers)
        return [(images.clone(), labels.clone()) for images, labels in loader]

    for (a, la), (b, lb) in zip(batches(tmp_path / "plain"), batches(tmp_path / "restarts"),
                                strict=True):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_the_option_and_its_source_are_part_of_what_a_resume_trusts(tmp_path, source):
    """Shards packed without restart markers are not reused by a pack that asks for them."""
    src, _ = source
    out = tmp_path / "out"
    pack(src, out, progress=False)
    report = pack(src, out, restart_markers=True, overwrite=True, progress=False)
    assert report.resumed_shards == 0
    assert read_manifest(out).packed["restart_markers"] == {"kept_as_is": 1}
