"""Output folder of the benchmark image generators: an ImageFolder tree of class_* folders."""

from __future__ import annotations

import shutil
from pathlib import Path


def prepare_out_dir(out_dir: Path, classes: int, overwrite: bool) -> list[Path]:
    """Create ``class_000 … class_NNN`` under ``out_dir``; a non-empty folder needs ``overwrite``."""
    if out_dir.exists() and any(out_dir.iterdir()):
        if not overwrite:
            raise SystemExit(f"{out_dir}: not empty; "
                             "pass --overwrite to replace its class_* folders")
        for child in out_dir.glob("class_*"):
            shutil.rmtree(child)
        if any(out_dir.iterdir()):
            raise SystemExit(f"{out_dir}: holds files other than class_* folders; "
                             "choose an empty folder")
    width = max(3, len(str(classes - 1)))
    dirs = [out_dir / f"class_{c:0{width}d}" for c in range(classes)]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    return dirs
