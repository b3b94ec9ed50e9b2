"""The machine's ceilings: what it can do at all, whatever the loader.

Full-size JPEG decode on one core and on every core at once (Pillow releases the GIL), fastload's
reduced-scale train decode, memory copy, record reads with many in flight (warm, and cold after
dropping the page cache), whole shards read in order, and host-to-device copies when CUDA is there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from fastload.benchmark.stages import (
    READS_IN_FLIGHT,
    Probe,
    drop_cache,
    make_cold,
    on_decode_thread,
    per_call,
)
from fastload.decode.crops import REGION_DECODE, decode_crop
from fastload.decode.images import decode_rgb
from fastload.decode.transforms import TrainCrop


def decode_rate(blobs: Sequence[bytes], budget: float, threads: int = 1) -> float:
    """Full-size decode-only rate (images/s) with ``threads`` decoding at once."""
    def one(k: int) -> None:
        decode_rgb(blobs[k % len(blobs)])

    if threads <= 1:
        return 1.0 / per_call(one, range(len(blobs)), budget)
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(threads)))  # warm-up
        n, started = 0, time.perf_counter()
        while time.perf_counter() - started < budget or n < 2 * threads:
            list(pool.map(one, range(n, n + 4 * threads)))
            n += 4 * threads
        return n / (time.perf_counter() - started)


def reduced_decode_rate(blobs: Sequence[bytes], budget: float, image_size: int = 224,
                        region: bool = True) -> float:
    """fastload's train decode (RandomResizedCrop plan, region and reduced-scale JPEG decode,
    resize, flip) per core, on a decode thread as the loader runs it; ``region=False``: the
    whole-image Pillow path instead of the native region decoder."""
    from fastload.decode.images import image_size as header_size

    crop, rng = TrainCrop(image_size), np.random.default_rng(0)
    plans = [crop.sample(*header_size(b), rng) for b in blobs]
    out = np.empty((*plans[0].out_size, 3), dtype=np.uint8) if plans else None

    return 1.0 / on_decode_thread(lambda: per_call(
        lambda k: decode_crop(blobs[k], plans[k], out=out, region=region), range(len(blobs)), budget))


def memcpy_rate(mb: int = 64, repeats: int = 3) -> float:
    """Memory copy bandwidth (MB/s), best of ``repeats`` copies of an ``mb`` MB buffer."""
    src = np.ones(mb << 20, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - started)
    return (mb << 20) / 1e6 / best


def parallel_read_rate(read_batch: Callable[[list[int]], list[bytes]], indices: Sequence[int],
                       budget: float, threads: int = READS_IN_FLIGHT, once: bool = False) -> float:
    """MB/s reading ``indices`` with ``threads`` reads in flight, for ``budget`` seconds; ``once``:
    a single pass (a cold read cannot be repeated), stopping early after ``budget``."""
    chunks = [list(indices[k:k + 4]) for k in range(0, len(indices), 4)]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda _: None, range(threads)))  # start the threads before the clock
        nbytes, started = 0, time.perf_counter()
        while True:
            for k in range(0, len(chunks), threads):
                nbytes += sum(len(b) for out in pool.map(read_batch, chunks[k:k + threads]) for b in out)
                if time.perf_counter() - started > budget:
                    break
            if once or time.perf_counter() - started > budget:
                break
        return nbytes / 1e6 / (time.perf_counter() - started)


def sequential_read_rate(files: Sequence[str], budget: float) -> float | None:
    """MB/s reading whole files in order, 8 MB at a time, after dropping them from the cache."""
    drop_cache(files)
    nbytes, started = 0, time.perf_counter()
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(8 << 20):
                nbytes += len(chunk)
                if time.perf_counter() - started > budget:
                    return nbytes / 1e6 / (time.perf_counter() - started)
    seconds = time.perf_counter() - started
    return nbytes / 1e6 / seconds if nbytes and seconds > 0 else None


def h2d_rate(image_size: int, batch_size: int, pinned: bool) -> float | None:
    """Host-to-device copy rate (MB/s) of a uint8 image batch; None without CUDA."""
    if not torch.cuda.is_available():
        return None
    batch = torch.zeros((batch_size, 3, image_size, image_size), dtype=torch.uint8)
    if pinned:
        batch = batch.pin_memory()
    batch.to("cuda", non_blocking=pinned)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(10):
        batch.to("cuda", non_blocking=pinned)
    torch.cuda.synchronize()
    return 10 * batch.numel() / 1e6 / (time.perf_counter() - started)


def ceilings(probe: Probe, sample: dict[str, Any], *, cores: int, cold: bool, budget: float,
             image_size: int, batch_size: int, sequential_files: Sequence[str] = ()) -> dict[str, Any]:
    """What the machine can do at all, measured on the records ``measure_stages`` sampled."""
    blobs, indices = sample["blobs"], sample["indices"]
    per_core = decode_rate(blobs, budget)
    out: dict[str, Any] = {
        "decode_per_core": per_core, "cores": cores, "decode_ceiling": per_core * cores,
        "decode_all_cores_measured": decode_rate(blobs, budget, threads=cores) if cores > 1 else per_core,
        "decode_reduced_per_core": _jpeg_only(reduced_decode_rate, blobs, budget, image_size),
        "decode_reduced_pillow_per_core": (
            _jpeg_only(reduced_decode_rate, blobs, budget, image_size, False) if REGION_DECODE else None),
        "memcpy_mb_s": memcpy_rate(),
        "read_warm_mb_s": parallel_read_rate(lambda c: [probe.read(i) for i in c], indices, budget),
        "read_cold_mb_s": None, "disk_sequential_mb_s": None,
        "h2d_pinned_mb_s": h2d_rate(image_size, batch_size, pinned=True),
        "h2d_pageable_mb_s": h2d_rate(image_size, batch_size, pinned=False),
    }
    if cold:
        make_cold(probe, indices)
        out["read_cold_mb_s"] = parallel_read_rate(lambda c: [probe.read(i) for i in c], indices, budget,
                                                   once=True)
    if sequential_files:
        out["disk_sequential_mb_s"] = sequential_read_rate(sequential_files, budget)
    return out


def _jpeg_only(fn: Callable[..., float], blobs: Sequence[bytes], *args: Any) -> float | None:
    jpegs = [b for b in blobs if b[:2] == b"\xff\xd8"]
    return fn(jpegs, *args) if jpegs else None
