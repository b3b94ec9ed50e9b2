"""What the pixel cache changes and what a fill costs, for pixel_cache_bench.py: crop differences
against the JPEG path (validation crops; train crops by crop scale, at several stored sides), and
where one image's fill time goes (one thread, per image, the steps apart)."""

from __future__ import annotations

import os
import statistics
import tempfile
import time

import numpy as np

import fastload
from fastload.decode.crops import decode_crop
from fastload.decode.transforms import CropPlan, TrainCrop
from fastload.pixels.batch import _crop_stored
from fastload.pixels.layout import stored_size
from fastload.pixels.store import checksum

SCALE_BINS = (0.08, 0.2, 0.4, 0.6, 0.8, 1.0)


def stored(data: bytes, width: int, height: int, side: int) -> np.ndarray:
    """The pixels the cache stores of one record at ``side``."""
    w, h = stored_size(width, height, side)
    return decode_crop(data, CropPlan((0, 0, width, height), (h, w)))


def val_difference(path: str, cache: str, count: int) -> dict[str, float]:
    """Validation crops (resize 256, centre 224) from the cache against the JPEG path: the mean
    absolute difference in levels over ``count`` records, and its spread over images."""
    keys = list(range(count))
    plain = fastload.PackedDataset(path, image_size=224, train=False).__getitems__(keys).images
    ds = fastload.PackedDataset(path, image_size=224, train=False, pixel_cache=cache)
    ds.__getitems__(keys)  # fill
    got = ds.__getitems__(keys).images
    per_image = (got.int() - plain.int()).abs().float().mean(dim=(1, 2, 3)).numpy()
    return {"mean_abs_levels": float(per_image.mean()), "worst_image": float(per_image.max()),
            "median_image": float(np.median(per_image)), "records": count}


def train_difference(path: str, count: int, sides: tuple[int, ...]) -> dict[str, dict[str, float]]:
    """Train crops (RandomResizedCrop 224 + flip) from pixels stored at each side against the JPEG
    path's, by the crop's share of the image: mean absolute difference in levels per bin."""
    ds = fastload.PackedDataset(path)
    rng, geometry = np.random.default_rng(0), TrainCrop(224)
    out = np.empty((224, 224, 3), np.uint8)
    sums = {side: np.zeros(len(SCALE_BINS) - 1) for side in sides}
    counts = np.zeros(len(SCALE_BINS) - 1)
    for i in range(count):
        data, width, height = ds.reader.read(i), int(ds.index.width[i]), int(ds.index.height[i])
        plan = geometry.sample(width, height, rng)
        want = decode_crop(data, plan).astype(np.int16)
        b = min(int(np.searchsorted(SCALE_BINS, plan.box[2] * plan.box[3] / (width * height), "right")) - 1,
                len(counts) - 1)
        counts[b] += 1
        for side in sides:
            _crop_stored(stored(data, width, height, side), plan, width, height, out)
            sums[side][b] += np.abs(out.astype(np.int16) - want).mean()
    bins = [f"{lo:.2f}-{hi:.2f}" for lo, hi in zip(SCALE_BINS, SCALE_BINS[1:])]
    return {str(side): {name: float(s / c) for name, s, c in zip(bins, sums[side], counts) if c}
            for side in sides} | {"crops_per_bin": dict(zip(bins, counts.astype(int).tolist()))}


def fill_parts(path: str, count: int, rounds: int = 3) -> dict[str, float]:
    """One image's steps, ms of CPU each (median of ``rounds`` passes over ``count`` records, one
    thread): the JPEG path's crop, and a fill's whole decode + resize to 256, crop from the stored
    pixels, write and checksum."""
    ds = fastload.PackedDataset(path)
    rng, geometry = np.random.default_rng(1), TrainCrop(224)
    records = []
    for i in range(count):
        data, width, height = ds.reader.read(i), int(ds.index.width[i]), int(ds.index.height[i])
        records.append((data, width, height, geometry.sample(width, height, rng)))
    out = np.empty((3, 224, 224), np.uint8).transpose(1, 2, 0)  # a CHW slot, as in a batch
    kept = [stored(d, w, h, 256) for d, w, h, _ in records]
    fd, name = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)))

    def region() -> None:
        for data, _, _, plan in records:
            decode_crop(data, plan, out=out)

    def whole() -> None:
        for data, width, height, _ in records:
            stored(data, width, height, 256)

    def crop() -> None:
        for pixels, (_, width, height, plan) in zip(kept, records):
            _crop_stored(pixels, plan, width, height, out)

    def write() -> None:
        offset = 0
        for pixels in kept:
            offset += os.pwrite(fd, pixels, offset)
        os.ftruncate(fd, 0)

    def check() -> None:
        for pixels in kept:
            checksum(pixels)

    steps = {"jpeg_path_crop": region, "fill_whole_decode_and_resize": whole, "fill_crop_from_stored": crop,
             "fill_write": write, "fill_checksum": check}
    times: dict[str, list[float]] = {k: [] for k in steps}
    try:
        for _ in range(rounds):
            for name_, step in steps.items():
                used = time.process_time()
                step()
                times[name_].append((time.process_time() - used) / count * 1e3)
    finally:
        os.close(fd)
        os.unlink(name)
    return {k: statistics.median(v) for k, v in times.items()}
