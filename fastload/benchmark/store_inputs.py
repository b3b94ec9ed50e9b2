"""What a benchmark runs on when SRC or ``--packed`` are store URLs: datasets in a store, objects as the baseline."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastload.benchmark.baseline import ImageFolderBaseline
from fastload.benchmark.inputs import Inputs, is_packed, leave_out, skipped_note, source_folder
from fastload.benchmark.stages import READS_IN_FLIGHT
from fastload.errors import SourceError
from fastload.storage.location import is_remote


def resolve_remote(src: str | os.PathLike[str], packed: Sequence[str | os.PathLike[str]], image_size: int,
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
            return Inputs(local, "packed", source_folder(local, image_size), [local, *extra],
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
    leave_out(inputs, url, bad, len(objects))
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
