"""The output folder: what a pack may find, create and delete in OUT, and how a finished dataset is
replaced (built beside it, swapped in when complete).

The rules, each in one place here:
- OUT may be new, empty, an unfinished pack (only fastload's working files, and its owner file
  ``.pack/owner.json``, written first, that proves fastload made the folder) or a finished dataset
  (a ``manifest.json`` that parses as a fastload manifest); anything else is refused.
- A staging folder (a pack to a store) is new or empty, or holds the marker naming its URL.
- Only files a fastload manifest lists, and fastload's own working files, are ever deleted; a
  dataset folder that also holds other files is never replaced.
- A replacement is packed into a sibling folder and swapped with OUT (``renameat2`` exchange)
  only once it is complete: until then OUT is the old, readable dataset.
- Nothing in OUT is written through a link (``fastload.format.files``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from fastload.errors import DatasetNotFoundError, ManifestError, PackError
from fastload.format import (
    INDEX_DIR, MANIFEST_NAME, PACK_LOCK_NAME, PACK_STATE_DIR, SKIPPED_REPORT_NAME, Manifest, fsync_dir,
    read_manifest,
)
from fastload.format.files import create_new, ensure_dir, read_regular, remove_entry, write_new
from fastload.format.folder import PACK_WORK_NAMES, WRITE_PROBE, in_pack_state, left_by_a_pack
from fastload.format.layout import (
    PACK_OWNER_NAME, STAGING_MARKER_NAME, VERSIONS_DIR, split_generation, version_dir,
)

_MADE_BY = "fastload pack"  # the owner file's and the staging marker's "made_by"

@dataclass
class OutFolder:
    """What OUT holds now."""

    path: Path
    state: Literal["new", "unfinished", "dataset"]
    manifest: Manifest | None = None
    foreign: list[str] = field(default_factory=list)  # beside a dataset: entries it does not list


def staging_path(out: Path) -> Path:
    """Where a replacement for the dataset at ``out`` is packed: a hidden sibling folder."""
    return out.with_name(f".{out.name}.fastload-new")


def inspect_out(out: Path) -> OutFolder:
    """Classify OUT; a folder that is neither a fastload dataset nor a pack's leftovers is refused."""
    try:
        st = os.lstat(out)
    except (FileNotFoundError, NotADirectoryError):  # under a file: prepare_out says it cannot write
        return OutFolder(out, "new")
    if not stat.S_ISDIR(st.st_mode):
        raise PackError(f"{out}: exists and is not a folder; choose another -o")
    names = sorted(os.listdir(out))
    for name in sorted(PACK_WORK_NAMES.intersection(names)):
        if os.path.islink(out / name):
            raise PackError(f"{out / name}: is a symbolic link where fastload keeps its own files; "
                            "fastload never writes through links: remove it")
    if MANIFEST_NAME not in names:
        foreign = [n for n in names if not _unfinished_entry(out, n)]
        if foreign:
            raise PackError(f"{out}: exists and holds other files ({foreign[0]}, ...); "
                            "pack into a new or empty folder")
        if names and _owner(out) is None and _owner(out, STAGING_MARKER_NAME) is None:
            if _owner_being_written(out, names):
                return OutFolder(out, "new")  # prepare_out writes the owner file whole
            raise PackError(f"{out}: holds files named like a pack's ({names[0]}, ...) but not the "
                            f"{PACK_STATE_DIR}/{PACK_OWNER_NAME} every fastload pack writes first, so they are not "
                            "taken for an unfinished pack; pack into a new or empty folder, or remove them "
                            "(an older fastload's unfinished pack, which has no owner file, cannot be resumed: remove it)")
        return OutFolder(out, "unfinished" if names else "new")
    try:
        manifest = read_manifest(out)
    except (ManifestError, DatasetNotFoundError) as exc:
        raise PackError(f"{out}: holds a {MANIFEST_NAME} that is not a readable fastload manifest ({exc}); "
                        "fastload replaces only its own datasets: pack into a new or empty folder") from None
    listed = dataset_entries(manifest)
    foreign = [n for n in names if n not in listed and n not in PACK_WORK_NAMES]
    foreign += [f"{INDEX_DIR}/{n}" for n in _listdir(out / INDEX_DIR) if f"{INDEX_DIR}/{n}" not in listed]
    return OutFolder(out, "dataset", manifest, foreign)


def dataset_entries(manifest: Manifest) -> set[str]:
    """Every path (relative to the dataset folder) that ``manifest`` makes part of the dataset."""
    generation = split_generation(manifest.shards[0].file)[0] if manifest.shards else ""  # a store's pack folder
    entries = ({MANIFEST_NAME, generation + INDEX_DIR, generation + SKIPPED_REPORT_NAME}
               | {s.file for s in manifest.shards} | {entry.file for entry in manifest.index.values()})
    if manifest.version > 1:  # appended to: every earlier version's index (the same columns) and manifest
        entries |= {VERSIONS_DIR} | {f"{INDEX_DIR}/{column}.npy" for column in manifest.index}
        entries |= {f"{INDEX_DIR}/{version_dir(v)}" for v in range(2, manifest.version + 1)}
    return entries


def _unfinished_entry(out: Path, name: str) -> bool:
    """Whether ``name`` in OUT is something an interrupted pack leaves."""
    if name == INDEX_DIR:
        return all(n.endswith((".npy", ".npy.tmp")) for n in _listdir(out / INDEX_DIR))
    if name == PACK_STATE_DIR:
        return all(in_pack_state(n) for n in _listdir(out / PACK_STATE_DIR))
    return left_by_a_pack(name)


def _owner(folder: Path, name: str = f"{PACK_STATE_DIR}/{PACK_OWNER_NAME}") -> dict[str, object] | None:
    """The owner file (or staging marker) fastload wrote in ``folder``, or None when there is none
    (a link, a folder or a file of other content at that name is none)."""
    try:
        found = json.loads(read_regular(folder / name, 2**16, follow_links=False))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and found.get("made_by") == _MADE_BY else None


def _owner_being_written(out: Path, names: list[str]) -> bool:
    """Whether OUT holds nothing but the pack's state folder with, at most, its owner file being
    written: what a pack (or a Ray task's part) killed between the two leaves, no data of anyone's."""
    return set(names) - {PACK_LOCK_NAME} == {PACK_STATE_DIR} and set(_listdir(out / PACK_STATE_DIR)) <= {
        PACK_OWNER_NAME, PACK_OWNER_NAME + ".tmp"}


def _write_owner(path: Path, **facts: object) -> None:
    """Write an owner file whole or not at all (a temporary file renamed over ``path``; a link
    there is replaced, not followed): a kill mid-write leaves no half file to be refused later."""
    temporary = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)  # a killed write's
    write_new(temporary, json.dumps({"made_by": _MADE_BY, "pid": os.getpid(), **facts}).encode())
    os.rename(temporary, path)


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path) if stat.S_ISDIR(os.lstat(path).st_mode) else []
    except FileNotFoundError:
        return []


def prepare_out(out: Path) -> None:
    """Create OUT (and its parents) and check that files can be created in it."""
    try:
        try:
            ensure_dir(out)
        except FileNotFoundError:
            out.parent.mkdir(parents=True, exist_ok=True)
            ensure_dir(out)
        os.close(create_new(out / WRITE_PROBE))
        os.unlink(out / WRITE_PROBE)
        ensure_dir(out / PACK_STATE_DIR, 0o700)
        if _owner(out) is None:  # first: from here on the folder is a pack of fastload's
            _write_owner(out / PACK_STATE_DIR / PACK_OWNER_NAME)
    except OSError as exc:
        raise PackError(f"{out}: cannot write the output folder ({exc.strerror}); choose another -o") from None


def claim_staging(folder: Path, url: str) -> None:
    """Make ``folder`` the staging folder of a pack to ``url``, or accept it as one already.

    A staging folder is fastload's own: new or empty (it then gets a marker naming ``url``), or
    holding that marker. A folder holding anything else (a dataset, the staging of another URL,
    files of the user's) is refused: a finished pack deletes its staging folder.
    """
    names = _listdir(folder)
    if names:
        marker = _owner(folder, STAGING_MARKER_NAME)
        if marker is None:
            raise PackError(f"{folder}: holds files ({sorted(names)[0]}, ...) and is not a staging folder of "
                            "fastload's; a pack to a store stages in a new or empty folder of its own, deleted "
                            "when the pack is done: choose another --staging (or leave it out)")
        if marker.get("target") != url:
            raise PackError(f"{folder}: is the staging folder of a pack to {marker.get('target')}, not to {url}; "
                            "choose another --staging (or leave it out)")
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _write_owner(folder / STAGING_MARKER_NAME, target=url)
    except OSError as exc:
        raise PackError(f"{folder}: cannot hold the pack's staging files ({exc.strerror}); "
                        "choose another --staging") from None
    prepare_out(folder)


def remove_dataset(folder: Path, manifest: Manifest) -> None:
    """Delete what ``manifest`` lists in ``folder`` and fastload's working files, manifest first
    (from then on the folder is no dataset); the folder itself goes if nothing else is left."""
    remove_entry(folder / MANIFEST_NAME)
    for rel in sorted(dataset_entries(manifest) - {MANIFEST_NAME, INDEX_DIR}):
        if os.path.isdir(folder / rel) and not os.path.islink(folder / rel):
            _remove_work_dir(folder / rel)  # a version's index folder, or versions/: fastload's files only
        else:
            remove_entry(folder / rel)
    work_dirs = (PACK_STATE_DIR, INDEX_DIR)
    for name in sorted(PACK_WORK_NAMES.difference(work_dirs)):
        remove_entry(folder / name)
    for sub in work_dirs:
        _remove_work_dir(folder / sub)
    try:
        os.rmdir(folder)
    except OSError:
        warnings.warn(f"{folder}: left in place, it holds files that are not part of the old dataset",
                      stacklevel=2)


def _remove_work_dir(path: Path) -> None:
    """Remove a fastload-made folder: its plain files (journal entries, temp files), then itself."""
    for name in _listdir(path):
        if not stat.S_ISDIR(os.lstat(path / name).st_mode):
            os.unlink(path / name)
    try:
        os.rmdir(path)
    except OSError:
        pass  # gone already, or something else lives there: left for remove_dataset's warning


def swap_in(staging: Path, out: Path) -> None:
    """Make the finished dataset at ``staging`` the one at ``out``; ``staging`` then holds the old.

    One atomic exchange where the file system has it: a reader opening OUT sees either the old
    dataset or the new one, never a half. Elsewhere two renames, with OUT briefly missing.
    """
    if not _exchange(staging, out):
        parked = out.with_name(f".{out.name}.fastload-old")
        os.rename(out, parked)
        os.rename(staging, out)
        os.rename(parked, staging)
    fsync_dir(out.parent)


def _exchange(a: Path, b: Path) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False  # no exchange on this kernel or file system
    raise OSError(code, os.strerror(code), str(b))


class PackLock:
    """An exclusive flock on ``DIR/.pack.lock``: a second pack into the same folder refuses at once.

    The file is removed when the pack ends (a finished dataset keeps no lock file). Removing a
    lock file races with a pack that opened it just before: so after locking, the descriptor
    must still be the file at that name, or the lock is taken again.
    """

    def __init__(self, folder: Path) -> None:
        self.path = folder / PACK_LOCK_NAME
        self.fd = -1

    def __enter__(self) -> PackLock:
        while True:
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise PackError(f"{self.path}: cannot be used as the pack's lock ({exc.strerror}); "
                                "fastload never writes through links: remove it") from None
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(self.fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(self.fd)
                raise PackError(f"{self.path.parent}: another pack (pid {holder}) is writing here; "
                                "wait for it to finish or choose another -o") from None
            if self._still_ours():
                break
            os.close(self.fd)  # removed by the pack that held it: lock the new one
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)
        return self

    def _still_ours(self) -> bool:
        try:
            here = os.lstat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(self.fd)
        return stat.S_ISREG(mine.st_mode) and (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)

    def __exit__(self, *exc: object) -> None:
        if self._still_ours():
            os.unlink(self.path)  # while still holding it: a waiting pack then finds it gone
        os.close(self.fd)
