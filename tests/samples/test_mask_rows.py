"""Masks stored as rows (issue 27, item 4): a segmentation list, tars and the Writer packed with
masks as rows (the default) and as their PNG files give the same batches pixel for pixel, 8- and
16-bit, through random crops, eval crops and no crop; datasets of PNG masks still read; record()
gives an image file of the values; a damaged stored mask is named."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pytest
import torch
from fastload.converters import pack
from fastload.converters.packing.mask_rows import mask_rows
from PIL import Image

import fastload
from fastload.cli import main as cli
from fastload.decode.transforms import CropPlan
from fastload.errors import CorruptRecordError
from fastload.format.mask_rows import HEADER
from fastload.samples.file_fields import decode_file_field
from tests.decode.test_boxes import picture

N, SIZE, SEED = 12, 40, 3
FIELDS = ("image", "label", "mask", "deep")


def png(values: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(values).save(out, format="PNG")
    return out.getvalue()


def sample(rng: np.random.Generator) -> tuple[bytes, np.ndarray, np.ndarray]:
    """A photo-sized picture, its class-id mask (shapes of ids on 0) and a noisy 16-bit map."""
    width, height = int(rng.integers(50, 130)), int(rng.integers(50, 130))
    mask = np.zeros((height, width), dtype=np.uint8)
    for _ in range(4):
        x0, y0 = int(rng.integers(0, width - 10)), int(rng.integers(0, height - 10))
        mask[y0:y0 + int(rng.integers(5, 40)), x0:x0 + int(rng.integers(5, 40))] = int(rng.integers(1, 255))
    deep = rng.integers(0, 2**16, (height, width)).astype(np.uint16)  # noise: stored as raw rows
    deep[: height // 2] = 40000  # and a run-length half
    return picture(width, height, [2, 2, width // 2, height // 2]), mask, deep


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("mask_rows")
    rng = np.random.default_rng(7)
    rows, arrays = [], []
    for i in range(N):
        image, mask, deep = sample(rng)
        (root / f"{i}.png").write_bytes(image)
        (root / f"{i}.m.png").write_bytes(png(mask))
        (root / f"{i}.d.png").write_bytes(png(deep))
        rows.append({"path": f"{i}.png", "label": i % 3, "mask": f"{i}.m.png", "deep": f"{i}.d.png"})
        arrays.append((image, mask, deep))
    (root / "list.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pack(root / "list.jsonl", root / "rows.fl", file_columns=("mask", "deep"), progress=False)
    pack(root / "list.jsonl", root / "png.fl", file_columns=("mask", "deep"), mask_storage="file", progress=False)
    return root, arrays


def batches(path, train=True, size=SIZE, **kw):
    ds = fastload.PackedDataset(path, image_size=size, train=train, fields=FIELDS)
    loader = fastload.DataLoader(ds, batch_size=5, shuffle=True, seed=SEED, **kw)
    return [dict(b) for _ in range(2) for b in loader]  # two epochs: two draws of crops


def same(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for name in FIELDS:
            assert x[name].dtype == y[name].dtype and torch.equal(x[name], y[name]), name


def test_rows_give_the_png_masks_batches_pixel_for_pixel(packed):
    root, arrays = packed
    rows, pngs = fastload.PackedDataset(root / "rows.fl"), fastload.PackedDataset(root / "png.fl")
    assert rows.manifest.fields == {"mask": "mask-rows", "deep": "mask-rows"}
    assert pngs.manifest.fields == {"mask": "mask", "deep": "mask"}  # as every older pack wrote them
    train = batches(root / "rows.fl")
    same(train, batches(root / "png.fl"))
    assert train[0]["mask"].dtype == torch.uint8 and train[0]["deep"].dtype == torch.int32
    assert len({int(v) for b in train for v in b["mask"].unique()}) > 3  # class ids, not only background
    same(batches(root / "rows.fl", train=False), batches(root / "png.fl", train=False))
    same(batches(root / "rows.fl", num_workers=2), train)  # in worker processes too
    for i in (0, 5):  # no crop: the whole mask as stored
        _, mask, deep = arrays[i]
        whole = fastload.PackedDataset(root / "rows.fl", fields=("mask", "deep"))[i]
        assert np.array_equal(whole["mask"].numpy(), mask) and np.array_equal(whole["deep"].numpy(), deep)


def test_a_crop_decodes_the_same_values_for_any_plan():
    rng = np.random.default_rng(1)
    _, mask, deep = sample(rng)
    for values in (mask, deep, mask[:, :1], np.full((9, 70000), 3, dtype=np.uint8)):  # a long row: 4-byte runs
        height, width = values.shape
        stored, file = mask_rows(values), png(values)
        for _ in range(20):
            w, h = rng.uniform(0.5, width), rng.uniform(0.5, height)
            plan = CropPlan((rng.uniform(0, width - w), rng.uniform(0, height - h), w, h),
                            (int(rng.integers(1, 60)), int(rng.integers(1, 60))), bool(rng.integers(2)))
            got = decode_file_field("mask-rows", stored, plan, where="x", max_pixels=10**9)
            assert torch.equal(got, decode_file_field("mask", file, plan, where="x", max_pixels=10**9))


def test_record_verify_and_info_of_a_rows_dataset(packed, capsys):
    root, arrays = packed
    record = fastload.PackedDataset(root / "rows.fl").record(4)
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(record["mask"]))), arrays[4][1])  # a PNG of the ids
    deep = Image.open(io.BytesIO(record["deep"]))
    assert deep.mode == "I;16" and np.array_equal(np.asarray(deep), arrays[4][2])
    assert fastload.PackedDataset(root / "png.fl").record(4)["mask"] == png(arrays[4][1])  # as packed
    assert fastload.verify(root / "rows.fl", decode=True).ok
    assert cli(["info", str(root / "rows.fl")]) == 0
    assert "mask-rows" in capsys.readouterr().out


def test_a_damaged_stored_mask_is_named(packed, tmp_path):
    root, _ = packed
    pack(root / "list.jsonl", tmp_path / "d.fl", file_columns=("mask",), format="hdf5", progress=False)
    ds = fastload.PackedDataset(tmp_path / "d.fl")
    start = ds.manifest.shards[0].data_offset + int(ds.index.files["mask"].offset[6])
    with open(tmp_path / "d.fl" / "shard-00000.h5", "r+b") as f:
        f.seek(start + HEADER.size + 3)
        f.write(b"\xff\xff")
    with pytest.raises(CorruptRecordError, match=r"record 6 \(6.png\) field 'mask': checksum mismatch"):
        fastload.PackedDataset(tmp_path / "d.fl", image_size=SIZE, train=True, fields=("mask",))[6]
    report = fastload.verify(tmp_path / "d.fl")
    assert [(bad.record, bad.field) for bad in report.bad] == [(6, "mask")]
    stored = mask_rows(np.zeros((5, 60), dtype=np.uint8))  # 5 runs, one a row
    lengths = HEADER.size + 4 * 6
    plan = CropPlan((0, 0, 60, 5), (4, 4))
    for bad, problem in ((stored[:-1], "bytes"), (stored[:4] + b"\x09" + stored[5:], "not a stored mask of version"),
                         (stored[:lengths] + b"\0" * 10 + stored[lengths + 10:], "rows 0..4 are not 60 pixels")):
        with pytest.raises(CorruptRecordError, match=f"record 3 field 'mask': .*{problem}.*re-pack"):
            decode_file_field("mask-rows", bad, plan, where="record 3 field 'mask'", max_pixels=10**6)
    with pytest.raises(CorruptRecordError, match="over the limit of 20"):
        decode_file_field("mask-rows", stored, plan, where="record 3", max_pixels=20)


def test_tars_and_sidecar_folders_store_masks_as_rows(packed, tmp_path):
    _, arrays = packed
    with tarfile.open(tmp_path / "data-0.tar", "w") as archive:
        for i, (image, mask, _) in enumerate(arrays):
            for name, data in ((f"{i:04d}.jpg", image), (f"{i:04d}.png", png(mask)), (f"{i:04d}.cls", b"1")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    pack(tmp_path / "data-0.tar", tmp_path / "tar.fl", progress=False)
    (tmp_path / "folder").mkdir()
    for i, (image, mask, _) in enumerate(arrays):
        (tmp_path / "folder" / f"{i:04d}.jpg").write_bytes(image)  # a PNG's bytes: the image by name
        (tmp_path / "folder" / f"{i:04d}.png").write_bytes(png(mask))
    assert cli(["pack", str(tmp_path / "folder"), "-o", str(tmp_path / "side.fl"), "--sidecars", "--quiet",
                "--sidecar-names", "png=mask", "--mask-storage", "file"]) == 0
    tar, side = fastload.PackedDataset(tmp_path / "tar.fl"), fastload.PackedDataset(tmp_path / "side.fl")
    assert tar.manifest.fields["png"] == "mask-rows" and side.manifest.fields["mask"] == "mask"
    for i in (0, 7):
        tar_mask = tar.__class__(tmp_path / "tar.fl", fields=("png",))[i]["png"]
        side_mask = side.__class__(tmp_path / "side.fl", fields=("mask",))[i]["mask"]
        assert np.array_equal(tar_mask.numpy(), arrays[i][1]) and torch.equal(tar_mask, side_mask)


def test_the_writer_stores_mask_arrays_as_rows(packed, tmp_path):
    _, arrays = packed
    for storage in ("rows", "file"):
        with fastload.Writer(tmp_path / f"{storage}.fl", mask_storage=storage) as writer:
            for i, (image, mask, deep) in enumerate(arrays):
                writer.write({"image": image, "label": i % 3, "mask": mask,
                              "deep": Image.fromarray(deep) if i % 2 else png(deep)})
    rows = fastload.PackedDataset(tmp_path / "rows.fl")
    assert rows.manifest.fields == {"mask": "mask-rows", "deep": "mask-rows"}
    assert fastload.PackedDataset(tmp_path / "file.fl").manifest.fields == {"mask": "mask", "deep": "mask"}
    same(batches(tmp_path / "rows.fl"), batches(tmp_path / "file.fl"))
    stored = rows.reader.read(2, "mask")
    assert len(stored) < arrays[2][1].size  # runs, not every pixel
    with pytest.raises(ValueError, match="mask_storage='png': choose 'rows'"):
        fastload.Writer(tmp_path / "x.fl", mask_storage="png")
    with pytest.raises(fastload.errors.SourceError, match=r"field 'mask' \(mask-rows\) is 3x2, its image is"), \
            fastload.Writer(tmp_path / "bad.fl") as writer:
        writer.write({"image": arrays[0][0], "mask": np.zeros((2, 3), dtype=np.uint8)})
