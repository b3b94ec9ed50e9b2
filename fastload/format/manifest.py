"""The manifest: what a packed dataset holds, parsed strictly and written last, atomically."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fastload.errors import DatasetNotFoundError, ManifestError
from fastload.format.files import read_regular, write_new
from fastload.format.layout import (
    COLUMNS, FIELD_DTYPES, FILE_TYPES, FORMAT_NAME, FORMAT_VERSION, INDEX_DIR, MANIFEST_NAME, SHARD_NAME,
    SHARD_SUFFIX, STORAGE_KINDS, StorageKind, field_columns, field_name_problem, is_field_dtype,
    split_generation,
)


MAX_MANIFEST_BYTES = 256 * 2**20
"""A manifest is read only up to this size (a million shards' entries fit in a tenth of it)."""


@dataclass(frozen=True)
class ShardInfo:
    """One shard file: its name, how many records it holds and how to check it."""

    file: str
    num_records: int
    bytes: int  # size of the shard file on disk
    data_bytes: int  # sum of its payload sizes
    records_digest: str  # digest of its slice of the checksum column
    data_offset: int = -1  # HDF5: file offset of the contiguous payload dataset
    etag: str = ""  # packed to an object store: the ETag the store gave the uploaded shard
    num_entries: int = -1  # payloads stored: its records' files and their file fields (-1: records)

    @property
    def entries(self) -> int:
        """Payloads the shard stores (positions 0..entries-1): records plus their file fields."""
        return self.num_records if self.num_entries < 0 else self.num_entries


@dataclass(frozen=True)
class IndexFile:
    """One per-record NumPy column file and the digest of its bytes."""

    file: str
    dtype: str
    digest: str


@dataclass(frozen=True)
class Manifest:
    """Parsed ``manifest.json``; see docs/format.md for every field."""

    storage: StorageKind
    num_records: int
    total_bytes: int
    kind: str  # "images" or "files"
    classes: list[str] | None
    shards: list[ShardInfo]
    index: dict[str, IndexFile]  # column name ("label", "path.offsets", ...) → file
    fields: dict[str, str]  # extra per-record field name → dtype
    packed: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    version: int = 1  # the dataset's version: 1 when packed, one more with each append

    def to_json(self) -> str:
        body = {"format": FORMAT_NAME, **asdict(self)}
        return json.dumps(body, indent=2, sort_keys=False) + "\n"


def _require(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise ManifestError(f"{where}: {what}; the dataset is damaged, re-pack it with `fastload pack`")


MAX_INT = 2**53 - 1
"""Largest count, size or offset a manifest holds (8 PiB, 9e15 records: past any real dataset).

JSON's interoperable integer range (RFC 8259: other readers parse numbers as doubles), and far
inside int64: the index arithmetic (offset + size, sums over shards) can never wrap.
"""


def _int(value: Any, where: str, name: str, minimum: int = 0) -> int:
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
             where, f"{name} must be an integer >= {minimum}, found {value!r}")
    _require(value <= MAX_INT, where, f"{name} is {value}, over the largest count or size a manifest "
             f"holds ({MAX_INT} = 2**53 - 1)")
    return value


def _str(value: Any, where: str, name: str) -> str:
    _require(isinstance(value, str), where, f"{name} must be a string, found {value!r}")
    return value


def _safe_name(name: str, where: str) -> str:
    """Refuse names that could point outside the dataset directory."""
    parts = name.split("/")
    _require(
        bool(name) and not name.startswith("/") and "\\" not in name and "\x00" not in name
        and all(p not in ("", ".", "..") for p in parts),
        where, f"file name {name!r} points outside the dataset directory",
    )
    return name


MAX_EMPTY_CLASSES = 2**16
"""Class names a manifest may hold beyond its record count (a class folder may be empty)."""


def _in_proportion(text: str, where: str) -> None:
    """Refuse JSON out of proportion to a manifest before json.loads builds it: in one, each object
    or array is a shard's or an index column's entry (over 100 bytes) and each string a key, name,
    digest or path; a flood of ``[]`` (64 bytes of memory per 3 of text) or of one-letter strings
    would make a manifest under MAX_MANIFEST_BYTES cost gigabytes. Counted at C speed; under 1 MiB
    any JSON costs less than 100 MB."""
    if len(text) < 2**20:
        return
    containers, strings = text.count("{") + text.count("["), text.count('"') // 2
    _require(containers <= len(text) // 32 and strings <= len(text) // 6, where,
             f"{containers} JSON objects and arrays and {strings} strings in {len(text)} characters, out "
             "of all proportion to a manifest's (a shard's entry is one object of some 150 characters)")


def parse_manifest(text: str, where: str) -> Manifest:
    """Validate and parse manifest JSON; anything unexpected raises ManifestError naming ``where``."""
    _in_proportion(text, where)
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ManifestError(f"{where}: not valid JSON ({exc}); re-pack the dataset") from None
    _require(isinstance(raw, dict) and raw.get("format") == FORMAT_NAME, where,
             "not a fastload manifest (no \"format\": \"fastload\")")
    version = raw.get("format_version")
    if version != FORMAT_VERSION:
        raise ManifestError(
            f"{where}: format_version is {version!r}, this fastload reads {FORMAT_VERSION}; "
            "re-pack the source folder with `fastload pack` (or upgrade fastload)"
        )
    storage = raw.get("storage")
    _require(storage in STORAGE_KINDS, where, f"storage must be one of {STORAGE_KINDS}, found {storage!r}")
    num_records = _int(raw.get("num_records"), where, "num_records")
    total_bytes = _int(raw.get("total_bytes"), where, "total_bytes")
    kind = raw.get("kind")
    _require(kind in ("images", "files"), where, f"kind must be 'images' or 'files', found {kind!r}")
    classes = raw.get("classes")
    _require(classes is None or (isinstance(classes, list) and all(isinstance(c, str) for c in classes)),
             where, "classes must be a list of strings or null")
    _require(classes is None or len(classes) <= num_records + MAX_EMPTY_CLASSES, where,
             f"{len(classes or ())} class names for {num_records} records, more than {MAX_EMPTY_CLASSES} "
             "classes without a record")

    shards_raw = raw.get("shards")
    _require(isinstance(shards_raw, list), where, "shards must be a list")
    shards = []
    generations: set[str] = set()  # the pack's own folder of a store dataset: one for all its files
    for i, s in enumerate(shards_raw):
        at = f"{where}: shards[{i}]"
        _require(isinstance(s, dict), at, "must be an object")
        name = _safe_name(_str(s.get("file"), at, "file"), at)
        generation, base = split_generation(name)
        generations.add(generation)
        match = SHARD_NAME.match(base)
        _require(match is not None and int(match.group(1)) == i
                 and name.endswith(SHARD_SUFFIX[storage]), at,
                 f"file {name!r} is not the expected shard name for position {i}")
        shards.append(ShardInfo(
            file=name,
            num_records=_int(s.get("num_records"), at, "num_records"),
            bytes=_int(s.get("bytes"), at, "bytes"),
            data_bytes=_int(s.get("data_bytes"), at, "data_bytes"),
            records_digest=_str(s.get("records_digest"), at, "records_digest"),
            data_offset=_int(s.get("data_offset", -1), at, "data_offset", minimum=-1),
            etag=_str(s.get("etag", ""), at, "etag"),
            num_entries=_int(s.get("num_entries", -1), at, "num_entries", minimum=-1),
        ))
        _require(shards[-1].entries >= shards[-1].num_records, at, "num_entries is below num_records")
    _require(sum(s.num_records for s in shards) == num_records, where,
             "the shards' record counts do not add up to num_records")
    _require(sum(s.data_bytes for s in shards) == total_bytes, where,
             "the shards' data_bytes do not add up to total_bytes")

    fields_raw = raw.get("fields", {})
    _require(isinstance(fields_raw, dict) and all(
        isinstance(k, str) and k and is_field_dtype(v) for k, v in fields_raw.items()),
        where, f"fields must map names to one of {FIELD_DTYPES + FILE_TYPES} or an array type such as "
               "'float64[*,4]' (a newer fastload may have written it: upgrade fastload)")
    for name in fields_raw:  # names that could land on another field's columns, or on no file
        problem = field_name_problem(name, reading=True)
        _require(problem is None, where, f"field name {name!r} {problem}")

    index_raw = raw.get("index")
    _require(isinstance(index_raw, dict), where, "index must be an object")
    index = {}
    for column, entry in index_raw.items():
        at = f"{where}: index[{column!r}]"
        _require(isinstance(entry, dict), at, "must be an object")
        name = _safe_name(_str(entry.get("file"), at, "file"), at)
        generation, base = split_generation(name)
        generations.add(generation)
        _require(base.startswith(INDEX_DIR + "/") and name.endswith(".npy"), at,
                 f"file {name!r} must be an .npy file under {INDEX_DIR}/")
        index[column] = IndexFile(file=name, dtype=_str(entry.get("dtype"), at, "dtype"),
                                  digest=_str(entry.get("digest"), at, "digest"))
    needed = [name for column, dtype in COLUMNS.items()
              for name in ([f"{column}.offsets", f"{column}.blob"] if dtype == "str" else [column])]
    needed += [name for field, dtype in fields_raw.items() for name in field_columns(field, dtype)]
    _require(len(generations) <= 1, where, f"shard and index files lie in different folders ({sorted(generations)})")
    for name in needed:
        _require(name in index, where, f"index column {name!r} is missing")
    packed = raw.get("packed", {})
    _require(isinstance(packed, dict), where, "packed must be an object")
    return Manifest(storage=storage, num_records=num_records, total_bytes=total_bytes, kind=kind,
                    classes=classes, shards=shards, index=index, fields=dict(fields_raw),
                    packed=packed, format_version=version,
                    version=_int(raw.get("version", 1), where, "version", minimum=1))


def read_manifest(dataset_dir: str | os.PathLike[str]) -> Manifest:
    """Read ``DIR/manifest.json``; a directory without one is an unfinished pack, not a dataset."""
    root = Path(dataset_dir)
    path = root / MANIFEST_NAME
    if not root.exists():
        raise DatasetNotFoundError(f"{root}: no such packed dataset; create it with `fastload pack SRC -o {root}`")
    if not root.is_dir():
        raise ManifestError(f"{root}: is a file, a packed dataset is a directory holding {MANIFEST_NAME}")
    try:
        raw = read_regular(path, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        from fastload.format.folder import missing_manifest_message

        raise DatasetNotFoundError(missing_manifest_message(root)) from None
    except OSError as exc:
        raise ManifestError(f"{path}: cannot be read ({exc.strerror}); re-pack the dataset") from None
    return parse_manifest(raw.decode("utf-8", errors="replace"), str(path))


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file, fsync and rename, then fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    write_new(tmp, data)  # a link planted at either name is replaced, never written through
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    """Make renames inside ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(dataset_dir: Path, manifest: Manifest) -> None:
    """Write the manifest last and atomically: its presence is what makes a directory a dataset."""
    write_atomically(Path(dataset_dir) / MANIFEST_NAME, manifest.to_json().encode())
