"""Demo data: a small ImageFolder tree of synthetic, photo-like JPEGs (numpy + Pillow only).

For `make demo` on a machine with no network but PyPI: no downloads, a few seconds. Each picture
is a smooth colour field with a horizon, a few soft-edged shapes at different blur (depth of
field), multi-scale texture and fine grain, at ImageNet-like sizes (shorter side 256-500 px).
Each class has its own palette and kind of shape, so a small model can learn something.
For benchmark numbers use bench/make_photos.py, which cuts real photographs.

    python bench/make_example.py demo/images --count 600 --classes 6
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np
from image_tree import prepare_out_dir  # bench/ is the script folder, so on sys.path
from PIL import Image, ImageDraw, ImageFilter

SHAPES = ("ellipse", "rectangle", "polygon", "line")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", type=Path, help="folder to fill with class_XXX/img_XXXXXX.jpg")
    p.add_argument("--count", type=int, default=600, help="number of JPEGs (default 600)")
    p.add_argument("--classes", type=int, default=6, help="number of class folders (default 6)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quality", type=int, default=90, help="JPEG quality (default 90)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--overwrite", action="store_true",
                   help="remove existing class_* folders in OUT_DIR first")
    args = p.parse_args(argv)
    if args.count < 1 or args.classes < 1:
        p.error(f"--count and --classes must be positive, got {args.count} and {args.classes}")
    if not 1 <= args.quality <= 100:
        p.error(f"--quality must be within 1..100, got {args.quality}")
    return args


def smooth_field(rng: np.random.Generator, w: int, h: int, cells: int, channels: int) -> np.ndarray:
    """Values in [0, 1] that vary smoothly: a coarse random grid upsampled bicubically (H×W×C)."""
    coarse = (rng.random((cells, cells, channels)) * 255).astype(np.uint8)
    planes = [np.asarray(Image.fromarray(coarse[..., c]).resize((w, h), Image.BICUBIC))
              for c in range(channels)]
    return np.stack(planes, axis=-1).astype(np.float32) / 255.0


def draw_shape(img: Image.Image, rng: np.random.Generator, kind: str, depth: float,
               base: np.ndarray) -> None:
    """Paste one soft-edged shape onto ``img``: bigger and sharper when near (depth 0)."""
    size = (0.1 + 0.4 * (1 - depth)) * min(img.size)
    cx, cy = rng.uniform(0, img.width), rng.uniform(0, img.height)
    colour = tuple(int(v) for v in np.clip(base + rng.normal(0, 60, 3), 0, 255))
    alpha = int(rng.integers(150, 256))
    blur = 0.3 + 3 * depth
    # the mask covers only the shape's own box, plus room for the blur
    pad = int(size + 3 * blur) + 2
    x0, y0 = int(cx) - pad, int(cy) - pad
    mask = Image.new("L", (2 * pad, 2 * pad), 0)
    draw = ImageDraw.Draw(mask)
    lx, ly = cx - x0, cy - y0
    if kind == "ellipse" or kind == "rectangle":
        box = [lx - size, ly - size * rng.uniform(0.4, 1.0),
               lx + size, ly + size * rng.uniform(0.4, 1.0)]
        (draw.ellipse if kind == "ellipse" else draw.rectangle)(box, fill=alpha)
    elif kind == "polygon":
        angles = np.sort(rng.uniform(0, 2 * np.pi, int(rng.integers(3, 7))))
        draw.polygon([(lx + size * np.cos(a), ly + size * np.sin(a)) for a in angles], fill=alpha)
    else:
        draw.line([(lx - size, ly - size), (lx + size, ly + size * rng.uniform(-1, 1))],
                  fill=alpha, width=int(size / 6) + 2)
    img.paste(colour, (x0, y0, x0 + 2 * pad, y0 + 2 * pad),
              mask.filter(ImageFilter.GaussianBlur(blur)))


def render(seed: int, index: int, label: int, classes: int) -> Image.Image:
    """One picture; a pure function of (seed, index) and its class."""
    rng = np.random.default_rng([seed, index])
    short = int(rng.integers(256, 501))
    long = min(640, round(short * float(np.exp(rng.uniform(0.0, np.log(1.6))))))
    w, h = (short, long) if rng.random() < 0.2 else (long, short)
    # class palette: a base hue per class, jittered per image
    hue = (label / classes + rng.normal(0, 0.03)) % 1.0
    hsv = (int(hue * 255), int(rng.integers(90, 200)), int(rng.integers(120, 230)))
    base = np.array(Image.new("HSV", (1, 1), hsv).convert("RGB").getpixel((0, 0)), np.float32)

    # the smooth part is drawn at half size and scaled up: it has no detail to lose
    hw, hh = max(8, w // 2), max(8, h // 2)
    # sky above a horizon, ground below, shading smoothly
    sw, sh = max(8, w // 8), max(8, h // 8)
    rows = np.linspace(0.0, 1.0, sh, dtype=np.float32)[:, None, None]
    sky = base * 0.6 + 90 + 60 * (1 - rows)
    ground = base * (0.8 + 0.4 * rows) - 40
    pixels = np.where(rows < rng.uniform(0.3, 0.7), sky, ground) * np.ones((1, sw, 1), np.float32)
    pixels *= 0.75 + 0.5 * smooth_field(rng, sw, sh, 4, 3)
    img = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).resize((hw, hh), Image.BICUBIC)

    # soft shapes of this class's kind, far ones blurrier than near ones
    for depth in np.sort(rng.random(int(rng.integers(3, 8))))[::-1].tolist():
        draw_shape(img, rng, SHAPES[label % len(SHAPES)], depth, base)
    img = img.resize((w, h), Image.BICUBIC)

    # full-size detail: texture at three scales plus grain, so the JPEG has something to encode
    detail = sum(amp * (smooth_field(rng, w, h, cells, 1)[..., 0] - 0.5)
                 for cells, amp in ((12, 30.0), (48, 18.0), (160, 12.0)))
    detail += rng.standard_normal((h, w), dtype=np.float32) * rng.uniform(2.0, 5.0)
    pixels = np.asarray(img, dtype=np.int16) + np.rint(detail).astype(np.int16)[..., None]
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def _write_one(job: tuple[int, int, int, int, int, str]) -> int:
    seed, index, label, classes, quality, path = job
    buf = io.BytesIO()
    render(seed, index, label, classes).save(buf, "JPEG", quality=quality)
    with open(path, "wb") as f:
        f.write(buf.getvalue())
    return buf.tell()


def main(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    dirs = prepare_out_dir(args.out_dir, args.classes, args.overwrite)
    digits = max(6, len(str(args.count - 1)))
    jobs = [(args.seed, i, i % args.classes, args.classes, args.quality,
             str(dirs[i % args.classes] / f"img_{i:0{digits}d}.jpg")) for i in range(args.count)]
    workers = min(args.workers or len(os.sched_getaffinity(0)), max(1, args.count // 64))
    if workers > 1:
        with mp.get_context("fork").Pool(workers) as pool:
            sizes = pool.map(_write_one, jobs, chunksize=16)
    else:
        sizes = [_write_one(job) for job in jobs]
    kb = np.array(sizes) / 1000
    print(f"{args.out_dir}: {len(sizes)} synthetic JPEGs in {args.classes} classes, "
          f"{kb.sum() / 1000:.1f} MB, mean {kb.mean():.1f} KB "
          f"(range {kb.min():.1f}-{kb.max():.1f}), "
          f"{time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
