"""Cluster packing to an object store, write-task side: a task's rows written as a small dataset in
a local temporary folder (a ``fastload.Writer``, as for a shared folder), then uploaded into the
pack's work folder in the store, ``<work>/<digest>/``: shards, index columns, skipped report, and
its manifest last, naming each shard's ETag.

A task's part is finished in the store exactly when that manifest is there and every shard it
names is there with its size and ETag: a task Ray re-runs (a node lost) or a pack re-run after its
driver was killed finds it so and uploads nothing again; a part cut short by a kill is written again.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastload.errors import FastloadError, ManifestError, PackError
from fastload.format import MANIFEST_NAME, SKIPPED_REPORT_NAME, Manifest, read_manifest
from fastload.format.manifest import MAX_MANIFEST_BYTES, parse_manifest
from fastload.storage.remote import RemoteObject, RemoteStore

UPLOADS_IN_FLIGHT = 8
"""A part's files uploaded at once (its shards and a dozen small index columns)."""
_MAX_REPORT_BYTES = 2**30


def write_part_to_store(url: str, storage_options: dict[str, Any] | None,
                        write_local: Callable[[Path], tuple[int, list[tuple[str, str]], int]]
                        ) -> tuple[int, list[tuple[str, str]], int]:
    """Make the part at ``url`` (the work folder's ``<digest>``) with ``write_local`` (which writes
    the task's dataset in the local folder it is given), or find it finished there: its record count
    (0: every sample skipped, nothing uploaded), its skips and its shards found finished."""
    store = RemoteStore(url, storage_options)
    done = finished_part(store)
    if done is not None:
        return done.num_records, part_skips(store, done), len(done.shards)
    local = Path(tempfile.mkdtemp(prefix="fastload-ray-part-"))
    digest = url.rstrip("/").rsplit("/", 1)[-1]
    try:
        records, skipped, _ = write_local(local / digest)
        if records:
            upload_part(local / digest, store)
        return records, skipped, 0
    finally:
        shutil.rmtree(local, ignore_errors=True)


def finished_part(store: RemoteStore) -> Manifest | None:
    """The manifest of the part finished in ``store``, every shard there as it names it; else None."""
    objects = {name: RemoteObject(size, etag) for name, size, etag in store.list_objects()}
    if MANIFEST_NAME not in objects:
        return None
    try:
        manifest = parse_manifest(store.read_file(MANIFEST_NAME, MAX_MANIFEST_BYTES).decode("utf-8", "replace"),
                                  store.display(MANIFEST_NAME))
    except (ManifestError, FileNotFoundError):
        return None
    shards_there = all(s.file in objects and objects[s.file].size == s.bytes and objects[s.file].etag == s.etag
                       for s in manifest.shards)
    return manifest if shards_there and all(e.file in objects for e in manifest.index.values()) else None


def upload_part(folder: Path, store: RemoteStore) -> None:
    """Upload the finished dataset at ``folder`` to ``store``: every file, then its manifest (naming
    each shard's ETag), last."""
    manifest = read_manifest(folder)
    files = [s.file for s in manifest.shards] + [e.file for e in manifest.index.values()]
    if (folder / SKIPPED_REPORT_NAME).is_file():
        files.append(SKIPPED_REPORT_NAME)
    with ThreadPoolExecutor(UPLOADS_IN_FLIGHT, thread_name_prefix="fastload-part-upload") as pool:
        uploaded = dict(zip(files, pool.map(lambda name: _put(store, folder / name, name), files)))
    shards = [dataclasses.replace(s, etag=uploaded[s.file].etag) for s in manifest.shards]
    try:
        store.put_bytes(MANIFEST_NAME, dataclasses.replace(manifest, shards=shards).to_json().encode())
    except FastloadError as exc:
        raise PackError(f"{exc}; run the same pack again: the parts uploaded are kept") from None


def part_skips(store: RemoteStore, manifest: Manifest) -> list[tuple[str, str]]:
    """The (key, reason) of each row a finished part left out, from its skipped report."""
    if not manifest.packed.get("skipped_report"):
        return []
    text = store.read_file(SKIPPED_REPORT_NAME, _MAX_REPORT_BYTES).decode("utf-8", "replace")
    return [(line["path"], line["reason"]) for line in map(json.loads, text.splitlines()) if line]


def _put(store: RemoteStore, local: Path, name: str) -> RemoteObject:
    try:
        there = store.put_file(local, name)
    except FastloadError as exc:
        raise PackError(f"{exc}; run the same pack again: the parts uploaded are kept") from None
    if there.size != local.stat().st_size:
        raise PackError(f"{store.display(name)}: the store holds {there.size} bytes after the upload of "
                        f"{local.stat().st_size}; run the same pack again")
    return there
