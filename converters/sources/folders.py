"""Source listing: an ImageFolder tree, a flat folder or a CSV/JSONL list → sorted items to pack.

Only what can be packed is listed: a regular file (not a FIFO or a device, which would block or read
without end) within ``max_file_size``, under a UTF-8 name (the index stores names as UTF-8). Anything
else is a bad entry: an error under ``on_error="fail"``, a reported skip under ``"skip"``.

Symlinks are followed, and each real folder is listed once: a class folder under its own name and
label, any other folder the first time the sorted walk reaches it. A later link to a folder already
listed (or to a class folder) is reported as a skip naming the first path, never an error: its files
are packed, once. A link to a folder that contains it is a symlink loop, a bad entry.
"""

from __future__ import annotations

import csv
import json
import math
import os
import stat
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fastload.converters.sources.confine import ListRoot
from fastload.errors import SourceError, SourceNotFoundError
from fastload.format.files import kernel_refusal, kind_of
from fastload.format.layout import IMAGE_EXTENSIONS, field_name_problem

Layout = Literal["auto", "imagefolder", "flat", "list"]
LIST_SUFFIXES = (".csv", ".jsonl")
_INT64 = (-(2**63), 2**63 - 1)
_BOOLS = {True: True, False: False, "true": True, "false": False}
_LOOP = "symlink loop (a link to a folder that contains it)"
_FolderKey = tuple[int, int]  # (st_dev, st_ino): one real folder, however it is reached


@dataclass(frozen=True)
class SourceFile:
    """One more file of a record (a mask, a depth map): where it is, its path as listed, its size."""

    path: Path
    rel: str
    size: int  # -1: could not be examined (reported, naming its record, when read)
    mtime_ns: int
    stamp: tuple[int, int] = (-1, -1)  # (ctime_ns, inode): what a rewrite cannot keep (see converters.packing.plan)


@dataclass(frozen=True)
class SourceItem:
    """One file to pack: where it is, its path relative to SRC, its label and its size; ``files``:
    its record's other files, one per file field (``SourceListing.file_fields``), in that order."""

    path: Path
    rel: str
    label: int
    size: int
    mtime_ns: int
    files: tuple[SourceFile, ...] = ()
    stamp: tuple[int, int] = (-1, -1)  # (ctime_ns, inode): what a rewrite cannot keep (see converters.packing.plan)

    @property
    def total_size(self) -> int:
        """Bytes of the record's files together (what the shard plan counts)."""
        return max(self.size, 0) + sum(max(f.size, 0) for f in self.files)


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
    file_fields: dict[str, str] = field(default_factory=dict)  # file field → type (items' ``files``, in order)
    skipped: list[Skip] = field(default_factory=list)  # bad entries, and links to folders listed already
    ignored: Counter[str] = field(default_factory=Counter)  # extension → count, not selected
    list_root: ListRoot | None = None  # a file list's: where the paths it gives may point


def normalize_extensions(extensions: list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    if not extensions:
        return IMAGE_EXTENSIONS
    return tuple(e.lower() if e.startswith(".") else "." + e.lower() for e in extensions)


def list_source(src: Path, *, layout: Layout = "auto", extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
                on_error: str = "fail", max_file_size: int | None = None,
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
            raise SourceError(f"{src}: is an image file; SRC must be a folder of images or a .csv/.jsonl "
                              f"file list; pass the folder it is in ({src.parent})")
        if layout not in ("auto", "list") or src.suffix.lower() not in LIST_SUFFIXES:
            raise SourceError(f"{src}: a file source must be a .csv or .jsonl file list "
                              "(columns path,label plus optional fields)")
        return _list_file(src, on_error, max_file_size, ListRoot.of(src, root, allow_outside_root))
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
            f"{src}: holds both class folders ({_escaped(subdirs[0])}/, ...) and files "
            f"({_escaped(top_files[0])}, ...); pass --layout imagefolder (top files ignored) or "
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


def _escaped(text: str) -> str:
    """``text`` printable and UTF-8: undecodable bytes written as ``\\xe9``."""
    return os.fsencode(text).decode("utf-8", "backslashreplace")


def _suffix(name: str) -> str:
    return _escaped(Path(name).suffix.lower()) or "(no extension)"


def _refusal(st: os.stat_result, max_file_size: int | None) -> tuple[str, str | None] | None:
    """Why a file with this stat cannot be packed (the reason, and what to do), or None."""
    if not stat.S_ISREG(st.st_mode):
        return f"not a regular file ({kind_of(st.st_mode)})", "remove it"
    kernel = kernel_refusal(st)  # /proc/self/environ is a regular file
    if kernel is not None:
        return kernel, "remove it"
    if max_file_size is not None and st.st_size > max_file_size:
        return f"{st.st_size} bytes is over --max-file-size {max_file_size}; raise the limit or remove it", None
    return None


def _problem(listing: SourceListing, on_error: str, path: Path | str, rel: str, reason: str,
             fix: str | None = "fix or remove it") -> None:
    """A bad entry: raise under 'fail', else count it as skipped. ``fix`` None: ``reason`` says it."""
    if on_error == "fail":
        what = f"{reason}; {fix}" if fix else reason
        raise SourceError(f"{_escaped(str(path))}: {what}, or pass --on-error skip")
    listing.skipped.append(Skip(_escaped(rel), reason))


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
        _problem(self.listing, self.on_error, self.root / rel, rel, reason, fix)

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
        refusal = _refusal(st, self.max_file_size)
        if refusal:
            self.problem(rel, *refusal)
            return None
        self.listing.items.append(SourceItem(path, rel, label, st.st_size, st.st_mtime_ns,
                                             stamp=(st.st_ctime_ns, st.st_ino)))
        return None


def _list_file(src: Path, on_error: str, max_file_size: int | None, confine: ListRoot) -> SourceListing:
    """Rows of a CSV (with a header) or JSONL list, in file order; paths relative to the list's
    folder, each resolving inside ``confine``'s root (else a bad entry)."""
    rows = _read_rows(src)
    if not rows:
        raise SourceError(f"{src}: the file list has no rows")
    base = src.parent
    labels_raw = [row.pop("label", None) for _, row in rows]
    extra_names = sorted({k for _, row in rows for k in row if k != "path"})
    check_field_names(src, extra_names, "a column of the list")
    listing = SourceListing(root=base, layout="list", items=[], classes=None, list_root=confine)
    label_ids, listing.classes = _labels(src, rows, labels_raw)
    for name in extra_names:
        listing.fields[name], listing.field_values[name] = _field(src, rows, name)
    kept: list[int] = []  # rows listed; the others are skipped, with their field values
    for i, ((line, row), label) in enumerate(zip(rows, label_ids)):
        raw_path = row.get("path")
        if not isinstance(raw_path, str) or not raw_path:
            raise SourceError(f"{src}:{line}: missing 'path'")
        path, outside = confine.locate(raw_path)
        rel = Path(os.path.normpath(raw_path)).as_posix()
        if outside is not None:
            _problem(listing, on_error, f"{src}:{line}: path {raw_path!r}", rel, outside, fix=None)
            continue
        try:
            st = path.stat()
        except OSError:
            size, mtime, stamp = -1, -1, (-1, -1)  # reported as unreadable when read, under --on-error
        else:
            refusal = _refusal(st, max_file_size)
            if refusal:
                _problem(listing, on_error, path, rel, *refusal)
                continue
            size, mtime, stamp = st.st_size, st.st_mtime_ns, (st.st_ctime_ns, st.st_ino)
        kept.append(i)
        listing.items.append(SourceItem(path, rel, label, size, mtime, stamp=stamp))
    if len(kept) < len(rows):
        listing.field_values = {k: [v[i] for i in kept] for k, v in listing.field_values.items()}
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
            except (ValueError, RecursionError) as exc:  # a number of 5,000 digits, lists 100,000 deep
                raise SourceError(f"{src}:{line_no}: not valid JSON ({getattr(exc, 'msg', exc)})") from None
            if not isinstance(row, dict):
                raise SourceError(f"{src}:{line_no}: each line must be a JSON object with a 'path'")
            rows.append((line_no, row))
        return rows
    reader = csv.DictReader(text.splitlines())
    if not reader.fieldnames or "path" not in reader.fieldnames:
        raise SourceError(f"{src}: the CSV needs a header row with a 'path' column "
                          f"(found {reader.fieldnames!r})")
    return [(i + 2, {k: v for k, v in row.items() if k is not None}) for i, row in enumerate(reader)]


def _as_list(value: Any) -> list | None:
    """A JSONL list, or a CSV cell holding one in JSON (``[[0, 0, 10, 20]]``); else None."""
    if isinstance(value, list):
        return value
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):  # not JSON, or more digits or depth than Python parses
            return None
        return parsed if isinstance(parsed, list) else None
    return None


def _array_field(src: Path, rows: list, name: str, values: list[Any],
                 lists: list[list | None]) -> tuple[str, list[np.ndarray]]:
    """An array field: every row a (nested) list of numbers, the same shape but for the first
    dimension (an empty or missing value: no rows); its type string and one array per row."""
    arrays: list[np.ndarray] = []
    for (line, _), raw, listed in zip(rows, values, lists):
        if listed is None and raw not in (None, ""):
            raise SourceError(f"{src}:{line}: field {name!r} is {raw!r}, not a list like the other rows' "
                              "(an array field needs a list, or nothing, in every row)")
        try:
            arrays.append(np.array(listed if listed is not None else [], dtype=object))
        except ValueError:
            raise SourceError(f"{src}:{line}: field {name!r} is a ragged list (rows of different lengths "
                              "inside it); an array field's rows must all have the same shape") from None
    for k, a in enumerate(arrays):  # numpy keeps a ragged list as an object array of lists
        if any(isinstance(v, list) for v in a.reshape(-1)):
            raise SourceError(f"{src}:{rows[k][0]}: field {name!r} is a ragged list (rows of different "
                              "lengths inside it); an array field's rows must all have the same shape")
        if any(isinstance(v, (dict, str)) or v is None for v in a.reshape(-1)):
            raise SourceError(f"{src}:{rows[k][0]}: field {name!r} holds something other than numbers; "
                              "array fields hold numbers or booleans")
    flat = [v for a in arrays for v in a.reshape(-1)]
    element = ("bool" if flat and all(isinstance(v, bool) for v in flat) else
               "int64" if all(isinstance(v, int) and not isinstance(v, bool) for v in flat) else "float64")
    if element == "int64":
        huge = next((k for k, a in enumerate(arrays) for v in a.reshape(-1) if not _INT64[0] <= v <= _INT64[1]), None)
        if huge is not None:
            raise SourceError(f"{src}:{rows[huge][0]}: field {name!r} holds a number out of range for int64")
    if element == "float64":  # booleans among the numbers are 0.0 and 1.0, exactly
        for (line, _), a in zip(rows, arrays):
            for v in a.reshape(-1):
                if not isinstance(v, bool):
                    _exact_float(src, line, name, v)
    shaped = [(k, a.shape) for k, a in enumerate(arrays) if a.size]
    inner = shaped[0][1][1:] if shaped else ()
    for k, shape in shaped:
        if shape[1:] != inner:
            raise SourceError(f"{src}:{rows[k][0]}: field {name!r} has shape {list(shape)}, the first row "
                              f"with one has {list(shaped[0][1])}: only the first dimension may vary")
    out = [a.astype(element).reshape(len(a) if a.size else 0, *inner) for a in arrays]
    counts = {len(a) for a in out}
    first = str(counts.pop()) if len(counts) == 1 and shaped else "*"
    return f"{element}[{','.join([first, *map(str, inner)])}]", out


def _labels(src: Path, rows: list, raw: list[Any]) -> tuple[list[int], list[str] | None]:
    """Integer labels as given, or string labels numbered by sorted name (like ImageFolder)."""
    if all(v is None or v == "" for v in raw):
        return [-1] * len(raw), None
    as_int = [_as_int(v) for v in raw]
    if all(v is not None for v in as_int):
        negative = [i for i, v in enumerate(as_int) if v < 0]
        if negative:
            raise SourceError(f"{src}:{rows[negative[0]][0]}: label {as_int[negative[0]]} is negative")
        huge = [i for i, v in enumerate(as_int) if v > _INT64[1]]
        if huge:
            raise SourceError(f"{src}:{rows[huge[0]][0]}: label {as_int[huge[0]]} is out of range "
                              "(0..2**63-1); use smaller class numbers")
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


def check_field_names(where: object, names: Iterable[str], what: str) -> None:
    """Refuse, before anything is packed, a name that could land on another field's index columns
    or on no file at all (see fastload.format.layout); ``what`` says where the name comes from."""
    for name in names:
        problem = field_name_problem(name)
        if problem is not None:
            raise SourceError(f"{where}: field name {name!r} ({what}) {problem}")


def _as_float(value: Any) -> float | None:
    """A number, or a CSV cell holding one, as float64 (an integer past its range: inf); else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None
    except OverflowError:
        return math.inf


def _exact_float(src: Path, line: int, name: str, value: float | str) -> float:
    """A float64 field's ``value`` as float64, refused when that does not hold it as written: a
    NaN, an infinity or a number past float64's range, or a whole number that would lose digits."""
    number = _as_float(value)
    if number is None or not math.isfinite(number):
        raise SourceError(f"{src}:{line}: field {name!r} is {value!r}, not a finite number (NaN, infinities and "
                          "numbers past float64's 1.8e308 are refused); fix the value")
    whole = _as_int(value)
    if whole is not None and int(number) != whole:
        raise SourceError(f"{src}:{line}: field {name!r} is {whole}, which float64 (the field's type: other "
                          f"values of it are fractions) cannot hold exactly (it would be {int(number)}); make "
                          "every value of the field a whole number, or store it as text")
    return number


def _field(src: Path, rows: list, name: str) -> tuple[str, list[Any]]:
    """An extra column's dtype (int64, float64, bool, str, or an array type such as
    ``float64[*,4]``) and its values, one per row."""
    values = [row.get(name) for _, row in rows]
    lists = [_as_list(v) for v in values]
    if any(v is not None for v in lists):
        return _array_field(src, rows, name, values, lists)
    flags = [_BOOLS.get(v.lower()) if isinstance(v, str) else v if isinstance(v, bool) else None for v in values]
    if values and all(flag is not None for flag in flags):  # JSON true/false, or a CSV's "true"/"false"
        return "bool", flags
    ints = [_as_int(v) for v in values]
    if all(v is not None for v in ints):
        huge = [i for i, v in enumerate(ints) if not _INT64[0] <= v <= _INT64[1]]
        if huge:  # as float64 it would silently lose digits
            raise SourceError(f"{src}:{rows[huge[0]][0]}: field {name!r} is {ints[huge[0]]}, out of range "
                              "for int64 (-2**63..2**63-1); store smaller numbers or text")
        return "int64", ints
    if all(_as_float(v) is not None for v in values):
        return "float64", [_exact_float(src, line, name, v) for (line, _), v in zip(rows, values)]
    bad = [i for i, v in enumerate(values) if v is not None and not isinstance(v, (str, int, float))]
    if bad:
        raise SourceError(f"{src}:{rows[bad[0]][0]}: field {name!r} holds {type(values[bad[0]]).__name__}; "
                          "extra fields must be numbers or strings")
    return "str", ["" if v is None else str(v) for v in values]
