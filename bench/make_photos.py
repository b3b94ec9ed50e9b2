"""Benchmark data: an ImageFolder tree of realistic JPEGs cut from real photographs.

The photographs are the "nature" wallpapers of Debian's ``mate-backgrounds`` package (camera shots
of flowers, grass, water, sky and wood, 1280x1024 to 2560x1920). Each output file is a random crop
of one of them (random scale, position and aspect, random orientation), resized so its shorter
side is 256-500 px and its longer side at most 640 px, randomly flipped, colour-jittered and
given sensor-like grain, then saved as a baseline 4:2:0 JPEG at a quality tuned so the folder's
mean file size lands near ``--target-kb`` (ImageNet's train set averages ~110 KB).

Why only those twelve files: ``gnome-backgrounds`` 43 and ``ukui-wallpapers`` 20.04 (and the
rest of ``mate-backgrounds``) hold renders, illustrations, flat colours, a mirrored painting
and SVGs, and no colour or edge statistic separated them cleanly from soft macro photos such as
Aqua or Storm, so the photographs are named below. Only the package that holds them is
downloaded.

    python bench/make_photos.py bench/data/photos --count 10000 --classes 100 --seed 0

Same seed, count, classes and target (or quality) -> same files, for the same Pillow/libjpeg.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from image_tree import prepare_out_dir  # bench/ is the script folder, so on sys.path
from PIL import Image, ImageEnhance
from tqdm import tqdm

PACKAGE = "mate-backgrounds"
PHOTO_DIR = "usr/share/backgrounds/mate/nature"
PHOTOS = (  # every real photograph in the three wallpaper packages; the rest are not photos
    "Aqua.jpg", "Blinds.jpg", "Dune.jpg", "FreshFlower.jpg", "Garden.jpg", "GreenMeadow.jpg",
    "LadyBird.jpg", "RainDrops.jpg", "Storm.jpg", "TwoWings.jpg", "Wood.jpg", "YellowFlower.jpg",
)
DEFAULT_CACHE = Path(__file__).resolve().parent / "data" / "debian-photos"
CANDIDATE_QUALITIES = tuple(range(85, 99))
CALIBRATION_SAMPLES = 240

_GRAIN_SIDE = 1024
# per pool process: the decoded photographs and unit-variance noise fields
_SOURCES: list[Image.Image] = []
_GRAIN_LUMA = _GRAIN_CHROMA = np.zeros((0, 0, 0), dtype=np.float32)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", type=Path, help="folder to fill with class_XXX/img_XXXXXX.jpg")
    p.add_argument("--count", type=int, default=10000, help="number of JPEGs (default 10000)")
    p.add_argument("--classes", type=int, default=100, help="number of class folders (default 100)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target-kb", type=float, default=105.0,
                   help="mean file size to tune the quality for, in KB of 1000 bytes (default 105)")
    p.add_argument("--quality", type=float, default=None,
                   help="fixed base JPEG quality (fractional: 97.4 saves 40%% of files at 98, "
                        "60%% at 97, before the per-file offset) instead of tuning to --target-kb")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                   help=f"where the .deb is downloaded and unpacked (default {DEFAULT_CACHE})")
    p.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    p.add_argument("--overwrite", action="store_true",
                   help="remove existing class_* folders in OUT_DIR first")
    args = p.parse_args(argv)
    if args.count < 1 or args.classes < 1:
        p.error(f"--count and --classes must be positive, got {args.count} and {args.classes}")
    if args.quality is not None and not 1 <= args.quality <= 100:
        p.error(f"--quality must be within 1..100, got {args.quality}")
    return args


# --- sources: the .deb, unpacked into the cache --------------------------------------------------

def fetch_photos(cache: Path) -> list[Path]:
    """Paths of the photographs, downloading and unpacking ``mate-backgrounds`` when missing."""
    root = cache / "ex"
    paths = [root / PHOTO_DIR / name for name in PHOTOS]
    if all(p.is_file() for p in paths):
        return paths
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise SystemExit(
            f"{cache}: the source photographs are missing and apt-get/dpkg are not available; "
            f"on a Debian/Ubuntu machine run `apt-get download {PACKAGE}` and "
            f"`dpkg -x {PACKAGE}_*.deb {root}`, or use bench/make_example.py for synthetic images"
        )
    cache.mkdir(parents=True, exist_ok=True)
    debs = sorted(cache.glob(f"{PACKAGE}_*.deb"))
    if not debs:
        print(f"downloading {PACKAGE} into {cache} ...", file=sys.stderr)
        if _apt_download(cache).returncode != 0:
            # a fresh container has no package lists yet
            update = subprocess.run(["apt-get", "update"], capture_output=True, text=True)
            if update.returncode != 0:
                raise SystemExit(
                    f"apt-get update failed (rc {update.returncode}): "
                    f"{update.stderr.strip()[-500:]}\n"
                    "run it as root, or download and unpack the package by hand (see --help)"
                )
            retry = _apt_download(cache)
            if retry.returncode != 0:
                raise SystemExit(
                    f"apt-get download {PACKAGE} failed: {retry.stderr.strip()[-500:]}"
                )
        debs = sorted(cache.glob(f"{PACKAGE}_*.deb"))
    subprocess.run(["dpkg", "-x", str(debs[-1]), str(root)], check=True)
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise SystemExit(
            f"{debs[-1].name}: unpacked, but these photographs are not in it: "
            f"{', '.join(missing)}; "
            f"update PHOTOS in {Path(__file__).name} to what {root / PHOTO_DIR} holds"
        )
    return paths


def _apt_download(cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["apt-get", "download", PACKAGE], cwd=cache, capture_output=True,
                          text=True)


def _load_sources(paths: list[Path]) -> None:
    """Pool initialiser: decode every photograph once per process, draw the grain fields."""
    global _GRAIN_LUMA, _GRAIN_CHROMA
    _SOURCES[:] = [Image.open(p).convert("RGB") for p in paths]
    # one fixed field per process, cut at a random offset per file: same pixels for the same seed
    rng = np.random.default_rng(0x9A1)
    _GRAIN_LUMA = rng.standard_normal((_GRAIN_SIDE, _GRAIN_SIDE, 1), dtype=np.float32)
    _GRAIN_CHROMA = rng.standard_normal((_GRAIN_SIDE, _GRAIN_SIDE, 3), dtype=np.float32)


# --- one image: a pure function of (seed, index) and the sources ---------------------------------

def render(seed: int, index: int) -> tuple[Image.Image, int, float]:
    """The picture for file ``index``, its quality offset and its draw for the fractional part."""
    rng = np.random.default_rng([seed, index])
    src = _SOURCES[int(rng.integers(len(_SOURCES)))]
    # output size: ImageNet-like, shorter side 256-500, aspect 1-1.6, one in five portrait
    short = int(rng.integers(256, 501))
    long = min(640, round(short * float(np.exp(rng.uniform(0.0, np.log(1.6))))))
    w, h = (short, long) if rng.random() < 0.2 else (long, short)
    # crop box with the output's aspect, from a quarter of the largest fitting box up to all of it
    max_w = min(src.width, src.height * w / h)
    crop_w = max(w, max_w * float(np.sqrt(rng.uniform(0.25, 1.0))))
    crop_w = min(crop_w, max_w)
    crop_h = crop_w * h / w
    x0 = rng.uniform(0.0, max(0.0, src.width - crop_w))
    y0 = rng.uniform(0.0, max(0.0, src.height - crop_h))
    img = src.resize((w, h), Image.LANCZOS, box=(x0, y0, x0 + crop_w, y0 + crop_h),
                     reducing_gap=2.0)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    for enhance in (ImageEnhance.Brightness, ImageEnhance.Contrast, ImageEnhance.Color):
        img = enhance(img).enhance(float(rng.uniform(0.9, 1.1)))
    # sensor-like grain, mostly in luma: real photos are never as clean as a downscaled wallpaper
    y, x = (int(v) for v in rng.integers(0, _GRAIN_SIDE - 640, size=2))
    grain = (_GRAIN_LUMA[y:y + h, x:x + w] * float(rng.uniform(2.0, 4.0))
             + _GRAIN_CHROMA[y:y + h, x:x + w] * 0.7)
    img = Image.fromarray(np.clip(np.asarray(img, dtype=np.float32) + grain + 0.5, 0, 255)
                          .astype(np.uint8))
    return img, int(rng.integers(-2, 3)), float(rng.random())


def encode(img: Image.Image, quality: int) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=max(1, min(100, quality)))
    return buf.getvalue()


def file_quality(base: float, offset: int, draw: float) -> int:
    """A fractional base quality is met on average: round up for that fraction of the files."""
    whole = int(base)
    return whole + offset + (1 if draw < base - whole else 0)


def _sizes_at_qualities(job: tuple[int, int]) -> list[int]:
    seed, index = job
    img, offset, _ = render(seed, index)
    return [len(encode(img, q + offset)) for q in CANDIDATE_QUALITIES]


def _write_one(job: tuple[int, int, float, str]) -> int:
    seed, index, quality, path = job
    img, offset, draw = render(seed, index)
    data = encode(img, file_quality(quality, offset, draw))
    with open(path, "wb") as f:
        f.write(data)
    return len(data)


# --- the folder --------------------------------------------------------------------------------

def calibrate(pool: mp.pool.Pool, seed: int, count: int, target_bytes: float) -> float:
    """Base quality whose mean size over a spread sample of the files meets the target.

    Between two whole qualities the mean size of a mix of files is linear in the mix, so the
    fractional quality interpolates the two measured means.
    """
    sample = np.unique(np.linspace(0, count - 1, min(count, CALIBRATION_SAMPLES)).astype(int))
    sizes = np.array(pool.map(_sizes_at_qualities, [(seed, int(i)) for i in sample], chunksize=8))
    means = sizes.mean(axis=0)
    table = ", ".join(f"q{q}={m / 1000:.0f}" for q, m in zip(CANDIDATE_QUALITIES, means))
    print(f"calibration on {len(sample)} files (mean KB): {table}", file=sys.stderr)
    if target_bytes <= means[0]:
        return float(CANDIDATE_QUALITIES[0])
    if target_bytes >= means[-1]:
        return float(CANDIDATE_QUALITIES[-1])
    k = int(np.searchsorted(means, target_bytes)) - 1  # means[k] < target <= means[k + 1]
    frac = (target_bytes - means[k]) / (means[k + 1] - means[k])
    return round(CANDIDATE_QUALITIES[k] + float(frac), 2)


def main(args: argparse.Namespace) -> int:
    photos = fetch_photos(args.cache)
    print(f"sources: {len(photos)} photographs from {photos[0].parent}: "
          f"{', '.join(p.name for p in photos)}", file=sys.stderr)
    dirs = prepare_out_dir(args.out_dir, args.classes, args.overwrite)
    workers = args.workers or len(os.sched_getaffinity(0))
    start = time.perf_counter()
    context = mp.get_context("fork")
    with context.Pool(workers, initializer=_load_sources, initargs=(photos,)) as pool:
        quality = args.quality
        if quality is None:
            quality = calibrate(pool, args.seed, args.count, args.target_kb * 1000)
        print(f"base JPEG quality {quality:g} (per-file offset -2..+2), 4:2:0", file=sys.stderr)
        width = max(6, len(str(args.count - 1)))
        jobs = [(args.seed, i, quality, str(dirs[i % args.classes] / f"img_{i:0{width}d}.jpg"))
                for i in range(args.count)]
        bar = tqdm(total=args.count, unit="img", disable=not sys.stderr.isatty())
        sizes = []
        for size in pool.imap(_write_one, jobs, chunksize=16):
            sizes.append(size)
            bar.update()
        bar.close()
    elapsed = time.perf_counter() - start
    sizes_kb = np.array(sizes) / 1000
    print(f"{args.out_dir}: {len(sizes)} files in {args.classes} classes, "
          f"{sizes_kb.sum() / 1000:.1f} MB, mean {sizes_kb.mean():.1f} KB "
          f"(median {np.median(sizes_kb):.1f}, "
          f"range {sizes_kb.min():.1f}-{sizes_kb.max():.1f} KB), "
          f"quality {quality:g}, seed {args.seed}, {elapsed:.1f} s")
    if args.quality is None and not 0.9 <= sizes_kb.mean() / args.target_kb <= 1.1:
        print(f"note: mean {sizes_kb.mean():.1f} KB is more than 10% from --target-kb "
              f"{args.target_kb:g}; pass --quality to adjust", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
