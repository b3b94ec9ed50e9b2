"""Boxes that follow the image (issue 17): with the train crop and flip, a sample's boxes are moved
into output pixels as its pixels are, clipped, mirrored, and dropped with their labels when nothing
of them is left, against a plain per-box reference from the crop plan and against the pixels."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload.converters import pack
from fastload.errors import CorruptRecordError

SEED, N = 11, 24


def picture(width: int, height: int, box: list[int]) -> bytes:
    """Black, with one red rectangle where ``box`` (x0, y0, x1, y1) is."""
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    x0, y0, x1, y1 = box
    pixels[y0:y1, x0:x1] = (255, 0, 0)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")  # lossless: the red edges stay sharp
    return out.getvalue()


@pytest.fixture(scope="module")
def detection(tmp_path_factory):
    root = tmp_path_factory.mktemp("boxes")
    rng = np.random.default_rng(0)
    rows = []
    for i in range(N):
        width, height = int(rng.integers(80, 160)), int(rng.integers(80, 160))
        x0, y0 = int(rng.integers(0, width - 20)), int(rng.integers(0, height - 20))
        red = [x0, y0, int(rng.integers(x0 + 12, width)), int(rng.integers(y0 + 12, height))]
        (root / f"{i}.png").write_bytes(picture(width, height, red))
        others = [[0.0, 0.0, 5.5, 4.0], [width - 3.0, height - 3.0, float(width), float(height)]]
        rows.append({"path": f"{i}.png", "label": i % 2, "boxes": [red, *others[: i % 3]],
                     "box_labels": [7, *range(i % 3)], "wh": [width, height]})
    (root / "list.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pack(root / "list.jsonl", root / "d.fl", progress=False)
    return root / "d.fl", rows


def reference(box: list[float], plan) -> list[float] | None:
    """One box through the plan, written out plainly."""
    left, top, w, h = plan.box
    out_h, out_w = plan.out_size
    x0 = min(max((box[0] - left) * out_w / w, 0), out_w)
    x1 = min(max((box[2] - left) * out_w / w, 0), out_w)
    y0 = min(max((box[1] - top) * out_h / h, 0), out_h)
    y1 = min(max((box[3] - top) * out_h / h, 0), out_h)
    if x1 <= x0 or y1 <= y0:
        return None
    return [out_w - x1, y0, out_w - x0, y1] if plan.flip else [x0, y0, x1, y1]


def loader(path, **kw):
    ds = fastload.PackedDataset(path, image_size=64, train=True, fields=("image", "boxes", "box_labels"),
                                boxes="boxes", box_fields=("box_labels",), **kw)
    return ds, fastload.DataLoader(ds, batch_size=5, shuffle=True, seed=SEED)


def test_boxes_follow_the_crop_plan(detection):
    path, rows = detection
    ds, batches = loader(path)
    seen = 0
    for epoch in range(2):
        got = [(b, l) for batch in batches for b, l in zip(batch["boxes"], batch["box_labels"])]
        order = fastload.sampling.order.epoch_order(N, seed=SEED, epoch=epoch, shuffle=True).tolist()
        for i, (boxes, labels) in zip(order, got):
            width, height = rows[i]["wh"]
            plan = ds.pipeline.plan(i, epoch, SEED, width, height)
            want = [(reference(b, plan), lab) for b, lab in zip(rows[i]["boxes"], rows[i]["box_labels"])]
            want = [(b, lab) for b, lab in want if b is not None]
            assert boxes.shape == (len(want), 4) and labels.tolist() == [lab for _, lab in want]
            assert np.allclose(boxes.numpy(), [b for b, _ in want] or np.zeros((0, 4)), atol=1e-9)
            seen += len(want)
    assert seen > N  # most boxes survive some crops, and some crops drop some


def test_a_moved_box_bounds_its_red_pixels(detection):
    path, rows = detection
    _, batches = loader(path)
    checked = 0
    for batch in batches:
        for image, boxes, labels in zip(batch["image"], batch["boxes"], batch["box_labels"]):
            red = (image[0] > 160) & (image[1] < 90) & (image[2] < 90)
            mine = [b for b, lab in zip(boxes.tolist(), labels.tolist()) if lab == 7]
            if not mine:
                assert int(red.sum()) <= 2 * 64  # at most a sliver blurred in from outside the crop
                continue
            x0, y0, x1, y1 = mine[0]
            ys, xs = torch.nonzero(red, as_tuple=True)
            if len(xs) < 4:
                continue  # a box thinner than a pixel after the resize
            assert abs(xs.min().item() - x0) <= 2 and abs(xs.max().item() + 1 - x1) <= 2
            assert abs(ys.min().item() - y0) <= 2 and abs(ys.max().item() + 1 - y1) <= 2
            checked += 1
    assert checked > N // 3


def test_box_arguments_and_misaligned_rows_are_refused(detection, tmp_path):
    path, _ = detection
    with pytest.raises(ValueError, match="not a field of boxes"):
        fastload.PackedDataset(path, image_size=64, train=True, fields=("wh",), boxes="wh")
    with pytest.raises(ValueError, match="pass image_size= and fields= naming 'boxes'"):
        fastload.PackedDataset(path, fields=("boxes",), boxes="boxes")
    with pytest.raises(ValueError, match="pass boxes= too"):
        fastload.PackedDataset(path, image_size=64, train=True, fields=("boxes",), box_fields=("box_labels",))
    (tmp_path / "a.png").write_bytes(picture(40, 40, [5, 5, 20, 20]))
    (tmp_path / "list.jsonl").write_text(json.dumps({"path": "a.png", "boxes": [[1, 1, 9, 9]],
                                                     "box_labels": [1, 2]}) + "\n")
    pack(tmp_path / "list.jsonl", tmp_path / "bad.fl", progress=False)
    ds = fastload.PackedDataset(tmp_path / "bad.fl", image_size=32, train=True, fields=("boxes", "box_labels"),
                                boxes="boxes", box_fields=("box_labels",))
    with pytest.raises(CorruptRecordError, match=r"record 0 \(a.png\): 1 boxes but 2 rows of 'box_labels'"):
        ds[0]
