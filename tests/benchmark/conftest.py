"""Benchmark test data: a small ImageFolder tree of photo-like JPEGs and its LMDB and HDF5 packs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import make_jpeg, write_tree

CLASSES, PER_CLASS = 3, 12


def photo_files(count_per_class: int = PER_CLASS) -> dict[str, bytes]:
    """``{"c0/000.jpg": bytes, ...}``: gradients with shapes, large enough for a 32 px crop."""
    return {f"c{c}/{i:03d}.jpg": make_jpeg(96 + 8 * (i % 4), 72 + 4 * (i % 3), seed=c * 100 + i)
            for c in range(CLASSES) for i in range(count_per_class)}


@pytest.fixture(scope="session")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``photos("folder" | "lmdb" | "hdf5")`` → the folder, or its packed copy (made once, read-only)."""
    from fastload.converters import pack

    base = tmp_path_factory.mktemp("bench-data")
    folder = base / "images"
    write_tree(folder, photo_files())
    made: dict[str, Path] = {"folder": folder}

    def get(kind: str) -> Path:
        if kind not in made:
            out = base / f"images-{kind}.fl"
            pack(folder, out, format=kind, workers=2, progress=False)
            made[kind] = out
        return made[kind]

    return get
