"""What the pixel cache changes and what a fill costs, for pixel_cache_bench.py: crop differences
against the JPEG path (validation crops; train crops by crop scale, at several stored sides), and
where one image's fill time goes (one thread, per image, the steps apart, beside a whole decode to
RGB that the stored planes skip, the route of images the fill does not read as planes, and a way
not taken: writing through a mapping of the data file)."""

from __future__ import annotations

import mmap
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
from fastload.decode._jpeg_region import decode_region, planes_from_rgb

import fastload
from fastload.decode.crops import decode_crop, draft_scale
from fastload.decode.stored import crop_stored, decode_stored
from fastload.decode.transforms import CropPlan, TrainCrop
from fastload.pixels.layout import stored_bytes, stored_size
from fastload.pixels.store import checksum
from fastload.storage.cache_entry_files import _reserve

SCALE_BINS = (0.08, 0.2, 0.4, 0.6, 0.8, 1.0)


def stored(data: bytes, width: int, height: int, side: int) -> tuple[np.ndarray, tuple[int, int]]:
    """The planes the cache stores of one record at ``side``, and their size."""
    size = stored_size(width, height, side)
    planes = np.empty(stored_bytes(*size), np.uint8)
    return decode_stored(data, width, height, planes, size, where="", max_pixels=10**10), size


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
            crop_stored(*stored(data, width, height, side), plan, (width, height), out)
            sums[side][b] += np.abs(out.astype(np.int16) - want).mean()
    bins = [f"{lo:.2f}-{hi:.2f}" for lo, hi in zip(SCALE_BINS, SCALE_BINS[1:])]
    return {str(side): {name: float(s / c) for name, s, c in zip(bins, sums[side], counts) if c}
            for side in sides} | {"crops_per_bin": dict(zip(bins, counts.astype(int).tolist()))}


def fill_parts(path: str, count: int, rounds: int = 3) -> dict[str, float]:
    """One image's steps, ms of CPU (user + system) each, median of ``rounds`` passes over the JPEGs
    of the first ``count`` records, one thread: the JPEG path's crop; a fill's raw decode with its
    planes' shrink to 256 px, crop from the stored planes, write (``pwrite`` into a reserved data
    file, as the cache writes) and checksum. Beside them: a whole decode to RGB alone (libjpeg's
    upsampling and colour conversion, which the planes skip; with a copy out), the route of an
    image the fill does not read as planes (Pillow's RGB at the stored size, then planes), and the
    planes copied into a shared mapping of the data file instead of written (decoding straight into
    it would pay that: page faults)."""
    ds = fastload.PackedDataset(path)
    rng, geometry = np.random.default_rng(1), TrainCrop(224)
    records = []
    for i in range(count):
        data, width, height = ds.reader.read(i), int(ds.index.width[i]), int(ds.index.height[i])
        if data[:3] == b"\xff\xd8\xff":  # decode_region decodes JPEGs alone
            records.append((data, width, height, geometry.sample(width, height, rng)))
    count = len(records)
    out = np.empty((3, 224, 224), np.uint8).transpose(1, 2, 0)  # a CHW slot, as in a batch
    kept = [stored(d, w, h, 256) for d, w, h, _ in records]
    scratch = np.empty(max(p.nbytes for p, _ in kept), np.uint8)
    size = sum(-(-p.nbytes // 64) * 64 for p, _ in kept)
    folder = os.path.dirname(os.path.abspath(path))

    def region() -> None:
        for data, _, _, plan in records:
            decode_crop(data, plan, out=out)

    def whole() -> None:
        for (data, width, height, _), (_, (w, h)) in zip(records, kept):
            decode_region(data, draft_scale((0, 0, width, height), (h, w)), 0, 0, 1 << 30, 1 << 30, 10**10)

    def shrunk() -> None:
        for (data, width, height, _), (pixels, size_) in zip(records, kept):
            decode_stored(data, width, height, scratch[:pixels.nbytes], size_, where="", max_pixels=10**10)

    def pillow() -> None:
        for (data, width, height, _), (pixels, (w, h)) in zip(records, kept):
            rgb = decode_crop(data, CropPlan((0, 0, width, height), (h, w)))
            planes_from_rgb(rgb, scratch[:pixels.nbytes])

    def crop() -> None:
        for (pixels, size_), (_, width, height, plan) in zip(kept, records):
            crop_stored(pixels, size_, plan, (width, height), out)

    def write(mapped: bool) -> float:
        """CPU seconds of the writes alone (the file made and reserved first, as the cache's is)."""
        fd, name = tempfile.mkstemp(dir=folder)
        try:
            os.ftruncate(fd, size)
            _reserve(fd, size, emulated=False)
            with mmap.mmap(fd, size) as view:
                target, offset = np.frombuffer(view, np.uint8), 0
                started = time.process_time()
                for pixels, _ in kept:
                    if mapped:
                        target[offset:offset + pixels.nbytes] = pixels.reshape(-1)
                    else:
                        os.pwrite(fd, pixels, offset)
                    offset += -(-pixels.nbytes // 64) * 64
                used = time.process_time() - started
                del target
        finally:
            os.close(fd)
            os.unlink(name)
        return used

    def check() -> None:
        for pixels, _ in kept:
            checksum(pixels)

    steps: dict[str, Callable[[], float | None]] = {
        "jpeg_path_crop": region, "fill_decode_and_shrink": shrunk, "fill_crop_from_stored": crop,
        "fill_write": lambda: write(False), "fill_checksum": check, "rgb_whole_decode_alone": whole,
        "other_images_pillow_then_planes": pillow, "not_taken_write_through_a_mapping": lambda: write(True)}
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(rounds):
        for name_, step in steps.items():
            started = time.process_time()
            used = step()  # the writes time themselves
            times[name_].append((time.process_time() - started if used is None else used) / count * 1e3)
    parts = {k: statistics.median(v) for k, v in times.items()}
    parts["fill_total"] = sum(parts[k] for k in ("fill_decode_and_shrink", "fill_crop_from_stored", "fill_write",
                                                 "fill_checksum"))
    return parts
