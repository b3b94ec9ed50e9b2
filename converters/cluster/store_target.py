"""Cluster packing into an object store (``s3://bucket/out.fl``): the store URL checked as a pack to
a store checks it (converters.destination.upload: only fastload's objects there, a finished dataset
replaced only with ``overwrite``), held under the store's pack lease while the pack runs, and the
finished dataset published by converters.cluster.store_adopt, manifest last.

The tasks write their parts under one pack folder, ``gen-<16 hex>/``, named from the pack's
settings and the published dataset it replaces (none: a new one), never from a job or task id: a
pack run again after its driver was killed (its lease then taken over) writes into the same folder,
finds the parts finished there and reuses them. The finished dataset's shards and index go in that
folder too, never over a file the published manifest lists (which lies in another).
"""

from __future__ import annotations

from typing import Any

import xxhash
from fastload.converters.cluster.task_shards import SinkSettings, TaskPart
from fastload.converters.destination.out_dir import dataset_entries
from fastload.converters.destination.store_lease import StoreLease
from fastload.converters.destination.upload import (
    _check_replaceable,
    _fastloads,
    _generation,
    _list,
    _published,
)
from fastload.converters.packing.report import PackReport

from fastload.errors import PackError
from fastload.format import Manifest
from fastload.format.layout import split_generation
from fastload.storage.remote import RemoteStore


class StoreTarget:
    """OUT, a store URL: new, or with ``overwrite`` a finished dataset replaced once the new one is
    published. Checked when made (the tasks get a copy made before ``start``)."""

    def __init__(self, url: str, overwrite: bool, storage_options: dict[str, Any] | None, facts: str) -> None:
        self.store = RemoteStore(url, storage_options)
        self.out = self.store.url
        self.overwrite = overwrite
        objects = _list(self.store)
        old, _ = _published(self.store, objects)
        _check_replaceable(self.store, old, overwrite)
        _fastloads(self.store, objects, old, None)  # a prefix holding others' objects: refused before any write
        self.replaces = _generation_of(old)
        self.generation = "gen-" + xxhash.xxh3_64_hexdigest(f"ray\0{facts}\0{self.replaces}".encode())
        self.work = f"{self.store.url}/{self.generation}"
        self.old_etag: str | None = None
        self._lease: StoreLease | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_lease": None}  # the driver's lease stays with the driver

    def start(self) -> None:
        """Take the store's pack lease; delete what dead packs other than this one's left; check the
        published dataset is the one this target was made for."""
        self._lease = StoreLease(self.store, self.generation).__enter__()
        try:
            objects = _list(self.store)
            old, self.old_etag = _published(self.store, objects)
            if _generation_of(old) != self.replaces:
                raise PackError(f"{self.out}: its dataset changed since this PackSink was made; make a new PackSink")
            _check_replaceable(self.store, old, self.overwrite)
            ours = _fastloads(self.store, objects, old, self._lease.generations)
            listed = dataset_entries(old) if old is not None else set()
            # a dead pack's folders (not this pack's own: its finished parts are reused) are ours to delete
            self.store.remove(sorted(n for n in ours if _generation(n) in self._lease.generations[1:]
                                     and n not in listed))
            self._lease.writing = True
        except BaseException as exc:
            self._release(exc)
            raise

    def check_task(self) -> None:
        """Nothing to check in a write task: every node reaches the store by its URL."""

    def finish(self, parts: list[TaskPart | None], settings: SinkSettings) -> PackReport:
        """Publish the tasks' parts as the dataset at the URL, manifest last."""
        from fastload.converters.cluster.store_adopt import adopt_in_store

        assert self._lease is not None, "start() was not called"
        try:
            report = adopt_in_store(self.store, self.generation, parts, settings, self._lease, self.old_etag)
        except BaseException as exc:
            self._release(exc)
            raise
        self._release(None)
        return report

    def give_up(self) -> None:
        """Release the lease at once for the next pack, which takes the pack folder (and its parts) over."""
        self._release(PackError("the pack failed"))

    def _release(self, error: BaseException | None) -> None:
        if self._lease is not None:
            lease, self._lease = self._lease, None
            lease.__exit__(type(error) if error is not None else None, error, None)


def _generation_of(manifest: Manifest | None) -> str:
    """The pack folder a published dataset's files lie in ("" when none, or at the top)."""
    return split_generation(manifest.shards[0].file)[0].rstrip("/") if manifest is not None and manifest.shards else ""
