"""The batched resampler of the GPU decode tails against Pillow itself: any box, any size, flips,
images of mixed sizes in one batch and across chunks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from fastload.backends import crop_resample
from fastload.backends.crop_resample import Crop, resample_into


def photo_like(height: int, width: int, seed: int) -> np.ndarray:
    """Smooth gradients with some texture: what resampling sees in photographs (noise would blur)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], axis=-1)
    return (base + rng.normal(0, 12, base.shape)).clip(0, 255).astype(np.uint8)


def pillow_crop(pixels: np.ndarray, crop: Crop, out_size: tuple[int, int]) -> np.ndarray:
    box = (crop.left, crop.top, crop.left + crop.width, crop.top + crop.height)
    img = Image.fromarray(pixels).resize((out_size[1], out_size[0]), Image.Resampling.BILINEAR, box=box)
    if crop.flip:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(img).transpose(2, 0, 1)


def random_crop(height: int, width: int, rng: np.random.Generator) -> Crop:
    box_h, box_w = rng.uniform(4, height), rng.uniform(4, width)
    return Crop(top=rng.uniform(0, height - box_h), left=rng.uniform(0, width - box_w), height=box_h,
                width=box_w, flip=bool(rng.integers(2)))


@pytest.mark.parametrize("out_size", [(32, 32), (24, 40), (150, 130)], ids=["square", "wide", "upscale"])
def test_each_crop_is_pillows_resize_of_its_box_within_one_level(out_size):
    """Pillow rounds after each axis, the resampler once: at most one level apart."""
    rng = np.random.default_rng(sum(out_size))
    shapes = [(int(rng.integers(20, 200)), int(rng.integers(20, 200))) for _ in range(12)]
    images = [photo_like(h, w, seed) for seed, (h, w) in enumerate(shapes)]
    crops = [random_crop(h, w, rng) for h, w in shapes]
    crops[0] = Crop(0, 0, shapes[0][0], shapes[0][1], flip=True)  # the whole image
    out = torch.zeros((len(images), 3, *out_size), dtype=torch.uint8)
    positions = list(rng.permutation(len(images)))
    resample_into(out, positions, [torch.from_numpy(p) for p in images], crops)
    for k, (pixels, crop) in enumerate(zip(images, crops)):
        expected = pillow_crop(pixels, crop, out_size).astype(int)
        got = out[positions[k]].numpy().astype(int)
        assert np.abs(got - expected).max() <= 1, f"image {k}: {shapes[k]} {crop}"


def test_a_batch_too_large_for_one_chunk_is_resampled_in_several(monkeypatch):
    monkeypatch.setattr(crop_resample, "CHUNK_BYTES", 3 * 60 * 60 * 4 * 2)  # two 60×60 images a chunk
    images = [photo_like(60, 60, seed) for seed in range(5)]
    crops = [Crop(3.5, 2.25, 50.0, 41.0, flip=seed % 2 == 1) for seed in range(5)]
    out = torch.zeros((5, 3, 16, 16), dtype=torch.uint8)
    resample_into(out, list(range(5)), [torch.from_numpy(p) for p in images], crops)
    for k in range(5):
        assert np.abs(out[k].numpy().astype(int) - pillow_crop(images[k], crops[k], (16, 16))).max() <= 1
