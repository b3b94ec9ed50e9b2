"""The options a pack is given, checked once into what the pack loop runs with; where OUT goes."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from fastload.converters.packing.restarts import check_available
from fastload.converters.writers import WRITERS

from fastload.config import available_cpus, parse_size
from fastload.decode.images import pixel_limit
from fastload.errors import PackError
from fastload.format import FORMAT_VERSION
from fastload.format.layout import MASK_STORAGES


def default_out(src: Path) -> Path:
    """``./images`` → ``./images.fl``; ``./train.csv`` → ``./train.fl``."""
    if "{" in src.name:  # a brace list of tars: data-{000..009}.tar → data.fl
        stem = src.name.split("{", 1)[0].rstrip("-_.") or "shards"
        return Path(os.path.abspath(src.parent)) / (stem + ".fl")
    src = Path(os.path.abspath(src))
    return src.with_suffix(".fl") if src.is_file() else src.with_name(src.name + ".fl")


def default_workers() -> int:
    """Reads are I/O: keep several in flight even on 2 cores (a cold disk serves many at once)."""
    return min(16, max(4, 4 * available_cpus()))


ON_ERROR = ("raise", "skip")
"""What a bad file or sample does: the pack raises naming it, or it is skipped, counted and
reported; spelled as ``PackedDataset``'s ``on_error`` (``"fail"``, the spelling packs had
first, is taken for ``"raise"`` with a DeprecationWarning)."""


def on_error_spelling(on_error: str, stacklevel: int = 3) -> str:
    """``on_error`` checked, ``"fail"`` as ``"raise"`` (with a DeprecationWarning at the caller's caller)."""
    if on_error == "fail":
        warnings.warn("on_error='fail' is spelled on_error='raise' now, as PackedDataset spells it; "
                      "'fail' still works but will go", DeprecationWarning, stacklevel=stacklevel)
        return "raise"
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error={on_error!r}: choose 'raise' (stop at the first bad one) or 'skip'")
    return on_error


def digest_on_error(on_error: str) -> str:
    """``on_error`` as shard plan digests spell it: ``"fail"``, so packs made before the rename
    stay "already packed" and resume their finished shards."""
    return "fail" if on_error == "raise" else on_error


def check_options(format: str, shard_size: str | int, workers: int | None, on_error: str,
                   max_side: int | None, quality: int | None, check: str, max_pixels: int,
                   restart_markers: bool, max_file_size: str | int, mask_storage: str = "rows") -> dict[str, Any]:
    if format not in WRITERS:
        raise ValueError(f"format={format!r}: choose one of {', '.join(WRITERS)}")
    on_error = on_error_spelling(on_error, stacklevel=4)
    if mask_storage not in MASK_STORAGES:
        raise ValueError(f"mask_storage={mask_storage!r}: choose 'rows' (a crop decodes its rows alone) or 'file'")
    if check not in ("header", "decode"):
        raise ValueError(f"check={check!r}: choose 'header' or 'decode'")
    if workers is not None and workers < 1:
        raise ValueError(f"workers={workers}: must be at least 1")
    if max_side is not None and max_side < 1:
        raise ValueError(f"max_side={max_side}: must be a positive number of pixels")
    if quality is not None and not 1 <= quality <= 100:
        raise ValueError(f"quality={quality}: must be between 1 and 100")
    max_pixels = pixel_limit(max_pixels)  # a positive whole number; 5e8 is one
    if restart_markers:
        check_available()
    reencode = {"max_side": max_side, "quality": quality or 90} if (max_side or quality) else None
    return {"format_version": FORMAT_VERSION, "storage": format,
            "shard_size": parse_size(shard_size, name="shard_size"), "workers": workers or default_workers(),
            "on_error": on_error, "reencode": reencode, "check": check, "max_pixels": max_pixels,
            "restart_markers": bool(restart_markers),
            "max_file_size": parse_size(max_file_size, name="max_file_size"), "mask_storage": mask_storage}


def check_out_location(src: Path, src_root: Path, out: Path) -> None:
    real_out, real_root = Path(os.path.realpath(out)), Path(os.path.realpath(src_root))
    if src.is_dir() and (real_out == real_root or real_root in real_out.parents):
        raise PackError(f"{out}: the output is inside the source folder {src}; "
                        "choose an -o outside it (default: SRC.fl next to SRC)")
    if real_out in real_root.parents:
        raise PackError(f"{out}: the source {src} is inside the output folder; choose another -o")
