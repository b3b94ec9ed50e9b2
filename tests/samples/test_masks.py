"""Masks and other file fields through the image's crop (issue 17): with RandomResizedCrop + flip
a sample's mask (and a depth map of its size) is cut, scaled and mirrored as its pixels are,
nearest-neighbour with its values kept, against a per-pixel reference from the crop plan and
against the pixels themselves; tuple samples; sample_transform sees the fields; damage is named."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload.converters import pack
from fastload.errors import CorruptRecordError
from tests.decode.test_boxes import picture

SEED, N, SIZE = 5, 16, 48


def scene(width: int, height: int, rect: list[int]) -> tuple[bytes, bytes, bytes]:
    """A black PNG with a red rectangle at ``rect``, its mask (1 there, 0 elsewhere, class 2 on a
    column stripe), and a float depth map whose value is the pixel's own source coordinates."""
    x0, y0, x1, y1 = rect
    mask = np.zeros((height, width), dtype=np.uint8)
    mask[y0:y1, x0:x1] = 1
    mask[:, width - 3:] = 2
    depth = (np.arange(height)[:, None] * 1000 + np.arange(width)[None, :]).astype(np.float64)
    mask_png, depth_npy = io.BytesIO(), io.BytesIO()
    Image.fromarray(mask).save(mask_png, format="PNG")
    np.save(depth_npy, depth)
    return picture(width, height, rect), mask_png.getvalue(), depth_npy.getvalue()


@pytest.fixture(scope="module")
def segmentation(tmp_path_factory):
    root = tmp_path_factory.mktemp("masks")
    rng = np.random.default_rng(1)
    rows = []
    for i in range(N):
        width, height = int(rng.integers(60, 140)), int(rng.integers(60, 140))
        x0, y0 = int(rng.integers(0, width - 30)), int(rng.integers(0, height - 30))
        rect = [x0, y0, int(rng.integers(x0 + 20, width)), int(rng.integers(y0 + 20, height))]
        image, mask, depth = scene(width, height, rect)
        (root / f"{i}.png").write_bytes(image)
        (root / f"{i}.mask.png").write_bytes(mask)
        (root / f"{i}.depth.npy").write_bytes(depth)
        rows.append({"path": f"{i}.png", "label": i % 4, "mask": f"{i}.mask.png", "depth": f"{i}.depth.npy",
                     "wh": [width, height]})
    (root / "list.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pack(root / "list.jsonl", root / "d.fl", file_columns=("mask", "depth"), progress=False)
    return root, rows


def reference(source: np.ndarray, plan) -> np.ndarray:
    """The output a crop plan makes of ``source`` with nearest neighbour, one pixel at a time: the
    output pixel (y, x) shows the source pixel under its centre, mirrored with a flip."""
    left, top, box_w, box_h = plan.box
    out_h, out_w = plan.out_size
    height, width = source.shape[:2]
    out = np.zeros((out_h, out_w, *source.shape[2:]), dtype=source.dtype)
    for y in range(out_h):
        sy = min(max(math.floor(top + (y + 0.5) * box_h / out_h), 0), height - 1)
        for x in range(out_w):
            sx = min(max(math.floor(left + (x + 0.5) * box_w / out_w), 0), width - 1)
            out[y, out_w - 1 - x if plan.flip else x] = source[sy, sx]
    return out


def dataset(path, **kw):
    return fastload.PackedDataset(path, image_size=SIZE, train=True, fields=("image", "label", "mask", "depth"), **kw)


def test_masks_and_depth_follow_the_crop_plan(segmentation):
    root, rows = segmentation
    ds = dataset(root / "d.fl")
    batches = fastload.DataLoader(ds, batch_size=5, shuffle=True, seed=SEED)
    flips = 0
    for epoch in range(2):
        got = [(m, d) for batch in batches for m, d in zip(batch["mask"], batch["depth"])]
        order = fastload.sampling.order.epoch_order(N, seed=SEED, epoch=epoch, shuffle=True).tolist()
        for i, (mask, depth) in zip(order, got):
            width, height = rows[i]["wh"]
            plan = ds.pipeline.plan(i, epoch, SEED, width, height)
            source = np.asarray(Image.open(root / rows[i]["mask"]))
            assert mask.dtype == torch.uint8 and mask.shape == (SIZE, SIZE)
            assert np.array_equal(mask.numpy(), reference(source, plan))
            assert depth.dtype == torch.float64
            assert np.array_equal(depth.numpy(), reference(np.load(root / rows[i]["depth"]), plan))
            flips += plan.flip
    assert 0 < flips < 2 * N  # both ways were drawn


def test_a_moved_mask_lies_on_its_red_pixels(segmentation):
    root, _ = segmentation
    checked = 0
    for batch in fastload.DataLoader(dataset(root / "d.fl"), batch_size=4, shuffle=True, seed=SEED):
        for image, mask in zip(batch["image"], batch["mask"]):
            red = (image[0] > 160) & (image[1] < 90) & (image[2] < 90)
            ones = mask == 1
            if int(ones.sum()) < 16:
                continue
            # Bilinear pixels and nearest labels may differ only along the rectangle's edge.
            assert int((red ^ ones).sum()) <= 2 * (SIZE + SIZE)
            assert int((red & ones).sum()) >= 0.5 * int(ones.sum())
            checked += 1
    assert checked > N // 3


def test_eval_crop_and_no_crop(segmentation):
    root, rows = segmentation
    ds = fastload.PackedDataset(root / "d.fl", image_size=SIZE, train=False, fields=("mask",))
    width, height = rows[3]["wh"]
    plan = ds.pipeline.plan(3, 0, 0, width, height)
    assert np.array_equal(ds[3]["mask"].numpy(), reference(np.asarray(Image.open(root / rows[3]["mask"])), plan))
    whole = fastload.PackedDataset(root / "d.fl", fields=("mask", "depth"))[3]  # no image_size: as stored
    assert np.array_equal(whole["mask"].numpy(), np.asarray(Image.open(root / rows[3]["mask"])))
    assert np.array_equal(whole["depth"].numpy(), np.load(root / rows[3]["depth"]))


def test_tuple_samples_in_the_order_asked(segmentation):
    root, _ = segmentation
    ds = fastload.PackedDataset(root / "d.fl", image_size=SIZE, train=False, fields=("mask", "label", "image"),
                                sample_as="tuple")
    mask, label, image = ds[2]
    assert mask.shape == (SIZE, SIZE) and label == 2 and image.shape == (3, SIZE, SIZE)
    batch = next(iter(fastload.DataLoader(ds, batch_size=4)))
    assert isinstance(batch, tuple) and [tuple(t.shape) for t in batch] == [(4, SIZE, SIZE), (4,), (4, 3, SIZE, SIZE)]
    with pytest.raises(ValueError, match="sample_as='list': must be 'dict' or 'tuple'"):
        fastload.PackedDataset(root / "d.fl", fields=("mask",), sample_as="list")
    with pytest.raises(ValueError, match="sample_as= are about samples with fields: pass fields= too"):
        fastload.PackedDataset(root / "d.fl", sample_as="tuple")


def flip_both(sample, generator):
    """A user's augmentation that must move the mask with the image: a vertical flip, half the time."""
    if torch.rand((), generator=generator) < 0.5:
        sample["image"] = sample["image"].flip(1)
        sample["mask"] = sample["mask"].flip(0)
    return sample


@pytest.mark.parametrize("workers", [0, 2])
def test_sample_transform_gets_the_fields_alike_for_any_worker_count(segmentation, workers):
    root, _ = segmentation
    plain = [dict(b) for b in fastload.DataLoader(dataset(root / "d.fl"), batch_size=4, shuffle=True, seed=SEED)]
    loader = fastload.DataLoader(dataset(root / "d.fl", sample_transform=flip_both), batch_size=4, shuffle=True,
                                 seed=SEED, num_workers=workers)
    flipped, masks = 0, []
    for before, after in zip(plain, loader):
        masks.append(after["mask"])
        for k in range(len(after["mask"])):
            same = torch.equal(before["mask"][k], after["mask"][k])
            assert same or torch.equal(before["mask"][k].flip(0), after["mask"][k])
            assert torch.equal(after["image"][k], before["image"][k] if same else before["image"][k].flip(1))
            flipped += not same
    assert flipped > 0
    again = [b["mask"] for b in fastload.DataLoader(dataset(root / "d.fl", sample_transform=flip_both),
                                                    batch_size=4, shuffle=True, seed=SEED)]
    assert len(again) == len(masks) and all(torch.equal(a, b) for a, b in zip(again, masks))  # 0 workers too


def test_a_damaged_mask_is_named_or_skipped(segmentation, tmp_path):
    root, _ = segmentation
    rows = [json.loads(line) for line in (root / "list.jsonl").read_text().splitlines()]
    (tmp_path / "list.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    for row in rows:
        for key in ("path", "mask", "depth"):
            (tmp_path / row[key]).write_bytes((root / row[key]).read_bytes())
    pack(tmp_path / "list.jsonl", tmp_path / "d.fl", file_columns=("mask",), format="hdf5", progress=False)
    ds = fastload.PackedDataset(tmp_path / "d.fl")
    start = ds.manifest.shards[0].data_offset + int(ds.index.files["mask"].offset[6])
    with open(tmp_path / "d.fl" / "shard-00000.h5", "r+b") as f:
        f.seek(start + 8)
        f.write(b"\0" * 8)  # the PNG's header chunk: the checksum fails first
    with pytest.raises(CorruptRecordError, match=r"record 6 \(6.png\) field 'mask': checksum mismatch"):
        fastload.PackedDataset(tmp_path / "d.fl", image_size=SIZE, train=True, fields=("mask",))[6]
    skipping = fastload.PackedDataset(tmp_path / "d.fl", image_size=SIZE, train=True, fields=("image", "mask"),
                                      on_error="skip")
    loader = fastload.DataLoader(skipping, batch_size=N, mode="threads")  # the warning in this process
    with pytest.warns(fastload.errors.SkippedRecordWarning, match="field 'mask'"):
        batch = next(iter(loader))
    assert batch["mask"].shape[0] == N - 1 and loader.stats()["skipped"] == 1
    whole = fastload.PackedDataset(tmp_path / "d.fl", fields=("image", "mask"), on_error="skip")  # no crop
    with pytest.warns(fastload.errors.SkippedRecordWarning, match="field 'mask'"):
        kept = whole.__getitems__(list(range(N)))
    assert len(kept) == N - 1 and kept.skipped == 1 and whole.skipped == 1


def test_mean_std_normalise_the_image_wherever_a_tuple_holds_it(segmentation):
    root, _ = segmentation
    ds = fastload.PackedDataset(root / "d.fl", image_size=SIZE, train=False, fields=("mask", "image"),
                                sample_as="tuple")
    raw = next(iter(fastload.DataLoader(ds, batch_size=4)))
    mask, image = next(iter(fastload.DataLoader(ds, batch_size=4, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))))
    assert torch.equal(mask, raw[0]) and image.dtype == torch.float32
    assert torch.allclose(image, (raw[1].float() / 255 - 0.5) / 0.25, atol=1e-5)
    no_image = fastload.PackedDataset(root / "d.fl", fields=("mask",), sample_as="tuple")
    with pytest.raises(ValueError, match="fields=\\('mask',\\) have no 'image'"):
        fastload.DataLoader(no_image, batch_size=4, mean=(0.5,) * 3, std=(0.25,) * 3)


def test_a_big_endian_npy_loads_in_native_order(tmp_path):
    image, mask, _ = scene(20, 16, [2, 2, 10, 10])
    (tmp_path / "a.png").write_bytes(image)
    depth = np.arange(320, dtype=">f4").reshape(16, 20)
    np.save(tmp_path / "a.npy", depth)
    (tmp_path / "list.jsonl").write_text(json.dumps({"path": "a.png", "depth": "a.npy"}) + "\n")
    pack(tmp_path / "list.jsonl", tmp_path / "d.fl", file_columns=("depth",), progress=False)
    got = fastload.PackedDataset(tmp_path / "d.fl", fields=("depth",))[0]["depth"]
    assert got.dtype == torch.float32 and np.array_equal(got.numpy(), depth.astype("=f4"))
