"""What every decoding backend is held to, as data and helpers: the loaders compared, the pixel
tolerances measured for each backend, and the markers that skip what this machine cannot run."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from itertools import islice
from pathlib import Path
from typing import Any

import pytest
import torch

import fastload
from tests.conftest import REPO

SIZE = 32
BATCH = 5  # 37 records (ID_RECORDS): 7 full batches and one of 2
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]

# Pixel tolerance against the torch backend. Both resample the same box with an antialiased
# bilinear filter, but the torch backend lets libjpeg decode at 1/2, 1/4 or 1/8 scale (draft)
# where the crop allows, and DALI and nvImageCodec decode at full scale. Measured on this data
# (32 px crops, DALI): mean |diff| 0.25 (train) and 0.32 (eval) levels, 99th percentile 2-3, 99.9th
# 7-8, max 16-20, the large ones on sharp edges, where the reduced-scale decode itself differs so.
TORCH_TOLERANCE = (1.0, 16, 48)  # mean, 99.9th percentile, max |diff| in levels
# Against the torch backend decoding the same crop at full scale (decode_crop(draft=False)):
# DALI's CPU operators: measured mean 0.13-0.14, 99.9th percentile 1-2, max 1 inside the image
# and up to 11 on the crop's border rows, where the resamplers treat the edge differently.
# nvImageCodec's CPU codecs (libjpeg-turbo, as Pillow) and the batched resampler: mean 0.11-0.12,
# max 1 (one rounding where Pillow rounds after each axis). On the GPU nvJPEG's IDCT and colour
# conversion differ from libjpeg's by a level or two more.
FULL_SCALE_TOLERANCE = {("dali", "cpu"): (0.3, 2, 16), ("dali", "cuda"): TORCH_TOLERANCE,
                        ("nvimgcodec", "cpu"): (0.3, 1, 1), ("nvimgcodec", "cuda"): (2.0, 12, 48)}


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # no nvidia namespace at all
        return False


needs_dali = pytest.mark.skipif(not installed("nvidia.dali"), reason="needs nvidia-dali-cuda120 "
                                "(pip install -e '.[dali]' in fastload's clone, part of the dev extra)")
needs_nvimgcodec = pytest.mark.skipif(not installed("nvidia.nvimgcodec"), reason="needs nvidia-nvimgcodec-cu12 "
                                      "(pip install -e '.[gpu]' in fastload's clone, part of the dev extra)")
BACKENDS = [pytest.param("dali", marks=needs_dali), pytest.param("nvimgcodec", marks=needs_nvimgcodec)]
GPU = pytest.param("cuda", marks=[
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a lent GPU)"),
])
DEVICES = ["cpu", GPU]


def make(path: Path, backend: str, *, train: bool = True, device: str = "cpu", **kwargs):
    ds = fastload.PackedDataset(path, image_size=SIZE, train=train)
    kwargs.setdefault("batch_size", BATCH)
    kwargs.setdefault("shuffle", True)
    kwargs.setdefault("seed", 0)  # the same order for every loader made here (None: drawn from torch's RNG)
    return fastload.DataLoader(ds, backend=backend, device=device, **kwargs)


def run(loader, limit: int | None = None) -> tuple[list[int], torch.Tensor, list[int]]:
    """One epoch (or its first ``limit`` batches): ids, images on the CPU, batch sizes."""
    ids, images, sizes = [], [], []
    for x, y in islice(loader, limit):  # never asks for a batch past the limit
        ids += y.tolist()
        images.append(x.cpu())
        sizes.append(len(y))
    return ids, torch.cat(images) if images else torch.empty(0), sizes


def diff_stats(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, int]:
    """Mean, 99.9th percentile and max of the absolute pixel difference, in levels."""
    d = (a.to(torch.int16) - b.to(torch.int16)).abs().float()
    return float(d.mean()), float(torch.quantile(d.flatten()[: 2**24], 0.999)), int(d.max())


def assert_close(got: torch.Tensor, expected: torch.Tensor, tolerance: tuple[float, float, int]) -> None:
    mean, p999, biggest = diff_stats(got, expected)
    assert mean < tolerance[0] and p999 <= tolerance[1] and biggest <= tolerance[2], \
        f"mean {mean:.3f}, 99.9th percentile {p999}, max {biggest}; tolerance {tolerance}"


def same_crops(a: torch.Tensor, b: torch.Tensor, device: str) -> bool:
    """The same samples decoded twice: equal on the CPU. On the GPU both backends share JPEGs
    between the hardware decoder and CUDA by load, and their IDCTs round differently (a lent H200
    showed two runs of one epoch unequal): within a level on average there, where another crop or
    flip would be tens of levels off."""
    if a.shape != b.shape:
        return False
    if device == "cpu":
        return torch.equal(a, b)
    mean, _, biggest = diff_stats(a, b)
    return mean < 1.0 and biggest <= 64


def in_a_fresh_process(code: str, timeout: float = 120) -> Any:
    """Run ``code`` in a new interpreter (in the repository's root) and read the JSON it printed
    last; its stderr is the assertion's message if it failed."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=timeout,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])
