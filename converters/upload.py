"""Pack to an object store: a local pack in a staging folder whose shards are uploaded as each one
is finished (several in flight, multipart for large ones), then the index, the manifest last.

A store URL holds a dataset exactly when its ``manifest.json`` is there, so a dataset never looks
finished before it is. Killed (kill -9, Ctrl-C) and run again, the local pack resumes from its
journal and each shard the upload journal records as uploaded, with the same size, digest and
ETag the store still shows, is kept; the rest is uploaded again.
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

from converters.out_dir import PackLock, inspect_out, prepare_out, remove_dataset
from converters.report import PackReport, progress_bar
from fastload.config import cache_dir
from fastload.errors import FastloadError, ManifestError, PackError
from fastload.format import INDEX_DIR, MANIFEST_NAME, SKIPPED_REPORT_NAME, read_manifest
from fastload.format.folder import left_by_a_pack
from fastload.format.files import read_regular
from fastload.format.layout import UPLOAD_JOURNAL_NAME
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
    """Pack ``job`` (see converters.pack) to the store folder ``store``, staging it locally."""
    from converters.pack import _already_packed

    objects = {name: RemoteObject(size, etag) for name, size, etag in store.list_objects()}
    old = _remote_manifest(store, objects)
    if old is not None and job.same_pack(old):
        return _already_packed(store.url, old)
    if old is not None and not overwrite:
        raise PackError(f"{store.url}: already holds a finished dataset (packed from "
                        f"{old.packed.get('source', '?')}); pass --overwrite to replace it")
    foreign = [name for name in objects if not _ours(name)]
    if foreign:
        raise PackError(f"{store.url}: holds objects that are not a fastload dataset's ({foreign[0]}, ...); "
                        "pack into a new or empty prefix")
    folder = Path(os.path.abspath(staging)) if staging is not None else default_staging(store.url)
    folder.parent.mkdir(parents=True, exist_ok=True)
    if inspect_out(folder).state == "new":
        prepare_out(folder)
    with PackLock(folder):
        staged = inspect_out(folder)  # under the lock
        if old is not None:  # from here on the prefix is an unfinished pack, never a half-replaced dataset
            store.remove([MANIFEST_NAME])
        with ShardUploads(store, folder, objects, job.progress) as uploads:
            if staged.manifest is not None and job.same_pack(staged.manifest):
                # packed locally before a kill, not all uploaded: upload the rest, pack nothing again
                report = _already_packed(folder, staged.manifest)
                report.already_packed, report.resumed_shards = False, len(staged.manifest.shards)
                for shard in staged.manifest.shards:
                    uploads.submit(folder / shard.file)
            else:
                report = job.pack_into(folder, on_shard=uploads.submit)
            uploaded = uploads.finish()
        manifest = read_manifest(folder)
        small = [f for f in (*(e.file for e in manifest.index.values()), SKIPPED_REPORT_NAME)
                 if (folder / f).is_file()]
        for name in small:
            _put(store, folder / name, name)
        keep = {s.file for s in manifest.shards} | set(small)
        store.remove([name for name in objects if name not in keep and name != MANIFEST_NAME])
        shards = [replace(s, etag=uploaded[s.file].etag) for s in manifest.shards]
        _publish(store, replace(manifest, shards=shards).to_json().encode())
    remove_dataset(folder, manifest)  # the store holds the dataset now; the journals go too
    report.out = store.url  # type: ignore[assignment]
    return report


def _ours(name: str) -> bool:
    top = name.split("/", 1)[0]
    return left_by_a_pack(top) or top == INDEX_DIR or name == MANIFEST_NAME


def _remote_manifest(store: RemoteStore, objects: dict[str, RemoteObject]) -> Any:
    if MANIFEST_NAME not in objects:
        return None
    where = store.display(MANIFEST_NAME)
    try:
        return parse_manifest(store.read_file(MANIFEST_NAME, MAX_MANIFEST_BYTES).decode("utf-8", "replace"), where)
    except ManifestError as exc:
        raise PackError(f"{where}: is not a readable fastload manifest ({exc}); fastload replaces only its own "
                        "datasets: pack into a new or empty prefix") from None


def _put(store: RemoteStore, local: Path, name: str) -> RemoteObject:
    try:
        return store.put_file(local, name)
    except FastloadError as exc:
        raise PackError(f"{exc}; run the same command again to resume the upload") from None


def _publish(store: RemoteStore, data: bytes) -> None:
    try:
        store.put_bytes(MANIFEST_NAME, data)
    except FastloadError as exc:
        raise PackError(f"{exc}; run the same command again to finish the upload") from None


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

    def __init__(self, store: RemoteStore, folder: Path, objects: dict[str, RemoteObject],
                 progress: bool | None) -> None:
        self.store, self.objects = store, objects
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
        size, digest = path.stat().st_size, shard_digest(path)
        entry = self.done.get(path.name)
        there = self.objects.get(path.name)
        if (entry is not None and there is not None and entry.get("digest") == digest
                and entry.get("size") == size == there.size and entry.get("etag") == there.etag):
            self._advance(size)
            return there
        uploaded = self.store.put_file(path, path.name)
        if uploaded.size != size:
            raise PackError(f"{self.store.display(path.name)}: the store holds {uploaded.size} bytes after "
                            f"the upload of {size}; run the same command again")
        line = json.dumps({"name": path.name, "size": size, "digest": digest, "etag": uploaded.etag}) + "\n"
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

