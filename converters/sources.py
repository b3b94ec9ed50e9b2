"""Source listing: an ImageFolder tree, a flat folder or a CSV/JSONL list → sorted items to pack."""

from __future__ import annotations

import csv
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from fastload.errors import SourceError, SourceNotFoundError

Layout = Literal["auto", "imagefolder", "flat", "list"]
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
LIST_SUFFIXES = (".csv", ".jsonl")


@dataclass(frozen=True)
class SourceItem:
    """One file to pack: where it is, its path relative to SRC, its label and its size."""

    path: Path
    rel: str
    label: int
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class Skip:
    """A file left out, and why (every skip is counted and reported)."""

    rel: str
    reason: str


@dataclass
class SourceListing:
    """Everything found in SRC, in record order."""

    root: Path
    layout: str
    items: list[SourceItem]
    classes: list[str] | None
    fields: dict[str, str] = field(default_factory=dict)  # extra field → dtype
    field_values: dict[str, list[Any]] = field(default_factory=dict)  # extra field → one value per item
    skipped: list[Skip] = field(default_factory=list)  # unreadable entries found while listing
    ignored: Counter[str] = field(default_factory=Counter)  # extension → count, not selected


def normalize_extensions(extensions: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    if not extensions:
        return IMAGE_EXTENSIONS
    return tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)


def list_source(src: Path, *, layout: Layout = "auto", extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
                on_error: str = "fail", max_file_size: int | None = None) -> SourceListing:
    """List SRC in record order; see the README's "Record order" for the exact rules."""
    if not src.exists() and not src.is_symlink():
        raise SourceNotFoundError(f"{src}: no such folder or file list; check the path")
    if src.is_file():
        if layout not in ("auto", "list") or src.suffix.lower() not in LIST_SUFFIXES:
            raise SourceError(f"{src}: a file source must be a .csv or .jsonl file list "
                              "(columns path,label plus optional fields)")
        return _list_file(src, extensions)
    if not src.is_dir():
        raise SourceError(f"{src}: not a folder or a file list")
    if layout == "list":
        raise SourceError(f"{src}: --layout list needs a .csv or .jsonl file, not a folder")
    entries = sorted(os.scandir(src), key=lambda e: e.name)
    subdirs = [e for e in entries if not e.name.startswith(".") and _is_dir(e)]
    top_files = [e for e in entries if not e.name.startswith(".") and not _is_dir(e)
                 and e.name.lower().endswith(extensions)]
    if layout == "auto":
        if subdirs and top_files:
            raise SourceError(
                f"{src}: holds both class folders ({subdirs[0].name}/, ...) and files "
                f"({top_files[0].name}, ...); pass --layout imagefolder (top files ignored) or "
                "--layout flat (every file, no labels)")
        layout = "imagefolder" if subdirs else "flat"
    listing = SourceListing(root=src, layout=layout, items=[], classes=None)
    walker = _Walker(src, extensions, on_error, listing)
    if layout == "imagefolder":
        listing.classes = [d.name for d in subdirs]
        for label, d in enumerate(subdirs):
            walker.walk(Path(d.path), label)
        for e in top_files:
            listing.ignored["(file outside a class folder)"] += 1
        for e in entries:  # the rest of SRC's own entries are counted as the walk counts them below
            if e.name.startswith("."):
                listing.ignored["(hidden)"] += 1
            elif not _is_dir(e) and not e.name.lower().endswith(extensions):
                listing.ignored[Path(e.name).suffix.lower() or "(no extension)"] += 1
    else:
        walker.walk(src, -1)
    if not listing.items and not listing.skipped:
        found = f"; it holds {sum(listing.ignored.values())} files with other extensions" if listing.ignored else ""
        raise SourceError(f"{src}: no files with extensions {', '.join(extensions)} found{found}; "
                          "pass --extensions to choose others")
    return listing


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=True)
    except OSError:
        return False


class _Walker:
    """Recursive, sorted walk that follows symlinks but detects loops."""

    def __init__(self, root: Path, extensions: tuple[str, ...], on_error: str, listing: SourceListing):
        self.root, self.extensions, self.on_error, self.listing = root, extensions, on_error, listing
        st = root.stat()
        # Folders on the path from SRC down to the one being walked: meeting one again is a loop.
        # (A set of every folder seen would also flag a second link to a sibling, and would let a
        # link back to SRC walk the other class folders under the wrong label.)
        self.ancestors: set[tuple[int, int]] = {(st.st_dev, st.st_ino)}

    def problem(self, rel: str, reason: str) -> None:
        if self.on_error == "fail":
            raise SourceError(f"{self.root / rel}: {reason}; fix or remove it, or pass --on-error skip")
        self.listing.skipped.append(Skip(rel, reason))

    def walk(self, directory: Path, label: int) -> None:
        rel_dir = directory.relative_to(self.root).as_posix()
        try:
            st = directory.stat()
            key = (st.st_dev, st.st_ino)
            if directory != self.root and key in self.ancestors:
                return self.problem(rel_dir, "symlink loop (a link to a folder that contains it)")
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            return self.problem(rel_dir, f"cannot list folder ({exc.strerror})")
        self.ancestors.add(key)
        try:
            self._walk_entries(entries, label)
        finally:
            if directory != self.root:
                self.ancestors.discard(key)

    def _walk_entries(self, entries: list[os.DirEntry[str]], label: int) -> None:
        for entry in entries:
            path = Path(entry.path)
            rel = path.relative_to(self.root).as_posix()
            if entry.name.startswith("."):
                self.listing.ignored["(hidden)"] += 1
                continue
            if _is_dir(entry):
                self.walk(path, label)
                continue
            if not entry.name.lower().endswith(self.extensions):
                self.listing.ignored[Path(entry.name).suffix.lower() or "(no extension)"] += 1
                continue
            try:
                st = entry.stat(follow_symlinks=True)
            except OSError as exc:
                self.problem(rel, f"unreadable file ({exc.strerror})")
                continue
            self.listing.items.append(SourceItem(path, rel, label, st.st_size, st.st_mtime_ns))


def _list_file(src: Path, extensions: tuple[str, ...]) -> SourceListing:
    """Rows of a CSV (with a header) or JSONL list, in file order; paths relative to the list's folder."""
    rows = _read_rows(src)
    if not rows:
        raise SourceError(f"{src}: the file list has no rows")
    base = src.parent
    labels_raw = [row.pop("label", None) for _, row in rows]
    extra_names = sorted({k for _, row in rows for k in row if k != "path"})
    listing = SourceListing(root=base, layout="list", items=[], classes=None)
    label_ids, listing.classes = _labels(src, rows, labels_raw)
    for name in extra_names:
        listing.fields[name], listing.field_values[name] = _field(src, rows, name)
    for (line, row), label in zip(rows, label_ids):
        raw_path = row.get("path")
        if not isinstance(raw_path, str) or not raw_path:
            raise SourceError(f"{src}:{line}: missing 'path'")
        path = Path(raw_path) if os.path.isabs(raw_path) else base / raw_path
        rel = Path(os.path.normpath(raw_path)).as_posix()
        try:
            st = path.stat()
            size, mtime = st.st_size, st.st_mtime_ns
        except OSError:
            size, mtime = -1, -1  # reported as unreadable when read, under --on-error
        listing.items.append(SourceItem(path, rel, label, size, mtime))
    return listing


def _read_rows(src: Path) -> list[tuple[int, dict[str, Any]]]:
    try:
        text = src.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"{src}: cannot read the file list ({exc})") from None
    if src.suffix.lower() == ".jsonl":
        rows = []
        for line_no, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SourceError(f"{src}:{line_no}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise SourceError(f"{src}:{line_no}: each line must be a JSON object with a 'path'")
            rows.append((line_no, row))
        return rows
    reader = csv.DictReader(text.splitlines())
    if not reader.fieldnames or "path" not in reader.fieldnames:
        raise SourceError(f"{src}: the CSV needs a header row with a 'path' column "
                          f"(found {reader.fieldnames!r})")
    return [(i + 2, {k: v for k, v in row.items() if k is not None}) for i, row in enumerate(reader)]


def _labels(src: Path, rows: list, raw: list[Any]) -> tuple[list[int], list[str] | None]:
    """Integer labels as given, or string labels numbered by sorted name (like ImageFolder)."""
    if all(v is None or v == "" for v in raw):
        return [-1] * len(raw), None
    as_int = [_as_int(v) for v in raw]
    if all(v is not None for v in as_int):
        negative = [i for i, v in enumerate(as_int) if v < 0]
        if negative:
            raise SourceError(f"{src}:{rows[negative[0]][0]}: label {as_int[negative[0]]} is negative")
        return as_int, None
    missing = [i for i, v in enumerate(raw) if v is None or v == ""]
    if missing:
        raise SourceError(f"{src}:{rows[missing[0]][0]}: missing label (other rows have one)")
    classes = sorted({str(v) for v in raw})
    index = {c: i for i, c in enumerate(classes)}
    return [index[str(v)] for v in raw], classes


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _field(src: Path, rows: list, name: str) -> tuple[str, list[Any]]:
    """An extra column's dtype (int64, float64 or str) and its values, one per row."""
    values = [row.get(name) for _, row in rows]
    ints = [_as_int(v) for v in values]
    if all(v is not None for v in ints):
        return "int64", ints
    try:
        floats = [float(v) for v in values if not isinstance(v, bool)]
        if len(floats) == len(values):
            return "float64", floats
    except (TypeError, ValueError):
        pass
    bad = [i for i, v in enumerate(values) if v is not None and not isinstance(v, (str, int, float))]
    if bad:
        raise SourceError(f"{src}:{rows[bad[0]][0]}: field {name!r} holds {type(values[bad[0]]).__name__}; "
                          "extra fields must be numbers or strings")
    return "str", ["" if v is None else str(v) for v in values]
