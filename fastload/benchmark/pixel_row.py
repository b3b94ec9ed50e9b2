"""The pixel cache's row of ``fastload bench``: fastload's train pipeline on a packed dataset whose
decoded pixels are cached (``PackedDataset(pixel_cache=...)``), timed in epoch >= 2 (the cache is
filled by one untimed pass first), with the disk its pixels take.

The cache lives in a temporary folder of this process, removed when it exits.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastload.benchmark.runs import RunSpec
from fastload.benchmark.stages import drop_cache, shard_files
from fastload.config import format_size

_FOLDER: list[str] = []


def _folder() -> str:
    if not _FOLDER:
        _FOLDER.append(tempfile.mkdtemp(prefix="fastload-bench-pixels-"))
        atexit.register(shutil.rmtree, _FOLDER[0], True)
    return _FOLDER[0]


def pixel_cache_row(path: Path, storage: str, batch_size: int, image_size: int, size: float, cold: bool,
                    placed: dict[str, Any], settings_text: Callable[[Any], str]) -> RunSpec:
    """The row of ``path``'s train pipeline with a pixel cache (``placed``: where batches go;
    ``settings_text``: a loader's settings in words, as the other fastload rows say them)."""
    from fastload.dataset import PackedDataset
    from fastload.loading.loader import DataLoader

    def dataset() -> PackedDataset:
        return PackedDataset(path, image_size=image_size, train=True, pixel_cache=_folder())

    def fill() -> None:
        ds = dataset()
        if not ds.pixel_cache.store.entries(range(len(ds))).present.all():  # type: ignore[union-attr]
            for _ in DataLoader(ds, batch_size=batch_size):  # epoch 1: every image decoded and stored
                pass
        if cold:
            drop_cache([*shard_files(path), *Path(_folder()).rglob("data-*")])

    def settings(loader: Any) -> str:
        cache = loader.dataset.pixel_cache
        return (f"{settings_text(loader)}; epoch >= 2 of a pixel cache at {cache.side} px: "
                f"{format_size(cache.bytes() / max(1, len(loader.dataset)))} an image on disk")

    return RunSpec(f"fastload {storage}, pixel cache", "fastload", storage,
                   lambda: DataLoader(dataset(), batch_size=batch_size, shuffle=True, **placed),
                   settings, size, prepare=fill)


def pixel_cache_need(dataset: Any, image_size: int) -> tuple[int, int, int] | None:
    """``(bytes, free, side)``: what a pixel cache of this packed dataset would take at the default
    ``side`` for ``image_size`` crops, and the bytes free on the disk of the default cache folder; None for
    a dataset that is not a PackedDataset of images, or that has a pixel cache already."""
    import os

    from fastload.config import pixel_cache_dir
    from fastload.pixels.layout import default_side, folder_bytes

    index = getattr(dataset, "index", None)
    if index is None or getattr(dataset, "pixel_cache", None) is not None or dataset.manifest.kind != "images":
        return None
    side = default_side((image_size, image_size), 0.875)
    need = folder_bytes(index.width, index.height, side)
    folder = pixel_cache_dir(True)
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    disk = os.statvfs(folder)
    return need, disk.f_bavail * disk.f_frsize, side


def pixel_cache_advice(need: tuple[int, int, int] | None) -> str | None:
    """The doctor's advice to decode each image once, with the disk it takes (None: not a packed dataset)."""
    if need is None:
        return None
    size, free, side = need
    text = (f"decode each image once: fastload.PackedDataset(path, image_size=..., train=True, pixel_cache=True) stores its "
            f"pixels at {side} px ({format_size(size)} on disk) and crops every later epoch from them, with no "
            "JPEG decode (epoch 1 costs more: see docs/loader.md)")
    if size <= 0.9 * free:
        return text + f"; the cache's disk has {format_size(free)} free"
    return (text + f"; its disk has only {format_size(free)} free: give pixel_cache= a folder on a larger one, "
            "or let pixel_cache_limit= keep the part that fits (a partial cache still pays)")
