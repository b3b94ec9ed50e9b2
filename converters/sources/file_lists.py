"""Source listing of a CSV/JSONL file list: its rows in file order, their labels and typed columns.

A row's ``path`` is relative to the list's folder and must resolve inside its root (see
converters.sources.confine); every other column is a field, typed from all its values by
``typed_field`` (numbers, booleans, text, or lists of numbers as arrays), which a folder's JSON
sidecars share (converters.sources.sidecars).
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from fastload.converters.sources.confine import ListRoot
from fastload.converters.sources.items import (
    SourceItem,
    SourceListing,
    bad_entry,
    check_field_names,
    file_refusal,
)
from fastload.converters.sources.json_text import BadJson, parse_json

from fastload.errors import SourceError
from fastload.format.layout import float64_problem

_INT64 = (-(2**63), 2**63 - 1)
_BOOLS = {True: True, False: False, "true": True, "false": False}


def list_file_list(src: Path, on_error: str, max_file_size: int | None, confine: ListRoot) -> SourceListing:
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
        listing.fields[name], listing.field_values[name] = typed_field(src, rows, name)
    kept: list[int] = []  # rows listed; the others are skipped, with their field values
    for i, ((line, row), label) in enumerate(zip(rows, label_ids)):
        raw_path = row.get("path")
        if not isinstance(raw_path, str) or not raw_path:
            raise SourceError(f"{src}:{line}: missing 'path'")
        path, outside = confine.locate(raw_path)
        rel = Path(os.path.normpath(raw_path)).as_posix()
        if outside is not None:
            bad_entry(listing, on_error, f"{src}:{line}: path {raw_path!r}", rel, outside, fix=None)
            continue
        try:
            st = path.stat()
        except OSError:
            size, mtime, stamp = -1, -1, (-1, -1)  # reported as unreadable when read, under --on-error
        else:
            refusal = file_refusal(st, max_file_size)
            if refusal:
                bad_entry(listing, on_error, path, rel, *refusal)
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
                row = parse_json(line)
            except BadJson as exc:  # a number of 5,000 digits, lists 100,000 deep
                raise SourceError(f"{src}:{line_no}: {exc}") from None
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
            parsed = parse_json(value)
        except BadJson:  # not JSON, or more digits or depth than a field holds
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
    """A float64 field's ``value`` as float64, refused (fastload.format.layout.float64_problem) when
    that does not hold it as written."""
    whole = _as_int(value)
    number = whole if whole is not None else _as_float(value)
    problem = "not a number" if number is None else float64_problem(number, value)
    if problem is not None:
        raise SourceError(f"{src}:{line}: field {name!r} is {problem}")
    return float(number)  # type: ignore[arg-type]


def typed_field(src: Path, rows: list, name: str) -> tuple[str, list[Any]]:
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
