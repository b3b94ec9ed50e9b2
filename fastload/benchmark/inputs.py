"""What a benchmark runs on (Inputs), and the baseline's files that cannot be decoded, left out and named."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastload.benchmark.baseline import ImageFolderBaseline
from fastload.benchmark.stages import READS_IN_FLIGHT
from fastload.config import MAX_FILE_SIZE, parse_size
from fastload.errors import SourceError
from fastload.format import MANIFEST_NAME, read_manifest
from fastload.format.files import read_regular
from fastload.storage.location import is_remote

SHOW_SKIPPED = 5  # files named in the note; all of them are in the JSON report


@dataclass
class Inputs:
    """The folder baseline (None without a folder) and the packed datasets, in SRC's order."""

    src: Path | str  # a URL for a store
    src_kind: str  # "folder" or "packed": what SRC itself is (what doctor diagnoses)
    baseline: ImageFolderBaseline | None
    packed: list[Path | str]  # URLs for datasets in a store
    notes: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path below the folder, reason)
    temporary: bool = False  # packed[0] is a sample bench packed itself, deleted after the run
    storage_options: dict[str, Any] | None = None  # for the URLs among them
    cache_dir: str | None = None  # a temporary node cache for the datasets in a store

    @property
    def remote(self) -> bool:
        """Whether anything here is in an object store."""
        return any(is_remote(p) for p in (self.src, *self.packed))


def is_packed(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST_NAME).exists()


def source_folder(dataset: Path, image_size: int) -> ImageFolderBaseline | None:
    packed = read_manifest(dataset).packed
    source = packed.get("source")
    if packed.get("layout") not in ("imagefolder", "flat") or not source or not Path(source).is_dir():
        return None
    try:
        return ImageFolderBaseline.from_folder(source, image_size)
    except (SourceError, OSError):
        return None


def leave_out_unreadable(inputs: Inputs) -> None:
    """Check each file of the baseline as ``fastload pack`` does; leave out, count and name the
    ones that cannot be decoded (every row then reads the same, readable files)."""
    from fastload.converters.packing.checks import InvalidFile, check_image

    baseline = inputs.baseline
    assert baseline is not None
    limit = parse_size(MAX_FILE_SIZE)

    def problem(path: str) -> str | None:
        try:
            # bounded as the packer reads: a regular file of at most `fastload pack`'s --max-file-size
            check_image(read_regular(path, limit))
        except InvalidFile as exc:
            return exc.reason
        except OSError as exc:
            return f"cannot be read ({exc.strerror or exc})"
        return None

    with ThreadPoolExecutor(READS_IN_FLIGHT, thread_name_prefix="fastload-bench-check") as pool:
        problems = list(pool.map(problem, baseline.files))
    root = baseline.root or inputs.src
    bad = [(os.path.relpath(path, root), why) for (path, _), why in zip(baseline.samples, problems) if why]
    leave_out(inputs, root, bad, len(baseline))
    if bad:
        inputs.baseline = ImageFolderBaseline([s for s, why in zip(baseline.samples, problems) if not why],
                                              baseline.image_size, root=baseline.root)


def leave_out(inputs: Inputs, root: Any, bad: list[tuple[str, str]], total: int) -> None:
    """Count and name the ``bad`` files (or objects) every row leaves out; none good is an error."""
    if not bad:
        return
    if len(bad) == total:
        raise SourceError(f"{root}: none of its {len(bad)} image files can be decoded (first: "
                          f"{bad[0][0]}: {bad[0][1]}); check that it is the right folder")
    inputs.skipped = bad
    inputs.notes.insert(0, skipped_note(bad))


def skipped_note(bad: Sequence[tuple[str, str]]) -> str:
    """``skipped 1 file that cannot be decoded: cat/bad.jpg (reason)``, naming the first few."""
    named = ", ".join(f"{path} ({why})" for path, why in bad[:SHOW_SKIPPED])
    more = f", and {len(bad) - SHOW_SKIPPED} more" if len(bad) > SHOW_SKIPPED else ""
    files = "1 file that cannot" if len(bad) == 1 else f"{len(bad)} files that cannot"
    return f"skipped {files} be decoded: {named}{more} (left out of every row)"
