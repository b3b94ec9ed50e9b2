"""The Python writer's output: the folder its shards go in, locked, and how the finished dataset is
published there (in place, swapped in over an old one, or uploaded to a store) or given up.

The rules are ``pack``'s (converters.destination.out_dir): OUT is new, an unfinished pack (its
working files are cleared: a writer does not resume) or, with ``overwrite``, a finished dataset
that holds nothing else, replaced only once the new one is complete. Nothing is a dataset before
its manifest is written, last: a writer given up (an exception in its ``with`` block) or killed
leaves none, and an overwritten dataset stays as it was. An append (converters.destination.append)
writes its shards into OUT after the dataset's; given up or killed, OUT stays the old version.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from fastload.converters.destination.append import AppendBase
from fastload.converters.destination.out_dir import (
    PackLock,
    claim_staging,
    inspect_out,
    prepare_out,
    remove_dataset,
    staging_path,
    swap_in,
)
from fastload.converters.packing.plan import ShardPlan
from fastload.converters.packing.report import PackReport

from fastload.errors import PackError
from fastload.format import INDEX_DIR, MANIFEST_NAME, PACK_STATE_DIR, Manifest
from fastload.format.files import ensure_dir, remove_entry
from fastload.format.folder import left_by_a_pack
from fastload.format.layout import PACK_LOCK_NAME, PACK_OWNER_NAME, STAGING_MARKER_NAME
from fastload.storage.remote import RemoteStore


class WrittenOut:
    """Where a writer writes: ``folder`` (OUT, the staging folder of its replacement, or of a store
    URL), locked from construction until ``publish`` or ``give_up``."""

    def __init__(self, out: Path | None, store: RemoteStore | None, overwrite: bool,
                 staging: str | os.PathLike[str] | None, append: bool = False) -> None:
        self.out, self.store, self.overwrite = out, store, overwrite
        self.locks: list[PackLock] = []  # OUT's, then the written folder's (when they differ)
        self.old: Manifest | None = None  # a dataset at OUT being replaced
        self.base: AppendBase | None = None  # the dataset at OUT being appended to
        self.folder = (self._append() if append else
                       self._store_staging(staging) if store is not None else self._local())

    @property
    def where(self) -> str:
        return str(self.out) if self.store is None else self.store.url

    def _store_staging(self, staging: str | os.PathLike[str] | None) -> Path:
        from fastload.converters.destination.upload import default_staging

        assert self.store is not None
        if not self.overwrite and MANIFEST_NAME in {name for name, _, _ in self.store.list_objects()}:
            raise PackError(f"{self.store.url}: already holds a finished dataset; pass overwrite=True "
                            "to replace it")
        url = self.store.url
        folder = Path(os.path.abspath(staging)) if staging is not None else default_staging(url)
        found = inspect_out(folder)
        if found.manifest is not None:  # staged by a writer killed before its upload: replaced
            remove_dataset(folder, found.manifest)
        claim_staging(folder, url)
        return self._lock(folder)

    def _local(self) -> Path:
        assert self.out is not None
        found = inspect_out(self.out)
        if found.state != "dataset":
            prepare_out(self.out)
            return self._lock(self.out)
        if not self.overwrite:
            raise PackError(f"{self.out}: already holds a finished dataset; pass overwrite=True to "
                            "replace it, or choose another folder")
        if found.foreign:
            raise PackError(f"{self.out}: holds files that are not part of its dataset "
                            f"({found.foreign[0]}, ...); overwrite replaces only a folder that holds "
                            "a fastload dataset alone: move them out or choose another folder")
        self.old = found.manifest
        self.locks.append(PackLock(self.out).__enter__())
        new = staging_path(self.out)
        staged = inspect_out(new)
        if staged.manifest is not None:
            remove_dataset(new, staged.manifest)  # a replacement killed before its swap
        prepare_out(new)
        return self._lock(new)

    def _append(self) -> Path:
        """OUT, a finished dataset, locked; what an interrupted append left there is cleared (a
        writer does not resume), so the shards written go after the dataset's."""
        if self.store is not None:
            raise PackError(f"{self.store.url}: appending to a dataset in an object store is not supported yet; "
                            "append to a local copy and upload that")
        if self.overwrite:
            raise ValueError("append=True adds to the dataset at out, overwrite=True replaces it: choose one")
        assert self.out is not None
        AppendBase.open(self.out)  # not a dataset: refused before a lock file is made there
        self.locks.append(PackLock(self.out).__enter__())
        try:
            self.base = AppendBase.open(self.out)  # again, under the lock
            self.base.clear_leftovers()
            ensure_dir(self.out / PACK_STATE_DIR, 0o700)
        except BaseException:
            self._release()
            raise
        return self.out

    def _lock(self, folder: Path) -> Path:
        self.locks.append(PackLock(folder).__enter__())
        if inspect_out(folder).state == "dataset":  # finished by a pack that held the lock before
            self._release()
            raise PackError(f"{folder}: a dataset was finished here meanwhile; pass overwrite=True "
                            "to replace it")
        _clear(folder)  # an unfinished pack's or a killed writer's files: the writer starts afresh
        return folder

    def _release(self) -> None:
        while self.locks:
            self.locks.pop().__exit__(None)

    def publish(self, report: PackReport, digest: str) -> PackReport:
        """Make the dataset finished in ``folder`` the one at OUT (or the store URL)."""
        if self.store is not None:
            from fastload.converters.destination.upload import pack_to_store

            self._release()  # the upload takes the staging folder's lock itself
            job = _Staged([ShardPlan(0, 0, report.num_records, digest)], digest)
            return pack_to_store(job, self.store, self.folder, self.overwrite)
        if self.old is not None:
            assert self.out is not None
            swap_in(self.folder, self.out)
            out_lock, new_lock = self.locks
            out_lock.path, new_lock.path = new_lock.path, out_lock.path  # each went with its folder
            self._release()
            remove_dataset(self.folder, self.old)  # the old dataset, now at the staging name
        self._release()
        report.moved_to(self.out)  # type: ignore[arg-type]
        return report

    def give_up(self) -> None:
        """Delete what was written; OUT is left as it was before (new: gone again)."""
        if self.base is not None:  # an append: the dataset's own files stay, only the new ones go
            self.base.clear_leftovers()
            return self._release()
        self._release()
        _clear(self.folder, everything=True)


class _Staged:
    """The finished staging folder, as the pack job converters.destination.upload uploads."""

    def __init__(self, plans: list[ShardPlan], digest: str) -> None:
        self.plans, self.digest, self.progress = plans, digest, False

    def same_pack(self, manifest: Manifest) -> bool:
        return manifest.packed.get("plan") == self.digest

    def pack_into(self, out: Path, on_shard: Any = None) -> PackReport:
        raise PackError(f"{out}: the staged dataset changed before its upload; write it again")


def _clear(folder: Path, everything: bool = False) -> None:
    """Delete a pack's working files and shards in ``folder`` (it has no manifest, and
    inspect_out found nothing else there); ``everything``: its owner file, marker and the folder
    too, when nothing else is left."""
    if not folder.is_dir():
        return
    keep = set() if everything else {PACK_LOCK_NAME, STAGING_MARKER_NAME}
    for sub in (PACK_STATE_DIR, INDEX_DIR):
        if (folder / sub).is_dir() and not (folder / sub).is_symlink():
            for name in os.listdir(folder / sub):
                if everything or name != PACK_OWNER_NAME:
                    remove_entry(folder / sub / name)
            if everything or sub == INDEX_DIR:
                os.rmdir(folder / sub)
    for name in os.listdir(folder):
        if name not in keep and name not in (PACK_STATE_DIR, INDEX_DIR) and left_by_a_pack(name):
            remove_entry(folder / name)
    if everything:
        try:
            os.rmdir(folder)
        except OSError:
            pass  # something else is there: left as it is
