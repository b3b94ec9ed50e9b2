"""The eval pipeline through the loader equals a plain Pillow reference: full decode, resize the
shorter side to round(224 / 0.875) bilinear, centre crop 224."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastload

from .helpers import encode, picture

SIZE, RATIO = 224, 0.875
# (width, height, format); JPEGs whose centre box is at least 2 x 224 are decoded at reduced scale.
IMAGES = [(500, 375, "JPEG"), (375, 500, "JPEG"), (300, 260, "PNG"), (260, 300, "JPEG"),
          (100, 80, "JPEG"), (640, 480, "JPEG"), (2000, 1500, "JPEG"), (1200, 900, "JPEG"),
          (1024, 600, "PNG"), (700, 520, "GRAY")]


def reference_eval(data: bytes) -> np.ndarray:
    """torchvision-style eval with Pillow only (as tests/decode/test_decode.py's reference)."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    width, height = img.size
    short = round(SIZE / RATIO)
    new = (short, int(short * height / width)) if width <= height else (int(short * width / height), short)
    img = img.resize(new, Image.BILINEAR)
    left, top = int(round((new[0] - SIZE) / 2)), int(round((new[1] - SIZE) / 2))
    return np.asarray(img.crop((left, top, left + SIZE, top + SIZE)))


def reduced(width: int, height: int, fmt: str) -> bool:
    """Whether libjpeg may decode this image at 1/2 or less (its centre box is >= 2 x 224)."""
    return fmt != "PNG" and min(width, height) * RATIO >= 2 * SIZE


@pytest.fixture(scope="module")
def eval_set(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes]]:
    from fastload.converters import pack

    base = tmp_path_factory.mktemp("eval")
    rows, sources = ["path,label"], []
    for i, (width, height, fmt) in enumerate(IMAGES):
        img = picture(width, height, seed=100 + i)
        data = encode(img.convert("L"), "JPEG") if fmt == "GRAY" else encode(img, fmt)
        name = f"{i}.{'png' if fmt == 'PNG' else 'jpg'}"
        (base / name).write_bytes(data)
        rows.append(f"{name},{i}")
        sources.append(data)
    (base / "list.csv").write_text("\n".join(rows) + "\n")
    pack(base / "list.csv", base / "eval.fl", progress=False)
    return base / "eval.fl", sources


@pytest.mark.parametrize("num_workers", [0, 2])
def test_eval_pipeline_matches_the_pillow_reference(eval_set, num_workers):
    """Tolerances from tests/decode/test_decode.py, where they were measured: without reduced decode the one
    bilinear resize over the box equals resize-then-crop up to float round-off (mean <= 0.05,
    max <= 1); with it, libjpeg's DCT-domain downscale is a sharper low-pass filter (mean <= 1.0,
    99th percentile <= 6)."""
    path, sources = eval_set
    ds = fastload.PackedDataset(path, image_size=SIZE, train=False)
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=False, num_workers=num_workers)
    seen = []
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, SIZE, SIZE)
        for image, label in zip(images, labels.tolist()):
            width, height, fmt = IMAGES[label]
            got = image.permute(1, 2, 0).numpy().astype(int)
            diff = np.abs(got - reference_eval(sources[label]))
            where = f"image {label} ({width}x{height} {fmt}): mean {diff.mean():.3f}, max {diff.max()}"
            if reduced(width, height, fmt):
                assert diff.mean() <= 1.0 and np.percentile(diff, 99) <= 6, where
            else:
                assert diff.mean() <= 0.05 and diff.max() <= 1, where
            seen.append(label)
    assert seen == list(range(len(IMAGES)))
    assert sum(reduced(*spec) for spec in IMAGES) >= 2  # both paths were exercised


def test_eval_is_deterministic_and_unshuffled_by_default(eval_set):
    path, _ = eval_set
    ds = fastload.PackedDataset(path, image_size=SIZE, train=False)
    first = [x for x, _ in fastload.DataLoader(ds, batch_size=3)]
    second = [x for x, _ in fastload.DataLoader(ds, batch_size=3, num_workers=1)]
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    single = ds[6][0]  # __getitem__ gives the same pixels as the batched path
    assert torch.equal(single, torch.cat(first)[6])
