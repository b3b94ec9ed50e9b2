"""The on-disk contract, written down once: version, file names, record fields and their dtypes."""

from __future__ import annotations

import math
import re
from typing import Literal

import xxhash

FORMAT_NAME = "fastload"
FORMAT_VERSION = 1

MANIFEST_NAME = "manifest.json"
INDEX_DIR = "index"
SKIPPED_REPORT_NAME = "skipped.jsonl"
PACK_STATE_DIR = ".pack"
PACK_LOCK_NAME = ".pack.lock"
UPLOAD_JOURNAL_NAME = ".pack.uploads"  # a pack to an object store: the shards uploaded so far
STAGING_MARKER_NAME = ".pack.staging"  # a pack to an object store: its staging folder's owner (the URL)
PACK_OWNER_NAME = "owner.json"  # in PACK_STATE_DIR: written first, the proof that fastload made the folder
# A pack to an object store: the lease object that keeps a second pack out (created only where
# absent, renewed while the pack runs), and the folder each pack's shards and index go in, so that
# a replacement never writes over an object the published manifest lists.
STORE_LEASE_NAME = ".fastload-pack.lease"
GENERATION_DIR = re.compile(r"^gen-[0-9a-f]{16}$")
# An append (``pack --append``) makes a new version of a dataset: its index goes in a folder of its
# own, ``index/v00002/``, never over an earlier version's files, and each earlier version's
# manifest is kept in VERSIONS_DIR (``versions/v00001.json``), so a reader opened before an append
# (and its workers) keep reading the version it opened. Version 1's index is ``index/*.npy``.
VERSIONS_DIR = "versions"

# Files packed as images (decoded by the image pipeline); other files are packed as bytes.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

StorageKind = Literal["lmdb", "hdf5"]
STORAGE_KINDS: tuple[StorageKind, ...] = ("lmdb", "hdf5")
SHARD_SUFFIX: dict[str, str] = {"lmdb": ".lmdb", "hdf5": ".h5"}
SHARD_NAME = re.compile(r"^shard-(\d{5,})\.(lmdb|h5)$")

# HDF5 shards: one contiguous uint8 dataset of all payloads back to back, plus their offsets.
HDF5_DATA = "data"
HDF5_OFFSETS = "offsets"

# Per-record index columns every dataset has, with their NumPy dtypes. Strings are stored as
# ``<name>.offsets.npy`` (int64, N+1) plus ``<name>.blob.npy`` (uint8 UTF-8), never as objects.
COLUMNS: dict[str, str] = {
    "label": "int64",  # -1 when the source has no labels
    "shard": "int32",  # which shard holds the record
    "position": "int64",  # position inside that shard (the LMDB key, the HDF5 offsets row)
    "offset": "int64",  # byte offset of the payload in its shard's data (HDF5: in the dataset)
    "size": "int64",  # payload bytes
    "checksum": "uint64",  # xxh3_64 of the payload
    "width": "int32",  # image width from the header, -1 when not an image
    "height": "int32",
    "path": "str",  # source path relative to SRC (POSIX separators)
}
FIELD_PREFIX = "field."  # extra per-record fields from a CSV/JSONL list: ``field.<name>``
FIELD_DTYPES = ("int64", "float64", "bool", "str")
# File fields: a second (third, ...) file per record (a mask, a depth map, a .npy), stored in the
# record's shard right after its file, and located by columns of their own, ``field.<name>.<column>``.
# "image": decoded like the record's image (RGB); "mask": a one-channel image (class ids, depth)
# whose values are kept (nearest-neighbour through crops); "mask-rows": a mask stored as its values'
# rows, so that a crop decodes only its own (fastload.format.mask_rows: what a pack makes of a mask
# unless told to keep its file); "npy": a NumPy array; "file": bytes.
FILE_TYPES = ("image", "mask", "mask-rows", "npy", "file")
MASK_STORAGES = ("rows", "file")  # how a pack stores a mask: "mask-rows", or its file as given ("mask")


def stored_file_types(types: dict[str, str], mask_storage: str) -> dict[str, str]:
    """File fields' types as a pack stores them: a one-channel "mask" as its values' rows
    ("mask-rows") unless ``mask_storage`` is "file"."""
    return dict(types) if mask_storage == "file" else {n: "mask-rows" if t == "mask" else t for n, t in types.items()}

MASK_MODES = ("1", "L", "P", "I", "F", "I;16", "I;16L", "I;16B", "I;16N")  # Pillow's one-channel modes
FILE_COLUMNS: dict[str, str] = {
    "position": "int64", "offset": "int64", "size": "int64", "checksum": "uint64",
    "width": "int32", "height": "int32",  # the image's (or the array's first two dims), else -1
}
# Array fields (boxes, multi-labels, embeddings): ``<element>[<first>,<rest>...]``, the first
# dimension ``*`` when it varies by record ("float64[*,4]": N boxes of 4). Stored as
# ``field.<name>.offsets`` (int64, N+1: rows of the first dimension) and ``field.<name>.values``
# (the element dtype, flattened), never as objects.
ARRAY_ELEMENTS = ("int64", "float64", "bool")
_ARRAY_TYPE = re.compile(r"^(int64|float64|bool)\[(\*|\d+)((?:,\d+)*)\]$")


def array_type(dtype: str) -> tuple[str, int | None, tuple[int, ...]] | None:
    """``(element, first dimension or None when it varies, other dimensions)`` of an array
    field's type string, or None for a scalar type or anything else."""
    found = _ARRAY_TYPE.match(dtype)
    if found is None:
        return None
    element, first, rest = found.groups()
    return element, None if first == "*" else int(first), tuple(int(d) for d in rest.split(",")[1:])


def float64_problem(number: float, given: object = None) -> str | None:
    """Why a float64 field cannot keep ``number`` as it was given (``given``: as written, a CSV
    cell's text say), or None: a NaN, an infinity or a number past float64's range, or a whole
    number float64 would round. A clause that follows ``field 'x' is ``; every way in (file lists,
    sidecars, the Writer) refuses with it, so no number is stored other than as given."""
    shown = number if given is None else given
    if isinstance(number, int) and not isinstance(number, bool):
        try:
            as_float = float(number)
        except OverflowError:
            as_float = math.inf
        if math.isfinite(as_float) and int(as_float) != number:
            return (f"{number}, which float64 (the field's type) cannot hold exactly (it would be "
                    f"{int(as_float)}); make every value of the field a whole number, or store it as text")
    else:
        as_float = float(number)
    if not math.isfinite(as_float):
        return (f"{shown!r}, not a finite number (NaN, infinities and numbers past float64's 1.8e308 are "
                "refused); fix the value")
    return None


def is_field_dtype(dtype: object) -> bool:
    return isinstance(dtype, str) and (dtype in FIELD_DTYPES or dtype in FILE_TYPES
                                       or array_type(dtype) is not None)


# Every column a field derives ends in one of these dot-free parts. A field name may not end in
# ``.<part>``, so ``field.A`` can never equal ``field.B.p``, nor ``field.A.p`` equal ``field.B.q``
# for A != B (the last dot-segment is the part): no name can land on another field's column.
DERIVED_PARTS = ("offsets", "blob", "values", *FILE_COLUMNS)
# What a record or a sample has already, under these names: the index's own columns (COLUMNS),
# ``PackedDataset.record(i)``'s ``data``, a decoded sample's ``image`` and ``index``. A field of one
# of these names would shadow it (``record(i)["data"]`` the field, not the image), so every way in
# (file lists, sidecars, tars, tables, the Writer, a packed torch Dataset) refuses it.
RESERVED_FIELD_NAMES = (*COLUMNS, "data", "image", "index")
# The names a dataset written before that rule may hold: a manifest is refused only for these
# (a field named ``width`` in an older dataset still opens; it shadows ``record(i)["width"]``).
_READ_RESERVED_NAMES = ("path", "label", "image")
# ``index/field.<name>.<part>.npy.tmp`` (written, then renamed) must fit a 255-byte file name.
MAX_FIELD_NAME_BYTES = 255 - len(f"{FIELD_PREFIX}.{max(DERIVED_PARTS, key=len)}.npy.tmp")


def field_name_problem(name: object, *, reading: bool = False) -> str | None:
    """Why ``name`` cannot be a field's name, or None when it can: a clause that follows
    ``field name 'x.values' `` and says what to do. ``reading``: a finished dataset's field, refused
    only when it lands on another column or on no file (see _READ_RESERVED_NAMES)."""
    if not isinstance(name, str) or not name:
        return "is empty: give the field a name"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not valid UTF-8 text: rename it"
    if size > MAX_FIELD_NAME_BYTES:
        return f"is {size} bytes long, over the {MAX_FIELD_NAME_BYTES} a field name may have: shorten it"
    if any(bad in name for bad in ("/", "\\", "\x00", "..")):
        return "holds '/', '\\', '..' or a NUL byte, which a field's file name cannot: rename it"
    if name in (_READ_RESERVED_NAMES if reading else RESERVED_FIELD_NAMES):
        return (f"is taken (a record has {', '.join(RESERVED_FIELD_NAMES)} already, and the field would "
                "hide it): rename it")
    part = name.rsplit(".", 1)[-1]
    if "." in name and part in DERIVED_PARTS:
        return (f"ends in '.{part}', which the index's own columns end in (a field's columns are "
                f"field.<name>.{{{','.join(DERIVED_PARTS)}}}): rename it")
    return None


def field_columns(name: str, dtype: str) -> list[str]:
    """The index columns a field is stored in."""
    column = FIELD_PREFIX + name
    if dtype in FILE_TYPES:
        return [f"{column}.{part}" for part in FILE_COLUMNS]
    if dtype == "str":
        return [f"{column}.offsets", f"{column}.blob"]
    if array_type(dtype) is not None:
        return [f"{column}.offsets", f"{column}.values"]
    return [column]

NO_LABEL = -1


def split_generation(name: str) -> tuple[str, str]:
    """``("gen-0123456789abcdef/", "shard-00000.lmdb")`` for a name in a pack's own folder of a store
    dataset, ``("", name)`` for a name at the dataset's top."""
    head, sep, rest = name.partition("/")
    return (head + "/", rest) if sep and GENERATION_DIR.match(head) else ("", name)


def version_dir(version: int) -> str:
    """``v00002``: the folder (under INDEX_DIR) of version ``version``'s index, from version 2 on."""
    return f"v{version:05d}"


def version_manifest_name(version: int) -> str:
    """``versions/v00001.json``: where an earlier version's manifest is kept once a newer one is published."""
    return f"{VERSIONS_DIR}/{version_dir(version)}.json"


def shard_name(storage: StorageKind, number: int) -> str:
    """File name of shard ``number``: ``shard-00007.lmdb`` or ``shard-00007.h5``."""
    return f"shard-{number:05d}{SHARD_SUFFIX[storage]}"


def lmdb_key(position: int) -> bytes:
    """LMDB key of the record at ``position`` in its shard: big-endian, so keys sort in order."""
    return position.to_bytes(8, "big")


def record_checksum(payload: bytes | memoryview) -> int:
    """The per-record checksum stored in the index (xxh3, 64 bits)."""
    return xxhash.xxh3_64_intdigest(payload)


def file_digest(data: bytes | memoryview) -> str:
    """Hex digest kept in the manifest for index files and per-shard checksum lists."""
    return xxhash.xxh3_128_hexdigest(data)
