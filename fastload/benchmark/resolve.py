"""SRC resolved into what a benchmark runs on: an image folder and packed datasets of its records.

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
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from fastload.benchmark.baseline import ImageFolderBaseline
from fastload.benchmark.inputs import Inputs, is_packed, leave_out_unreadable, source_folder
from fastload.benchmark.store_inputs import resolve_remote
from fastload.errors import SourceError, SourceNotFoundError
from fastload.format import read_manifest
from fastload.storage.location import is_remote


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
        inputs = resolve_remote(src, packed, image_size, storage_options)
        if inputs.baseline is not None and not is_remote(inputs.src):
            leave_out_unreadable(inputs)
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
        inputs = Inputs(root, "packed", source_folder(root, image_size), [root, *extra])
        if inputs.baseline is not None:
            inputs.notes.append(f"baseline: the source folder in the manifest, "
                                f"{inputs.baseline.root}")
            leave_out_unreadable(inputs)
        yield inputs
        return
    baseline = ImageFolderBaseline.from_folder(root, image_size)
    inputs = Inputs(root, "folder", baseline, extra)
    default = root.with_name(root.name + ".fl")
    if not extra and is_packed(default):
        inputs.packed.append(default)
        inputs.notes.append(f"packed: {default} (fastload pack's default output for {root})")
    if inputs.packed or not pack_missing:
        leave_out_unreadable(inputs)
        _check_counts(inputs)
        yield inputs
        return
    temp = Path(tempfile.mkdtemp(prefix="fastload-bench-", dir=work))
    try:
        yield _pack_sample(inputs, temp, temp_pack, seed)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


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
    leave_out_unreadable(inputs)  # the sample's files: pack refuses what cannot be decoded
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
