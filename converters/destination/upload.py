"""Pack to an object store: a local pack in a staging folder whose shards are uploaded as each one
is finished (several in flight, multipart for large ones), then the index, the manifest last.

A store URL holds a dataset exactly when its ``manifest.json`` is there, so a dataset never looks
finished before it is. Each pack writes its shards and index under a folder of its own
(``gen-<16 hex of its plan>/``), so a replacement never writes over an object the published
manifest lists: the old dataset stays readable until the new manifest replaces it (a conditional
PUT, refused if the manifest changed meanwhile), and only then are its objects deleted. The pack
holds a lease on the URL while it runs (converters.destination.store_lease): a second pack is refused.

Nothing that is not fastload's is ever deleted: a prefix that holds objects neither the published
manifest nor a pack's lease lists is refused. Killed (kill -9, Ctrl-C) and run again, the local pack
resumes from its journal and each shard the upload journal records as uploaded, with the same size,
digest and ETag the store still shows, is kept; the rest is uploaded again.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import xxhash

from fastload.converters.destination.out_dir import PackLock, claim_staging, dataset_entries, inspect_out, remove_dataset
from fastload.converters.packing.plan import plan_digest
from fastload.converters.packing.report import PackReport, already_packed, progress_bar
from fastload.converters.destination.store_lease import StoreLease, put_conditional
from fastload.config import cache_dir
from fastload.errors import FastloadError, ManifestError, PackError
from fastload.format import MANIFEST_NAME, SKIPPED_REPORT_NAME, Manifest, read_manifest
from fastload.format.files import read_regular
from fastload.format.layout import STORE_LEASE_NAME, UPLOAD_JOURNAL_NAME, split_generation
from fastload.format.manifest import MAX_MANIFEST_BYTES, parse_manifest
from fastload.storage.remote import RemoteObject, RemoteStore

UPLOADS_IN_FLIGHT = 4
"""Shards uploaded at once (each in parts, several in flight: s3fs's ``max_concurrency``)."""

_MAX_JOURNAL_BYTES = 2**30  # a line of ~150 bytes per shard

def default_staging(url: str) -> Path:
    """Where a pack to ``url`` is written before upload: one folder per URL in the node cache folder."""
    return Path(cache_dir(None)) / "packs" / xxhash.xxh3_64_hexdigest(url.rstrip("/").encode())


def pack_to_store(job: Any, store: RemoteStore, staging: str | os.PathLike[str] | None,
                  overwrite: bool) -> PackReport:
    """Pack ``job`` (see converters.packing.job) to the store folder ``store``, staging it locally."""
    objects = _list(store)
    old, _ = _published(store, objects)
    if old is not None and job.same_pack(old):
        return already_packed(store.url, old)
    _check_replaceable(store, old, overwrite)
    _fastloads(store, objects, old, None)  # before the lease is written: a refused prefix gets nothing
    folder = Path(os.path.abspath(staging)) if staging is not None else default_staging(store.url)
    with StoreLease(store, "gen-" + plan_digest(job.plans)[:16]) as lease:
        objects = _list(store)  # again, under the lease: no other pack changes the prefix from here on
        old, old_etag = _published(store, objects)
        ours = _fastloads(store, objects, old, lease.generations)
        listed = dataset_entries(old) if old is not None else set()
        # objects of packs that died here: ours to delete, unless a published manifest lists them
        dead = {n for n in ours if _generation(n) in lease.generations[1:] and n not in listed}
        store.remove(sorted(dead))
        ours = [n for n in ours if n not in dead]
        if old is not None and job.same_pack(old):
            return already_packed(store.url, old)
        _check_replaceable(store, old, overwrite)
        claim_staging(folder, store.url)
        lease.writing = True
        report, staged, uploaded = _stage_and_upload(job, store, folder, lease.generation, objects)
        manifest = _in_generation(staged, lease.generation, uploaded)
        lease.check()
        _publish(store, manifest, old_etag)
        # the new dataset is the one readers open from here on: the old one's objects go
        keep = dataset_entries(manifest) | {STORE_LEASE_NAME}
        store.remove([name for name in ours if name not in keep])
    remove_dataset(folder, staged)  # the store holds the dataset now; the staging folder and journals go
    report.out = store.url  # type: ignore[assignment]
    if report.skipped_report is not None:  # the staged copy is gone with its folder: the store's
        report.skipped_report = store.display(f"{lease.generation}/{SKIPPED_REPORT_NAME}")
    return report


def _stage_and_upload(job: Any, store: RemoteStore, folder: Path, generation: str,
                      objects: dict[str, RemoteObject]) -> tuple[PackReport, Manifest, dict[str, RemoteObject]]:
    """Pack into the staging ``folder``, uploading each shard as it is finished, then the index and
    the skipped report, all under ``generation``; the report, the staged manifest and what the
    store holds of each shard."""
    with PackLock(folder):
        found = inspect_out(folder)  # under the lock
        with ShardUploads(store, folder, generation, objects, job.progress) as uploads:
            if found.manifest is not None and job.same_pack(found.manifest):
                # packed locally before a kill, not all uploaded: upload the rest, pack nothing again
                report = already_packed(folder, found.manifest)
                report.already_packed, report.resumed_shards = False, len(found.manifest.shards)
                for shard in found.manifest.shards:
                    uploads.submit(folder / shard.file)
            else:
                report = job.pack_into(folder, on_shard=uploads.submit)
            uploaded = uploads.finish()
        staged = read_manifest(folder)
        for entry in staged.index.values():
            _put(store, folder / entry.file, f"{generation}/{entry.file}")
        if staged.packed.get("skipped_report") is not None:
            _put(store, folder / SKIPPED_REPORT_NAME, f"{generation}/{SKIPPED_REPORT_NAME}")
    return report, staged, uploaded


def _in_generation(staged: Manifest, generation: str, uploaded: dict[str, RemoteObject]) -> Manifest:
    """The staged manifest with its files named as the store holds them: under ``generation``, each
    shard with the ETag its upload left (readers refuse a shard replaced since)."""
    prefix = generation + "/"
    return replace(
        staged, shards=[replace(s, file=prefix + s.file, etag=uploaded[s.file].etag) for s in staged.shards],
        index={column: replace(entry, file=prefix + entry.file) for column, entry in staged.index.items()})


def _fastloads(store: RemoteStore, objects: dict[str, RemoteObject], published: Manifest | None,
               generations: list[str] | None) -> list[str]:
    """The objects of the prefix that are fastload's: what the published manifest lists, the pack
    lease, and what is in the pack folders the lease lists (None: in any folder named like one).
    Anything else refuses the prefix."""
    listed = dataset_entries(published) if published is not None else {MANIFEST_NAME}
    ours = [name for name in objects if name in listed or name == STORE_LEASE_NAME
            or (_generation(name) != "" if generations is None else _generation(name) in generations)]
    foreign = sorted(set(objects).difference(ours))
    if foreign:
        raise PackError(f"{store.url}: holds objects that are not a fastload dataset's ({', '.join(foreign[:3])}"
                        f"{', ...' if len(foreign) > 3 else ''}); fastload deletes only what a published "
                        "manifest or its own pack lease lists: pack into a new or empty prefix")
    return ours


def _generation(name: str) -> str:
    return split_generation(name)[0].rstrip("/")


def _check_replaceable(store: RemoteStore, old: Manifest | None, overwrite: bool) -> None:
    if old is not None and not overwrite:
        raise PackError(f"{store.url}: already holds a finished dataset (packed from "
                        f"{old.packed.get('source', '?')}); pass --overwrite to replace it")


def _list(store: RemoteStore) -> dict[str, RemoteObject]:
    return {name: RemoteObject(size, etag) for name, size, etag in store.list_objects()}


def _published(store: RemoteStore, objects: dict[str, RemoteObject]) -> tuple[Manifest | None, str | None]:
    """The published manifest and its ETag (what the new one may replace), or (None, None)."""
    if MANIFEST_NAME not in objects:
        return None, None
    where = store.display(MANIFEST_NAME)
    try:
        text = store.read_file(MANIFEST_NAME, MAX_MANIFEST_BYTES).decode("utf-8", "replace")
        return parse_manifest(text, where), objects[MANIFEST_NAME].etag
    except ManifestError as exc:
        raise PackError(f"{where}: is not a readable fastload manifest ({exc}); fastload replaces only its own "
                        "datasets: pack into a new or empty prefix") from None


def _put(store: RemoteStore, local: Path, name: str) -> RemoteObject:
    try:
        return store.put_file(local, name)
    except FastloadError as exc:
        raise PackError(f"{exc}; run the same command again to resume the upload") from None


def _publish(store: RemoteStore, manifest: Manifest, replaces: str | None) -> None:
    """PUT the manifest only if the one there is still ``replaces`` (its ETag; None: none there)."""
    try:
        published = put_conditional(store, MANIFEST_NAME, manifest.to_json().encode(), replaces)
    except (FastloadError, OSError) as exc:
        raise PackError(f"{exc}; run the same command again to finish the upload") from None
    if published is None:
        raise PackError(f"{store.display(MANIFEST_NAME)}: changed while this pack ran (written by something "
                        "that held no pack lease); nothing of this pack was published: run it again")


def shard_digest(path: Path) -> str:
    """xxh3-128 of a whole file, read in 8 MB pieces."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(8 * 2**20):
            h.update(chunk)
    return h.hexdigest()


class ShardUploads:
    """Uploads finished shard files in the background and remembers, in a journal beside the
    pack's own, what the store holds of each (size, digest, ETag)."""

    def __init__(self, store: RemoteStore, folder: Path, generation: str, objects: dict[str, RemoteObject],
                 progress: bool | None) -> None:
        self.store, self.objects, self.prefix = store, objects, generation + "/"
        self.journal_path = folder / UPLOAD_JOURNAL_NAME
        self.done = self._load_journal()
        self.pool = ThreadPoolExecutor(UPLOADS_IN_FLIGHT, thread_name_prefix="fastload-upload")
        self.futures: dict[str, Future[RemoteObject]] = {}
        self.lock = threading.Lock()
        show = sys.stderr.isatty() if progress is None else progress
        self.bar = progress_bar(0, True, "uploading", position=1) if show else None

    def __enter__(self) -> ShardUploads:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        if self.bar is not None:
            self.bar.close()

    def _load_journal(self) -> dict[str, dict[str, Any]]:
        try:  # a regular file of ours only: a link planted at its name is not followed
            lines = read_regular(self.journal_path, _MAX_JOURNAL_BYTES, follow_links=False).decode(
                "utf-8", "replace").splitlines()
        except OSError:
            return {}  # none yet (or not ours): every shard is checked by uploading it again
        done = {}
        for line in lines:
            try:
                entry = json.loads(line)
                done[entry["name"]] = entry
            except (ValueError, KeyError, TypeError):
                continue  # a line cut by a kill: that shard is uploaded again
        return done

    def submit(self, path: Path) -> None:
        """Upload ``path`` (a finished shard) unless the store holds it already; never raises
        (failures come out of ``finish``)."""
        if self.bar is not None:
            self.bar.total = (self.bar.total or 0) + path.stat().st_size
            self.bar.refresh()
        self.futures[path.name] = self.pool.submit(self._upload, path)

    def _upload(self, path: Path) -> RemoteObject:
        size, digest, name = path.stat().st_size, shard_digest(path), self.prefix + path.name
        entry = self.done.get(name)
        there = self.objects.get(name)
        if (entry is not None and there is not None and entry.get("digest") == digest
                and entry.get("size") == size == there.size and entry.get("etag") == there.etag):
            self._advance(size)
            return there
        uploaded = self.store.put_file(path, name)
        if uploaded.size != size:
            raise PackError(f"{self.store.display(name)}: the store holds {uploaded.size} bytes after "
                            f"the upload of {size}; run the same command again")
        line = json.dumps({"name": name, "size": size, "digest": digest, "etag": uploaded.etag}) + "\n"
        with self.lock:  # appended and synced after the upload: an entry means the store has it
            fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        self._advance(size)
        return uploaded

    def _advance(self, size: int) -> None:
        if self.bar is not None:
            self.bar.update(size)

    def finish(self) -> dict[str, RemoteObject]:
        """Wait for every upload; what the store holds of each shard, or PackError for the first failure."""
        out = {}
        for name, future in self.futures.items():
            try:
                out[name] = future.result()
            except (FastloadError, OSError) as exc:
                raise PackError(f"uploading {name} to {self.store.url} failed ({exc}); run the same command "
                                "again to resume (uploaded shards are kept)") from None
        return out

