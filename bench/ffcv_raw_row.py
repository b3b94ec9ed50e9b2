"""FFCV's RAW image fields at the pixel cache's stored size, for pixel_cache_bench.py: run with the
Python of a separate environment holding ffcv 1.0.2 (never fastload's own; see bench/README.md).

    /work/ffcv-venv/bin/python bench/ffcv_raw_row.py bench/data/photos bench/data/photos-raw256.beton

Writes the .beton once (each photo decoded and resized with Pillow to the size the pixel cache
stores: shorter side 256, longer ``int(256 * long / short)``, never enlarged; stored RAW, so FFCV
never decodes a JPEG), then reads ``--epochs`` epochs of RandomResizedCrop 224 + flip, batch 256,
``--workers`` threads, and prints one JSON line: samples/s of each epoch, peak memory, file size.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rss_peak import PeakMemory  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos", type=Path, help="the ImageFolder tree the fastload pack was made from")
    p.add_argument("beton", type=Path, help="the .beton to write (once) and read")
    p.add_argument("--side", type=int, default=256)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=os.cpu_count())
    p.add_argument("--batch-size", type=int, default=256)
    return p.parse_args(argv)


class StoredPhotos:
    """The photos as (HWC uint8 at the stored size, label), sorted by path as fastload packs them."""

    def __init__(self, root: Path, side: int) -> None:
        self.files = sorted(p for p in root.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
        classes = sorted({p.parent.name for p in self.files})
        self.labels = [classes.index(p.parent.name) for p in self.files]
        self.side = side

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        img = Image.open(self.files[i])
        width, height = img.size
        if min(width, height) > self.side:
            size = ((self.side, int(self.side * height / width)) if width <= height
                    else (int(self.side * width / height), self.side))
            img.draft("RGB", size)
            img = img.convert("RGB").resize(size, Image.BILINEAR)
        return np.asarray(img.convert("RGB")), self.labels[i]


def write(photos: Path, beton: Path, side: int, workers: int) -> None:
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    tmp = beton.with_suffix(".tmp")
    writer = DatasetWriter(str(tmp), {"image": RGBImageField(write_mode="raw"), "label": IntField()},
                           num_workers=workers)
    writer.from_indexed_dataset(StoredPhotos(photos, side))
    tmp.rename(beton)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.beton.exists():
        write(args.photos, args.beton, args.side, args.workers)
    import torch
    from ffcv.fields.basics import IntDecoder
    from ffcv.fields.rgb_image import RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, ToTensor, ToTorchImage

    loader = Loader(str(args.beton), batch_size=args.batch_size, num_workers=args.workers,
                    order=OrderOption.RANDOM, os_cache=True, drop_last=False, seed=0,
                    pipelines={"image": [RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip(),
                                         ToTensor(), ToTorchImage()],
                               "label": [IntDecoder(), ToTensor()]})
    rates, cpu = [], []
    with PeakMemory() as peak:
        for _ in range(args.epochs):
            started, used, n = time.perf_counter(), time.process_time(), 0
            for images, labels in loader:
                assert images.dtype == torch.uint8 and images.shape[1:] == (3, 224, 224)
                n += len(labels)
            rates.append(n / (time.perf_counter() - started))
            cpu.append(n / (time.process_time() - used))
    import ffcv

    print(json.dumps({"ffcv": ffcv.__version__, "records": n, "samples_per_s": rates,
                      "samples_per_cpu_s": cpu, "memory": peak.figures(),
                      "beton_bytes": args.beton.stat().st_size}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
