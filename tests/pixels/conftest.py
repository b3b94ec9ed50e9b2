"""Pixel cache test data: a small dataset of photo-like images larger than the stored size (so the
cache stores them reduced), with a few smaller ones, a grey JPEG and PNGs, packed once per session."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from tests.conftest import make_image, write_tree

SIZES = [(320, 272), (272, 320), (400, 300), (300, 400), (288, 288), (512, 290), (200, 150), (260, 180)]
RECORDS = 24


def photo_files() -> dict[str, bytes]:
    """``RECORDS`` images in 3 classes: JPEGs of SIZES (quality 90), every 7th a PNG, one grey."""
    files = {}
    for i in range(RECORDS):
        img = make_image(*SIZES[i % len(SIZES)], seed=i)
        buf = io.BytesIO()
        if i % 7 == 6:
            img.save(buf, format="PNG")
            ext = "png"
        else:
            (img.convert("L") if i == 5 else img).save(buf, format="JPEG", quality=90)
            ext = "jpg"
        files[f"c{i % 3}/{i:03d}.{ext}"] = buf.getvalue()
    return files


@pytest.fixture(scope="session")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packed dataset (LMDB, several shards). Read-only: copy it to change it."""
    from fastload.converters import pack

    base = tmp_path_factory.mktemp("pixels")
    write_tree(base / "images", photo_files())
    out = base / "photos.fl"
    pack(base / "images", out, shard_size="200KB", workers=2, progress=False)
    return out


def image_of(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data))
