"""What a benchmark runs on: SRC resolved into an image folder and packed datasets of its records.

``SRC`` may be an image folder, a packed dataset, or a folder with ``--packed`` datasets of it:

- a packed dataset whose manifest names a source folder that still exists brings that folder
  as the baseline;
- every file the folder baseline reads is checked once, up front, as ``fastload pack`` checks
  it (header and end marker): files that cannot be decoded are left out of every row, counted,
  and named in a note, so one broken file costs no row its result;
- a folder with no ``--packed`` uses ``SRC.fl`` (``fastload pack``'s default output) when it
  holds a finished dataset; otherwise a random sample of at most ``temp_pack`` files is packed
  into a temporary LMDB dataset, deleted after the run, and the baseline reads the same sample.

SRC and ``--packed`` may be store URLs (``s3://bucket/images/``, ``s3://bucket/images.fl``): a
prefix of image objects is the baseline (one GET per object, see :mod:`.far`), a dataset in a store
brings the source prefix its manifest names when that still lists; nothing is packed for a store
SRC without a packed copy (the rows of the small objects run alone, with a note).
"""

from __future__ import annotations

import csv
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from fastload.benchmark.baseline import ImageFolderBaseline
from fastload.benchmark.stages import READS_IN_FLIGHT
from fastload.config import MAX_FILE_SIZE, parse_size
from fastload.errors import SourceError, SourceNotFoundError
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


@contextmanager
def resolve(src: str | os.PathLike[str], packed: Sequence[str | os.PathLike[str]] = (), *,
            image_size: int = 224, temp_pack: int = 2000, work: str | os.PathLike[str] | None = None,
            seed: int = 0, pack_missing: bool = True,
            storage_options: dict[str, Any] | None = None) -> Iterator[Inputs]:
    """Resolve SRC and ``packed`` (checked up front: a bad path fails before anything runs).

    ``pack_missing=False`` leaves a folder with no packed copy as it is (doctor needs none).
    ``storage_options``: the object store's options, for the URLs among them.
    """
    if any(is_remote(p) for p in (src, *packed)):
        inputs = _resolve_remote(src, packed, image_size, storage_options)
        if inputs.baseline is not None and not is_remote(inputs.src):
            _leave_out_unreadable(inputs)
        inputs.cache_dir = tempfile.mkdtemp(prefix="fastload-bench-cache-", dir=work)
        if any(is_remote(p) for p in inputs.packed):
            inputs.notes.append(f"datasets in a store read through a temporary node cache in "
                                f"{inputs.cache_dir} (deleted after the run), not yours: epoch 1 is cold")
        try:
            yield inputs
        finally:
            shutil.rmtree(inputs.cache_dir, ignore_errors=True)
        return
    if storage_options:
        raise ValueError(f"{src}: storage options are for object-store URLs (s3://...), not local paths")
    root = Path(src)
    if not root.exists():
        raise SourceNotFoundError(f"{root}: no such image folder or packed dataset; check the path")
    if not root.is_dir():
        raise SourceError(f"{root}: is a file; pass an image folder or a packed dataset "
                          "(the directory `fastload pack` writes)")
    extra = [Path(p) for p in packed]
    for path in extra:
        read_manifest(path)  # a clear error for a path that is not a finished dataset
    if is_packed(root):
        read_manifest(root)
        inputs = Inputs(root, "packed", _source_folder(root, image_size), [root, *extra])
        if inputs.baseline is not None:
            inputs.notes.append(f"baseline: the source folder in the manifest, "
                                f"{inputs.baseline.root}")
            _leave_out_unreadable(inputs)
        yield inputs
        return
    baseline = ImageFolderBaseline.from_folder(root, image_size)
    inputs = Inputs(root, "folder", baseline, extra)
    default = root.with_name(root.name + ".fl")
    if not extra and is_packed(default):
        inputs.packed.append(default)
        inputs.notes.append(f"packed: {default} (fastload pack's default output for {root})")
    if inputs.packed or not pack_missing:
        _leave_out_unreadable(inputs)
        _check_counts(inputs)
        yield inputs
        return
    temp = Path(tempfile.mkdtemp(prefix="fastload-bench-", dir=work))
    try:
        yield _pack_sample(inputs, temp, temp_pack, seed)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _resolve_remote(src: str | os.PathLike[str], packed: Sequence[str | os.PathLike[str]], image_size: int,
                    options: dict[str, Any] | None) -> Inputs:
    """SRC and ``packed`` where some are store URLs (the others local paths)."""
    from fastload.errors import DatasetNotFoundError
    from fastload.storage.packed import locate_packed

    def dataset(where: str | os.PathLike[str]) -> Path | str:
        location = locate_packed(where, options if is_remote(where) else None)
        location.manifest()  # a clear error for a place that is not a finished dataset
        return location.root

    extra = [dataset(p) for p in packed]
    if not is_remote(src):
        local = Path(src)
        if is_packed(local):
            return Inputs(local, "packed", _source_folder(local, image_size), [local, *extra],
                          storage_options=options)
        return Inputs(local, "folder", ImageFolderBaseline.from_folder(local, image_size), extra,
                      storage_options=options)
    url = str(src).rstrip("/")
    try:
        root = dataset(url)
    except DatasetNotFoundError:
        root = None
    if root is not None:
        source = locate_packed(url, options).manifest().packed.get("source")
        inputs = Inputs(url, "packed", None, [root, *extra], storage_options=options)
        if source and is_remote(source):
            try:
                _store_baseline(inputs, source, options, image_size)
                inputs.notes.append(f"baseline: the source objects in the manifest, {source}")
            except (SourceError, OSError):
                pass
        return inputs
    inputs = Inputs(url, "folder", None, extra, storage_options=options)
    _store_baseline(inputs, url, options, image_size)
    default = f"{url}.fl"
    if not extra:
        try:
            inputs.packed.append(dataset(default))
            inputs.notes.append(f"packed: {default} (fastload pack's default output for {url})")
        except DatasetNotFoundError:
            inputs.notes.append(f"no packed copy of {url}: the small objects run alone; pack them with "
                                f"`fastload pack {url} -o {default}`, then `fastload bench {url} "
                                f"--packed {default}`")
    return inputs


def _store_baseline(inputs: Inputs, url: str, options: dict[str, Any] | None, image_size: int) -> None:
    """The objects under ``url`` as the baseline; those pack would refuse by size are named in a note."""
    from fastload.benchmark.far import StoreObjects

    objects = StoreObjects.from_store(url, options, image_size)  # an empty prefix: upload the images first
    problems = _object_problems(objects)
    bad = [(name, why) for (name, _), why in zip(objects.samples, problems) if why]
    _leave_out(inputs, url, bad, len(objects))
    if bad:
        keep = [k for k, why in enumerate(problems) if not why]
        objects = StoreObjects(objects.store, [objects.samples[k] for k in keep], [objects.sizes[k] for k in keep],
                               image_size, objects.skipped)
    inputs.baseline = objects
    if objects.skipped:  # too large to fetch (what pack would refuse by size), named as the undecodable are
        inputs.skipped = [*objects.skipped, *inputs.skipped]
        inputs.notes.insert(0, skipped_note(objects.skipped))


def _object_problems(objects: Any) -> list[str | None]:
    """Each object checked as ``fastload pack`` checks a file (fetched a batch of GETs at a time)."""
    from fastload.converters.packing.checks import InvalidFile, check_image

    def problem(data: bytes) -> str | None:
        try:
            check_image(data)
        except InvalidFile as exc:
            return exc.reason
        return None

    out: list[str | None] = []
    for start in range(0, len(objects), READS_IN_FLIGHT):
        out += [problem(data) for data in objects.read_many(list(range(start, min(start + READS_IN_FLIGHT,
                                                                                   len(objects)))))]
    return out


def _source_folder(dataset: Path, image_size: int) -> ImageFolderBaseline | None:
    packed = read_manifest(dataset).packed
    source = packed.get("source")
    if packed.get("layout") not in ("imagefolder", "flat") or not source or not Path(source).is_dir():
        return None
    try:
        return ImageFolderBaseline.from_folder(source, image_size)
    except (SourceError, OSError):
        return None


def _leave_out_unreadable(inputs: Inputs) -> None:
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
    _leave_out(inputs, root, bad, len(baseline))
    if bad:
        inputs.baseline = ImageFolderBaseline([s for s, why in zip(baseline.samples, problems) if not why],
                                              baseline.image_size, root=baseline.root)


def _leave_out(inputs: Inputs, root: Any, bad: list[tuple[str, str]], total: int) -> None:
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


def _check_counts(inputs: Inputs) -> None:
    assert inputs.baseline is not None
    for path in inputs.packed:
        records = read_manifest(path).num_records
        if records != len(inputs.baseline):
            inputs.notes.append(f"{path} holds {records} records, {inputs.src} {len(inputs.baseline)} "
                                "files: the rows do not read the same records")


def _pack_sample(inputs: Inputs, temp: Path, limit: int, seed: int) -> Inputs:
    """Pack at most ``limit`` random files of the folder into ``temp``; the baseline reads the same."""
    from fastload.converters import pack

    baseline = inputs.baseline
    assert baseline is not None
    keep = np.sort(np.random.default_rng(seed).permutation(len(baseline))[:limit])
    inputs.baseline = ImageFolderBaseline([baseline.samples[int(i)] for i in keep], baseline.image_size,
                                          root=baseline.root)
    _leave_out_unreadable(inputs)  # the sample's files: pack refuses what cannot be decoded
    samples = inputs.baseline.samples
    listing = temp / "sample.csv"
    labelled = any(label >= 0 for _, label in samples)
    with open(listing, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["path", "label"])
        writer.writerows((os.path.abspath(p), label if labelled else "") for p, label in samples)
    out = temp / "sample.fl"
    pack(listing, out, format="lmdb", progress=False, allow_outside_root=True)  # our own list of its files
    inputs.baseline = ImageFolderBaseline(samples, baseline.image_size, root=baseline.root)
    inputs.packed, inputs.temporary = [out], True
    what = ("all" if len(samples) == len(baseline) else f"the {len(samples)} readable of the"
            if len(keep) == len(baseline) else f"a random sample of {len(samples)} of the")
    inputs.notes.append(f"packed {what} {len(baseline)} files of {inputs.src} into a temporary LMDB "
                        f"dataset in {temp} (deleted after the run); to keep one: "
                        f"`fastload pack {inputs.src}`, then `fastload bench {inputs.src} --packed "
                        f"{inputs.src}.fl`")
    if os.stat(temp).st_dev != os.stat(inputs.src).st_dev:
        inputs.notes.append(f"the temporary dataset is on another filesystem than {inputs.src}: "
                            "pass --work DIR on the same disk for a like-for-like comparison")
    return inputs
