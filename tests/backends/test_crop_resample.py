"""The batched resampler of the GPU decode tails against Pillow itself: any box, any size, flips,
images of mixed sizes in one batch and across chunks; and the operations a batch takes, counted."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils._python_dispatch import TorchDispatchMode

from fastload.backends import resample_plan
from fastload.backends.crop_resample import resample_into, value_dtype
from fastload.backends.resample_plan import Crop, plan_chunks


def photo_like(height: int, width: int, seed: int) -> np.ndarray:
    """Smooth gradients with some texture: what resampling sees in photographs (noise would blur)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 / width, y * 255 / height, (x + y) * 127 / (width + height)], axis=-1)
    return (base + rng.normal(0, 12, base.shape)).clip(0, 255).astype(np.uint8)


def flat(images: list[np.ndarray]) -> list[torch.Tensor]:
    """Decoded regions as the resampler takes them: each one's pixels, row after row, in a 1-D tensor."""
    return [torch.from_numpy(p.reshape(-1)) for p in images]


def resample(out: torch.Tensor, positions: list[int], images: list[np.ndarray], crops: list[Crop]) -> None:
    """The host's plan, then the device's resample, as the nvimgcodec tail runs them."""
    chunks = plan_chunks([(h, w, w * 3) for h, w, _ in (p.shape for p in images)], crops, positions, out.shape[2:],
                         value_dtype(out.device))
    resample_into(out, flat(images), chunks)


class CountOps(TorchDispatchMode):
    """Every torch operation dispatched inside the block, by name (views and copies included)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


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
    resample(out, positions, images, crops)
    for k, (pixels, crop) in enumerate(zip(images, crops)):
        expected = pillow_crop(pixels, crop, out_size).astype(int)
        got = out[positions[k]].numpy().astype(int)
        assert np.abs(got - expected).max() <= 1, f"image {k}: {shapes[k]} {crop}"


def test_a_batch_too_large_for_one_chunk_is_resampled_in_several(monkeypatch):
    monkeypatch.setattr(resample_plan, "CHUNK_BYTES", 3 * 60 * 60 * 5 * 2)  # two windows a chunk, not three
    images = [photo_like(60, 60, seed) for seed in range(5)]
    crops = [Crop(3.5, 2.25, 55.0, 56.0, flip=seed % 2 == 1) for seed in range(5)]
    out = torch.zeros((5, 3, 16, 16), dtype=torch.uint8)
    pixels = flat(images)
    chunks = plan_chunks([(60, 60, 180)] * 5, crops, list(range(5)), (16, 16), torch.float32)
    with CountOps() as counted:
        resample_into(out, pixels, chunks)
    assert counted.ops["aten.bmm"] == 2 * 3  # three chunks: two windows, two, one
    for k in range(5):
        assert np.abs(out[k].numpy().astype(int) - pillow_crop(images[k], crops[k], (16, 16))).max() <= 1


def test_a_batch_of_256_any_sizes_takes_a_fixed_handful_of_operations():
    """Issue 46: the whole batch's crops in a few batched operations, not work per image. Counted
    with torch's dispatcher on CPU tensors: 30 (the GPU adds 2, its plan's copies through pinned
    memory); per-image padding took 1,257 before (256 copies and 767 views among them)."""
    rng = np.random.default_rng(46)
    shapes = [(int(rng.integers(20, 120)), int(rng.integers(20, 120))) for _ in range(256)]
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes]
    crops = [random_crop(h, w, rng) for h, w in shapes]
    out = torch.zeros((256, 3, 24, 24), dtype=torch.uint8)
    pixels = flat(images)
    chunks = plan_chunks([(h, w, w * 3) for h, w in shapes], crops, list(range(256)), (24, 24), torch.float32)
    with CountOps() as counted:
        resample_into(out, pixels, chunks)
    assert sum(counted.ops.values()) <= 30, counted.ops
    assert counted.ops["aten.bmm"] == 2 and counted.ops["aten.copy_"] == 0
    k = 77  # and the pixels are still Pillow's
    assert np.abs(out[k].numpy().astype(int) - pillow_crop(images[k], crops[k], (24, 24))).max() <= 1


def test_rows_padded_apart_resample_as_packed_rows():
    """A GPU decoder may lay an image's rows out pitched (row_bytes past width × 3): the padding,
    whatever it holds, weighs nothing."""
    rng = np.random.default_rng(8)
    images = [photo_like(int(rng.integers(20, 90)), int(rng.integers(20, 90)), seed) for seed in range(6)]
    crops = [random_crop(p.shape[0], p.shape[1], rng) for p in images]
    packed = torch.zeros((6, 3, 20, 28), dtype=torch.uint8)
    resample(packed, list(range(6)), images, crops)
    pitched, shapes = [], []
    for p in images:
        h, w, _ = p.shape
        row_bytes = w * 3 + 64
        rows = np.full((h, row_bytes), 255, dtype=np.uint8)
        rows[:, :w * 3] = p.reshape(h, w * 3)
        pitched.append(torch.from_numpy(rows.reshape(-1)[:(h - 1) * row_bytes + w * 3].copy()))
        shapes.append((h, w, row_bytes))
    out = torch.zeros_like(packed)
    resample_into(out, pitched, plan_chunks(shapes, crops, list(range(6)), (20, 28), torch.float32))
    assert torch.equal(out, packed)


def test_the_native_taps_are_numpys_to_the_bit():
    """The native module's crop_taps (Pillow's fastload_axis) and the NumPy fallback agree exactly:
    boxes cut out first and not, flipped and not, up- and downscaled."""
    taps = resample_plan.native_taps()
    if taps is None:
        pytest.skip("fastload.decode._jpeg_region is not built here")
    rng = np.random.default_rng(1)
    n = 200
    starts, extents = rng.uniform(0, 100, n), rng.uniform(4, 400, n)
    lows, highs = np.zeros(n, np.int64), np.ceil(starts + extents).astype(np.int64) + rng.integers(0, 20, n)
    cut = rng.integers(0, 2, n).astype(bool)
    starts[cut], extents[cut] = np.floor(starts[cut]), np.floor(extents[cut])
    lows[cut], highs[cut] = starts[cut].astype(np.int64), (starts[cut] + extents[cut]).astype(np.int64)
    flips = rng.integers(0, 2, n).astype(np.uint8)
    extents[:12] = 24 * np.arange(1, 13) + rng.choice([0.0, 1e-7, -1e-7], 12)  # whole scales, and a hair off
    highs[:12] = np.ceil(starts[:12] + extents[:12]).astype(np.int64)
    for out_size in (24, 224):
        count = resample_plan._taps_needed(np.stack([starts, extents, lows, highs], 1), out_size)
        native, fallback = ([np.empty(n * out_size * count, np.int64), np.empty(n * out_size * count, np.float32),
                             np.empty((n, 2), np.int64)] for _ in range(2))
        taps(starts, extents, lows, highs, flips, out_size, *native)
        resample_plan.numpy_taps(starts, extents, lows, highs, flips, out_size, *fallback)
        assert np.array_equal(native[1], fallback[1]) and np.array_equal(native[2], fallback[2])
        weighed = native[1] != 0
        assert np.array_equal(native[0][weighed], fallback[0][weighed])
