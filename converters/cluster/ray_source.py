"""Cluster packing from SRC (``fastload pack SRC --ray``): the local pack's own listing, made on the
driver (paths, sizes, labels, fields: no image is read), cut into parts of about one shard and
packed by plain Ray tasks (converters.cluster.ray_plan, ray_tasks), a few per CPU, each packing its
parts with the local pack's own loop, one small dataset each (ray_parts); ``ClusterPack`` (PackSink's
driver side, without Ray Data) then adopts them in listing order (its ``order`` column), so records, order,
labels and fields are a local pack's.

Not a Ray Data pipeline: Ray Data's scheduling cost ~0.13 s a task (about what a task's own work
on 64 MB of photos takes), and its blocks of listed rows bought nothing here. Users' own Ray Data
pipelines keep ``PackSink`` as their Datasink; the parts' datasets are the same kind either way.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from fastload.converters.cluster.cluster_pack import ClusterPack
from fastload.converters.cluster.ray_plan import IMAGE, KEY, LABEL, ORDER, part_source, plan_tasks
from fastload.converters.cluster.ray_tasks import run_tasks
from fastload.converters.cluster.task_shards import TaskPart
from fastload.converters.packing.options import check_options, check_out_location, default_out, on_error_spelling
from fastload.converters.packing.report import PackReport
from fastload.converters.sources.items import Layout, normalize_extensions
from fastload.converters.sources.listing import list_to_pack

from fastload.errors import SourceError
from fastload.format import NO_LABEL, StorageKind
from fastload.loading.ray_connect import probe
from fastload.storage.location import is_remote

_HOW = ("give the address of a running cluster's head (--ray-address or RAY_ADDRESS; `ray start --head` "
        "starts one), or neither to pack on a Ray of this pack's own")


def pack_on_ray(src: str | os.PathLike[str], out: str | os.PathLike[str] | None, *, address: str | None,
                format: StorageKind = "lmdb", shard_size: str | int = "256MB", extensions: list[str] | None = None,
                on_error: str = "raise", overwrite: bool = False, layout: Layout = "auto", check: str = "header",
                max_pixels: int, max_file_size: str | int, mask_storage: str = "rows", progress: bool = True,
                storage_options: dict[str, Any] | None = None, **listing_options: Any) -> PackReport:
    """Pack ``src`` (a folder, CSV/JSONL list, tables or WebDataset tars) into ``out`` on Ray: at
    ``address`` (``"auto"``: the running cluster; ``None``: a local Ray started for this pack, or
    the one this process is connected to already). ``progress=False`` also keeps the log lines of
    a Ray started here to errors. ``listing_options``: ``list_to_pack``'s
    (``root``, ``allow_outside_root``, ``table``); the listing's skips are the report's too."""
    started = time.perf_counter()
    on_error = on_error_spelling(on_error)
    import ray

    if address is not None and address not in ("auto", "local") and not address.startswith("ray://") \
            and not ray.is_initialized():
        probe(address, subject="Ray address", how=_HOW)  # before the listing: ray.init would wait minutes
    if is_remote(src):
        raise SourceError(f"{src}: --ray packs a local (or shared) folder; copy a store prefix to a shared folder "
                          "first (OUT may be a store URL)")
    options = check_options(format, shard_size, None, on_error, None, None, check, max_pixels, False,
                            max_file_size, mask_storage)
    src_path = Path(src)
    to_store = out is not None and is_remote(out)
    out_path: Any = str(out) if to_store else Path(os.path.realpath(out if out is not None else default_out(src_path)))
    exts = normalize_extensions(extensions)
    listing = list_to_pack(src, None, src_path, layout=layout, extensions=exts,
                           on_error=on_error, options=options, sidecars=False, file_columns=(), **listing_options)
    if not to_store:
        check_out_location(src_path, listing.root, out_path)
    if listing.file_fields:
        raise SourceError(f"{src}: its records have file fields ({', '.join(listing.file_fields)}), which --ray "
                          "does not pack yet; pack without --ray")
    labelled = listing.classes is not None or any(item.label != NO_LABEL for item in listing.items)
    pack = ClusterPack(out_path, image=IMAGE, label=LABEL if labelled else None, key=KEY, order=ORDER,
                       fields=dict(listing.fields), classes=listing.classes, format=format, shard_size=shard_size,
                       overwrite=overwrite, on_error=on_error, check=check, max_pixels=max_pixels,  # type: ignore[arg-type]
                       max_file_size=max_file_size, mask_storage=mask_storage,  # type: ignore[arg-type]
                       storage_options=storage_options,
                       origin={"source": listing.source or str(listing.root), "layout": listing.layout})
    listed_skips = [TaskPart(None, "", "", 0, [(s.rel, s.reason) for s in listing.skipped])] if listing.skipped else []
    source = part_source(listing, exts)
    started_here = not ray.is_initialized()
    if started_here:
        # Quiet (no progress): Ray's own INFO/WARNING lines ("Started a local Ray instance", its
        # token notice) are kept off stderr too; its errors still show.
        ray.init(address=address or "local", include_dashboard=False, log_to_driver=False,
                 logging_level=logging.INFO if progress else logging.ERROR)
    try:
        slices = plan_tasks(listing, pack.shard_bytes, int(ray.cluster_resources().get("CPU", 1)))
        pack.start()
        try:
            parts = run_tasks(slices, source, pack.settings, progress)
        except BaseException:
            pack.give_up()  # releases OUT's lock; the parts' datasets stay for a re-run
            raise
        report = pack.finish([*parts, *listed_skips])
    finally:
        if started_here:
            ray.shutdown()
    report.elapsed_s = time.perf_counter() - started
    return report
