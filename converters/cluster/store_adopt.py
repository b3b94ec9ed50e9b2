"""Cluster packing to an object store, driver side: the tasks' parts (in the pack folder
``gen-<16 hex>/<digest>/``) adopted as one dataset in that folder, manifest last.

No shard byte passes through the driver: each part's shard is copied by the store itself to its
number in the pack (``gen-…/shard-00007.lmdb``, a server-side copy). Each part's manifest and index
columns (small: ~100 bytes a record) are fetched to a local folder, joined there column by column
as for a shared folder (converters.cluster.adopt), and uploaded; then the manifest is published
with a conditional PUT (refused if the published one changed), and every object of the prefix that
is fastload's and not the new dataset's (the parts, a retried task's copy, the replaced dataset) is
deleted: nothing is left but the dataset, and nothing that is not fastload's is ever touched.
"""

from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fastload.converters.cluster.adopt import (
    finished_report,
    join_index,
    ordered_parts,
    pack_manifest,
    placed_shards,
    plan_of,
)
from fastload.converters.cluster.task_shards import SinkSettings, TaskPart
from fastload.converters.destination.out_dir import dataset_entries
from fastload.converters.destination.store_lease import StoreLease
from fastload.converters.destination.upload import (
    _fastloads,
    _in_generation,
    _list,
    _publish,
    _published,
    _put,
)
from fastload.converters.packing.report import PackReport, write_skipped_report

from fastload.config import cache_dir
from fastload.errors import FastloadError, PackError
from fastload.format import MANIFEST_NAME, SKIPPED_REPORT_NAME, Manifest
from fastload.format.layout import STORE_LEASE_NAME
from fastload.format.manifest import MAX_MANIFEST_BYTES, parse_manifest
from fastload.storage.remote import RemoteObject, RemoteStore

IN_FLIGHT = 16
"""Requests at once: parts' files fetched, shards copied, index columns uploaded."""


def adopt_in_store(store: RemoteStore, generation: str, parts: list[TaskPart | None], settings: SinkSettings,
                   lease: StoreLease, replaces: str | None) -> PackReport:
    """Publish the parts in ``store``'s folder ``generation`` as the dataset at ``store.url``,
    replacing the published manifest whose ETag is ``replaces`` (None: none there)."""
    written, skipped = ordered_parts(store.url, parts)
    objects = _list(store)
    old, _ = _published(store, objects)
    ours = _fastloads(store, objects, old, lease.generations)
    prefix = generation + "/"
    (Path(cache_dir(None)) / "packs").mkdir(parents=True, exist_ok=True)
    local = Path(tempfile.mkdtemp(prefix="fastload-ray-finalize-", dir=Path(cache_dir(None)) / "packs"))
    try:
        work = local / "parts"
        with ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="fastload-finalize") as pool:
            manifests = list(pool.map(lambda p: _fetch_part(store, prefix + p.folder, work / p.folder, objects),
                                      written))
            placed = list(placed_shards(written, manifests))
            copied = dict(zip((shard.file for _, shard in placed),
                              pool.map(lambda ps: _copy(store, prefix + ps[0], prefix + ps[1].file), placed)))
            classes, index = join_index(local, work, written, manifests, settings)
            report_path = write_skipped_report(local, skipped)
            staged = pack_manifest(manifests, [shard for _, shard in placed], index, classes, skipped,
                                   report_path is not None, plan_of(written, settings), settings.origin)
            files = [e.file for e in index.values()] + ([SKIPPED_REPORT_NAME] if report_path else [])
            list(pool.map(lambda name: _put(store, local / name, prefix + name), files))
            manifest = _in_generation(staged, generation, copied)
            lease.check()
            _publish(store, manifest, replaces)
            # the new dataset is the one readers open from here on: the parts and the old dataset's objects go
            keep = dataset_entries(manifest) | {STORE_LEASE_NAME}
            gone = [name for name in ours if name not in keep]
            list(pool.map(store.remove, [gone[k::IN_FLIGHT] for k in range(IN_FLIGHT)]))
    finally:
        shutil.rmtree(local, ignore_errors=True)
    report = finished_report(Path(store.url), manifest, written, skipped, None)
    report.out = store.url  # type: ignore[assignment]
    if report_path is not None:
        report.skipped_report = store.display(prefix + SKIPPED_REPORT_NAME)  # type: ignore[assignment]
    return report


def _fetch_part(store: RemoteStore, prefix: str, folder: Path, objects: dict[str, RemoteObject]) -> Manifest:
    """A finished part's manifest and index columns, fetched into ``folder``; PackError when a shard
    it names is not in the store as it was written (a task's upload replaced since)."""
    name = f"{prefix}/{MANIFEST_NAME}"
    try:
        manifest = parse_manifest(store.read_file(name, MAX_MANIFEST_BYTES).decode("utf-8", "replace"),
                                  store.display(name))
    except (FastloadError, OSError) as exc:
        raise PackError(f"{store.display(name)}: a write task's part cannot be read ({exc}); run the same pack "
                        "again: its finished parts are reused") from None
    for shard in manifest.shards:
        there = objects.get(f"{prefix}/{shard.file}")
        if there is None or there.size != shard.bytes or there.etag != shard.etag:
            raise PackError(f"{store.display(prefix + '/' + shard.file)}: is not the shard its write task uploaded "
                            "(missing or replaced since); run the same pack again: that part is written again")
    (folder / "index").mkdir(parents=True, exist_ok=True)
    for entry in manifest.index.values():
        size = objects[f"{prefix}/{entry.file}"].size if f"{prefix}/{entry.file}" in objects else 2**40
        (folder / entry.file).write_bytes(store.read_file(f"{prefix}/{entry.file}", size))
    return manifest


def _copy(store: RemoteStore, source: str, target: str) -> RemoteObject:
    """The store copies ``source`` to ``target`` itself (no byte through here); what it then holds."""
    try:
        return store.copy(source, target)
    except (FastloadError, OSError) as exc:
        raise PackError(f"{exc}; run the same pack again: its finished parts are reused") from None
