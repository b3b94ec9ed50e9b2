"""Source listing: an ImageFolder tree, a flat folder or a CSV/JSONL list → sorted items to pack.

Only what can be packed is listed; anything else is a bad entry (see converters.sources.items). A
file list is read by converters.sources.file_lists; a folder is walked here.

Symlinks are followed, and each real folder is listed once: a class folder under its own name and
label, any other folder the first time the sorted walk reaches it. A later link to a folder already
listed (or to a class folder) is reported as a skip naming the first path, never an error: its files
are packed, once. A link to a folder that contains it is a symlink loop, a bad entry.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from fastload.converters.sources.confine import ListRoot
from fastload.converters.sources.file_lists import list_file_list
from fastload.converters.sources.items import (
    LIST_SUFFIXES,
    SOURCE_KINDS,
    Layout,
    Skip,
    SourceItem,
    SourceListing,
    bad_entry,
    escaped,
    file_refusal,
)

from fastload.errors import SourceError, SourceNotFoundError
from fastload.format.files import kernel_refusal
from fastload.format.layout import IMAGE_EXTENSIONS

_LOOP = "symlink loop (a link to a folder that contains it)"
_FolderKey = tuple[int, int]  # (st_dev, st_ino): one real folder, however it is reached


def list_source(src: Path, *, layout: Layout = "auto", extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
                on_error: str = "raise", max_file_size: int | None = None,
                root: str | os.PathLike[str] | None = None, allow_outside_root: bool = False) -> SourceListing:
    """List SRC in record order; see docs/cli.md ("Sources and record order") for the exact rules.

    ``max_file_size`` (bytes, None for no limit): a larger file is a bad entry, never read. A file
    list's paths must resolve inside ``root`` (None: the list's folder) unless
    ``allow_outside_root`` (see converters.sources.confine).
    """
    if not src.exists() and not src.is_symlink():
        raise SourceNotFoundError(f"{src}: no such folder or file list; check the path")
    if src.is_file():
        if src.suffix.lower() in IMAGE_EXTENSIONS + extensions and src.suffix.lower() not in LIST_SUFFIXES:
            raise SourceError(f"{src}: is an image file; SRC is {SOURCE_KINDS}: pass the folder it is in "
                              f"({src.parent})")
        if src.suffix.lower() not in LIST_SUFFIXES:
            raise SourceError(f"{src}: not a kind of file fastload packs; SRC is {SOURCE_KINDS}")
        if layout not in ("auto", "list"):
            raise SourceError(f"{src}: --layout {layout} does not read a file list; leave --layout out, or "
                              "give --layout list")
        return list_file_list(src, on_error, max_file_size, ListRoot.of(src, root, allow_outside_root))
    if root is not None or allow_outside_root:
        raise SourceError(f"{src}: --root and --allow-outside-root are for the paths a CSV/JSONL file list "
                          "gives; a folder is packed from what lies in it: leave them out")
    if not src.is_dir():
        raise SourceError(f"{src}: not a folder or a file list")
    if layout == "list":
        raise SourceError(f"{src}: --layout list needs a .csv or .jsonl file, not a folder")
    entries = sorted(os.scandir(src), key=lambda e: e.name)
    subdirs = [e for e in entries if not e.name.startswith(".") and _is_dir(e)]
    top_files = [e for e in entries if not e.name.startswith(".") and not _is_dir(e)
                 and e.name.lower().endswith(extensions)]
    layout = choose_layout(src, layout, [e.name for e in subdirs], [e.name for e in top_files])
    listing = SourceListing(root=src, layout=layout, items=[], classes=None)
    walker = _Walker(src, extensions, on_error, max_file_size, listing)
    if layout == "imagefolder":
        classes = []
        for d in subdirs:  # a class name goes into the manifest: it must be UTF-8 like any path
            if _is_utf8(d.name):
                classes.append(d)
            else:
                walker.problem(d.name, "folder name is not valid UTF-8; rename it", fix=None)
        listing.classes = [d.name for d in classes]
        for d in classes:  # claimed first, so a link from another class cannot take them over
            walker.claim(Path(d.path))
        for label, d in enumerate(classes):
            walker.walk(Path(d.path), label)
        for e in top_files:
            listing.ignored["(file outside a class folder)"] += 1
        for e in entries:  # the rest of SRC's own entries are counted as the walk counts them below
            if e.name.startswith("."):
                listing.ignored["(hidden)"] += 1
            elif not _is_dir(e) and not e.name.lower().endswith(extensions):
                listing.ignored[_suffix(e.name)] += 1
    else:
        walker.walk(src, -1)
    check_found(src, listing, extensions, "files")
    return listing


def choose_layout(src: object, layout: str, subdirs: list[str], top_files: list[str]) -> str:
    """``layout``, or for "auto" the one SRC's top level shows (class folders or files), refusing
    a top level that holds both."""
    if layout != "auto":
        return layout
    if subdirs and top_files:
        raise SourceError(
            f"{src}: holds both class folders ({escaped(subdirs[0])}/, ...) and files "
            f"({escaped(top_files[0])}, ...); pass --layout imagefolder (top files ignored) or "
            "--layout flat (every file, no labels)")
    return "imagefolder" if subdirs else "flat"


def check_found(src: object, listing: SourceListing, extensions: tuple[str, ...], what: str) -> None:
    """Refuse a source in which nothing was selected and nothing was bad (``what``: files, objects)."""
    if not listing.items and not listing.skipped:
        found = f"; it holds {sum(listing.ignored.values())} {what} with other extensions" if listing.ignored else ""
        raise SourceError(f"{src}: no {what} with extensions {', '.join(extensions)} found{found}; "
                          "pass --extensions to choose others")


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=True)
    except OSError:
        return False


def _is_utf8(name: str) -> bool:
    """False for a name with bytes that are not UTF-8 (Python holds them as lone surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _suffix(name: str) -> str:
    return escaped(Path(name).suffix.lower()) or "(no extension)"


class _Walker:
    """Sorted, depth-first walk on an explicit stack (no depth limit); follows symlinks, lists each
    real folder once, and reports loops."""

    def __init__(self, root: Path, extensions: tuple[str, ...], on_error: str, max_file_size: int | None,
                 listing: SourceListing):
        self.root, self.extensions, self.on_error, self.listing = root, extensions, on_error, listing
        self.max_file_size = max_file_size
        st = root.stat()
        self.root_key: _FolderKey = (st.st_dev, st.st_ino)
        # Every real folder walked (or claimed) → the rel path it is listed under. SRC itself is on
        # the path to every folder, so a link back to it is always a loop, never a relabelled walk.
        self.listed: dict[_FolderKey, str] = {}

    def problem(self, rel: str, reason: str, fix: str | None = "fix or remove it") -> None:
        bad_entry(self.listing, self.on_error, self.root / rel, rel, reason, fix)

    def claim(self, directory: Path) -> None:
        """Reserve a class folder for its own name (a bad one is reported when walked)."""
        try:
            st = directory.stat()
        except OSError:
            return
        self.listed.setdefault((st.st_dev, st.st_ino), directory.relative_to(self.root).as_posix())

    def walk(self, directory: Path, label: int) -> None:
        ancestors = {self.root_key}  # the folders from SRC down to the one being walked
        stack: list[tuple[Iterator[os.DirEntry[str]], _FolderKey]] = []
        opened = self._open(directory, ancestors)
        while opened is not None or stack:
            if opened is not None:
                stack.append(opened)
                ancestors.add(opened[1])
            entries, key = stack[-1]
            entry = next(entries, None)
            if entry is None:  # this folder is done: back to its parent
                stack.pop()
                if key != self.root_key:
                    ancestors.discard(key)
                opened = None
                continue
            sub = self._entry(entry, label)
            opened = None if sub is None else self._open(sub, ancestors)

    def _open(self, directory: Path, ancestors: set[_FolderKey]
              ) -> tuple[Iterator[os.DirEntry[str]], _FolderKey] | None:
        """The folder's sorted entries, or None when it is a loop, listed already, or unreadable."""
        rel = directory.relative_to(self.root).as_posix()
        try:
            st = directory.stat()
            key = (st.st_dev, st.st_ino)
            if directory != self.root and key in ancestors:
                return self.problem(rel, _LOOP)
            if (kernel := kernel_refusal(st)) is not None:  # a link to /proc/self: its root/ is all of /
                return self.problem(rel, kernel, fix="remove the link")
            first = self.listed.get(key, rel)
            if first != rel:  # not a bad entry: its files are listed, under `first`
                self.listing.skipped.append(Skip(
                    rel, f"same folder as {first} (reached through a symlink); listed once"))
                return None
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            return self.problem(rel, f"cannot list folder ({exc.strerror})")
        self.listed[key] = rel
        return iter(entries), key

    def _entry(self, entry: os.DirEntry[str], label: int) -> Path | None:
        """List one entry of a folder; a sub-folder is returned, to be walked next."""
        if entry.name.startswith("."):
            self.listing.ignored["(hidden)"] += 1
            return None
        is_dir = _is_dir(entry)
        if not is_dir and not entry.name.lower().endswith(self.extensions):
            self.listing.ignored[_suffix(entry.name)] += 1
            return None
        path = Path(entry.path)
        rel = path.relative_to(self.root).as_posix()
        if not _is_utf8(entry.name):
            self.problem(rel, f"{'folder' if is_dir else 'file'} name is not valid UTF-8; rename it", fix=None)
            return None
        if is_dir:
            return path
        try:
            st = entry.stat(follow_symlinks=True)
        except OSError as exc:
            self.problem(rel, f"unreadable file ({exc.strerror})")
            return None
        refusal = file_refusal(st, self.max_file_size)
        if refusal:
            self.problem(rel, *refusal)
            return None
        self.listing.items.append(SourceItem(path, rel, label, st.st_size, st.st_mtime_ns,
                                             stamp=(st.st_ctime_ns, st.st_ino)))
        return None

