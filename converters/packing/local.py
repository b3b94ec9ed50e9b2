"""A pack into a local folder: OUT's lock, "already packed", and a replacement staged then swapped in."""

from __future__ import annotations

from pathlib import Path

from fastload.converters.destination.out_dir import (
    OutFolder,
    PackLock,
    inspect_out,
    prepare_out,
    remove_dataset,
    staging_path,
    swap_in,
)
from fastload.converters.packing.dataset_pack import DatasetPackJob
from fastload.converters.packing.job import PackJob
from fastload.converters.packing.report import PackReport, already_packed
from fastload.errors import PackError


def pack_local(job: PackJob | DatasetPackJob, out_path: Path, overwrite: bool) -> PackReport:
    folder = _check_replaceable(inspect_out(out_path), job, overwrite)
    if folder.state == "dataset" and folder.manifest is not None and job.same_pack(folder.manifest):
        return already_packed(out_path, folder.manifest)  # only read: OUT may be read-only media
    if folder.state == "new":
        prepare_out(out_path)
    with PackLock(out_path) as out_lock:
        folder = _check_replaceable(inspect_out(out_path), job, overwrite)  # again, under the lock
        if folder.state == "dataset" and folder.manifest is not None and job.same_pack(folder.manifest):
            return already_packed(out_path, folder.manifest)
        if folder.state != "dataset":
            report = job.pack_into(out_path)
        else:
            staging = staging_path(out_path)
            staged = inspect_out(staging)
            if staged.state == "dataset" and staged.manifest is not None:
                remove_dataset(staging, staged.manifest)  # a replacement killed before its swap
            prepare_out(staging)
            with PackLock(staging) as new_lock:
                report = job.pack_into(staging)
                swap_in(staging, out_path)
                new_lock.path, out_lock.path = out_lock.path, new_lock.path  # each went with its folder
            remove_dataset(staging, folder.manifest)  # the old dataset, now at the staging name
    report.moved_to(out_path)
    return report


def _check_replaceable(folder: OutFolder, job: PackJob | DatasetPackJob, overwrite: bool) -> OutFolder:
    """A finished dataset at OUT is replaced only with ``overwrite`` and when it holds nothing else."""
    if folder.state != "dataset" or folder.manifest is None or job.same_pack(folder.manifest):
        return folder
    if not overwrite:
        raise PackError(f"{folder.path}: already holds a finished dataset (packed from "
                        f"{folder.manifest.packed.get('source', '?')}); pass --overwrite to replace it")
    if folder.foreign:
        raise PackError(f"{folder.path}: holds files that are not part of its dataset "
                        f"({', '.join(folder.foreign[:3])}{', ...' if len(folder.foreign) > 3 else ''}); "
                        "--overwrite replaces only a folder that holds a fastload dataset alone: "
                        "move them out or choose another -o")
    return folder
