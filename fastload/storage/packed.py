"""Where a packed dataset's manifest and index files are read from: a local folder or a store URL."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastload.errors import BucketNotFound, DatasetNotFoundError, FastloadError, ManifestError, RemoteNotFound
from fastload.format.columns import ReadFile, local_files
from fastload.format.index import RecordIndex
from fastload.format.layout import MANIFEST_NAME
from fastload.format.manifest import MAX_MANIFEST_BYTES, Manifest, parse_manifest, read_manifest
from fastload.format.versions import pinned_manifest
from fastload.storage.location import is_remote, local_path
from fastload.storage.remote import RemoteStore

if TYPE_CHECKING:
    from fastload.readers import ShardReader


@dataclass
class PackedLocation:
    """A packed dataset's place: ``root`` is its local folder (a Path) or its URL (a str);
    ``store`` is set for a URL."""

    root: Path | str
    store: RemoteStore | None = None
    version: int | None = None  # the dataset version this location is pinned to (None: the latest)

    @property
    def read(self) -> ReadFile:
        """Bounded reads of the dataset's small files (manifest, index columns) by name."""
        if self.store is None:
            return local_files(Path(self.root))
        store = self.store
        return lambda name, limit: store.read_file(name, limit)

    def manifest(self) -> Manifest:
        """The parsed manifest of the pinned version (``version``; None: the published one); a
        location without one raises DatasetNotFoundError."""
        return pinned_manifest(self._published(), self.version, self.root, self.read)

    def _published(self) -> Manifest:
        if self.store is None:
            return read_manifest(self.root)
        where = f"{self.root}/{MANIFEST_NAME}"
        try:
            raw = self.store.read_file(MANIFEST_NAME, MAX_MANIFEST_BYTES)
        except BucketNotFound:
            raise  # says which bucket and what to do
        except RemoteNotFound:
            raise DatasetNotFoundError(
                f"{self.root}: no {MANIFEST_NAME} there: not a packed dataset, or its upload has not "
                f"finished (the manifest is uploaded last); pack it with `fastload pack SRC -o {self.root}`"
            ) from None
        except FastloadError:
            raise  # the store's own error (access denied, unreachable) says what is wrong and what to do
        except OSError as exc:
            raise ManifestError(f"{where}: cannot be read ({exc.strerror or exc}); re-pack the dataset") from None
        return parse_manifest(raw.decode("utf-8", errors="replace"), where)


def locate_packed(location: str | os.PathLike[str],
                  storage_options: dict[str, Any] | None = None) -> PackedLocation:
    """A dataset path or URL (``s3://bucket/images.fl``, ``file:///data/x.fl``) as a PackedLocation."""
    if is_remote(location):
        return PackedLocation(str(location).rstrip("/"), RemoteStore(str(location), storage_options))
    if storage_options:
        raise ValueError(f"{location}: storage_options are for object-store URLs (s3://...), "
                         "not a local path")
    return PackedLocation(Path(local_path(location)))


@dataclass
class OpenPacked:
    """A packed dataset opened for reading: where it is, its manifest, its index and a shard reader."""

    location: PackedLocation
    manifest: Manifest
    index: RecordIndex
    reader: ShardReader


def open_packed(location: PackedLocation, cache: Any = None) -> OpenPacked:
    """Read the manifest and index of ``location`` and make the reader for its storage kind
    (a remote dataset's shards read by byte range, through ``cache`` when given). ``location``
    is then pinned to the version it opened: a copy of it (a worker's) opens that version again,
    whatever an append published since."""
    from fastload.readers import READERS
    from fastload.storage.remote_shards import RemoteShards

    manifest = location.manifest()
    location.version = manifest.version
    index = RecordIndex(location.root, manifest, location.read)
    remote = RemoteShards(location.store, manifest, cache) if location.store is not None else None
    return OpenPacked(location, manifest, index, READERS[manifest.storage](location.root, manifest, index, remote))
