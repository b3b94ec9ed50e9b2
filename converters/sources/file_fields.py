"""A record's other files (a mask, a depth map, a .npy beside its image): found, typed, checked.

A CSV/JSONL list names them in columns (``--file-columns mask,depth``); a folder packed with
``--sidecars`` groups files that share a basename (``0001.jpg`` + ``0001.png`` + ``0001.npy``). Each
becomes a file field, stored in the record's shard right after its image (see
fastload.format.layout). Its type comes from the first record's file, and every other file of the
field must match it: an image, a one-channel "mask" (class ids, 16-bit depth: kept exactly,
nearest-neighbour through crops), a NumPy array, or other bytes. A mask or image must be the size
of its record's image; a file that breaks a rule is an error naming the record, or under
``--on-error skip`` the record is skipped and reported. A mask is stored as its values' rows (type
"mask-rows", converters.packing.mask_rows) unless the pack keeps mask files as given.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from fastload.converters.packing.checks import InvalidFile, check_image
from fastload.converters.packing.mask_rows import rows_from_file
from fastload.converters.sources.confine import ListRoot
from fastload.converters.sources.items import Skip, SourceFile, SourceListing
from fastload.decode.files import npy_layout
from fastload.errors import SourceError
from fastload.format.files import open_regular
from fastload.format.layout import IMAGE_EXTENSIONS, MASK_MODES, record_checksum

_JPEG = (".jpg", ".jpeg")


@dataclass(frozen=True)
class FileFacts:
    """What one file field's file is: its width and height (-1 when it has none)."""

    width: int = -1
    height: int = -1


def field_type(data: bytes, rel: str) -> str | None:
    """The type a file field takes from its first file: "npy", "image", "mask" or "file"; None
    when the file is an image Pillow cannot read (it says nothing of the field's type)."""
    suffix = os.path.splitext(rel)[1].lower()
    if suffix == ".npy":
        return "npy"
    if suffix not in IMAGE_EXTENSIONS:
        return "file"
    if suffix in _JPEG:  # lossy: never a mask, whatever its channels
        return "image"
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            return "mask" if img.mode in MASK_MODES else "image"
    except Exception:  # noqa: BLE001 - Pillow raises many kinds; the file is checked for real later
        return None


def check_record_files(types: dict[str, str], files: Sequence[SourceFile], contents: Sequence[bytes | OSError],
                       width: int, height: int, max_pixels: int,
                       decode: bool = False) -> list[tuple[bytes, int, FileFacts]]:
    """Check a record's file fields' ``contents`` (its image ``width`` x ``height``; ``decode``:
    images decoded whole, as ``--check decode`` does the record's): each one's bytes, checksum
    and facts; InvalidFile naming the field and file for the first bad one."""
    out = []
    for (name, kind), file, data in zip(types.items(), files, contents):
        try:
            if isinstance(data, OSError):
                raise InvalidFile(f"unreadable file ({data.strerror or data})")
            facts = check_file(data, file.rel, kind, width, height, max_pixels, decode)
            if kind == "mask-rows":
                data = rows_from_file(data, max_pixels)
            out.append((data, record_checksum(data), facts))
        except InvalidFile as exc:
            raise InvalidFile(f"its {name} file {file.rel}: {exc.reason}") from None
    return out


def check_file(data: bytes, rel: str, kind: str, width: int, height: int, max_pixels: int,
               decode: bool = False) -> FileFacts:
    """Check one file of a field of type ``kind`` beside an image of ``width`` x ``height`` (-1:
    the record is not an image); raise InvalidFile saying what is wrong."""
    if kind == "file":
        return FileFacts()
    if kind == "npy":
        shape = _npy_shape(data)
        spatial = width > 0 and len(shape) >= 2 and (shape[0], shape[1]) == (height, width)
        return FileFacts(width, height) if spatial else FileFacts()
    header = check_image(data, decode=decode, max_pixels=max_pixels)
    if width > 0 and (header.width, header.height) != (width, height):
        raise InvalidFile(f"{header.width}x{header.height}, its image is {width}x{height}: a field that "
                          "follows the image's crop must be its size")
    found = field_type(data, rel) or "image"
    if found != kind.removesuffix("-rows"):
        raise InvalidFile(f"is {'a one-channel' if found == 'mask' else 'a colour'} image, the field's first "
                          f"file is {'a colour image' if kind == 'image' else 'a one-channel mask'}")
    return FileFacts(header.width, header.height)


def _npy_shape(data: bytes) -> tuple[int, ...]:
    try:
        return npy_layout(data)[0]  # the header's shape, checked against the bytes present
    except ValueError as exc:
        raise InvalidFile(str(exc)) from None


def attach_file_columns(listing: SourceListing, columns: tuple[str, ...], max_file_size: int | None,
                        on_error: str = "raise") -> None:
    """Turn the list's columns ``columns`` (paths, relative to the list's folder, confined as its
    ``path`` column is: ``listing.list_root``) into file fields of each item; their types come
    from the first row's file. A row without one, or with one outside the root, is an error
    naming its file, or under ``on_error="skip"`` skipped and reported."""
    confine = listing.list_root
    assert confine is not None, "file columns are a file list's"
    for name in columns:
        if name not in listing.fields:
            raise SourceError(f"{listing.root}: --file-columns names {name!r}, but the list has no such column "
                              f"(its columns: path, label, {', '.join(listing.fields) or 'none else'})")
        if listing.fields[name] != "str":
            raise SourceError(f"{listing.root}: column {name!r} holds {listing.fields[name]} values, not paths; "
                              "--file-columns names columns of file paths")
    keep, located = [], []  # the rows kept, and the files each names (one per column)
    for k, item in enumerate(listing.items):
        paths: list[Path] = []
        reason = None
        for name in columns:
            path, reason = _column_file(confine, name, listing.field_values[name][k])
            if reason is not None:
                break
            paths.append(path)  # type: ignore[arg-type]
        if reason is None:
            keep.append(k)
            located.append(paths)
        elif on_error != "skip":
            raise SourceError(f"{item.path}: {reason}; fix its row, or pass --on-error skip")
        else:
            listing.skipped.append(Skip(item.rel, reason))
    if len(keep) < len(listing.items):
        listing.items = [listing.items[k] for k in keep]
        listing.field_values = {name: [v[k] for k in keep] for name, v in listing.field_values.items()}
    for column, name in enumerate(columns):
        values = listing.field_values.pop(name)
        del listing.fields[name]
        for k, (item, raw) in enumerate(zip(listing.items, values)):
            rel = Path(os.path.normpath(raw)).as_posix()
            file = source_file(located[k][column], rel, max_file_size)
            listing.items[k] = replace(item, files=(*item.files, file))
        listing.file_fields[name] = first_type(listing, len(listing.file_fields), name)


def _column_file(confine: ListRoot, name: str, raw: str) -> tuple[Path | None, str | None]:
    """The file a row's column ``name`` names (``raw``), or why it cannot be packed."""
    if not raw:
        return None, f"its row has no {name!r} file; every row needs one"
    path, outside = confine.locate(raw)
    return (path, None) if outside is None else (None, f"its {name!r} file {raw!r} {outside}")


def source_file(path: Path, rel: str, max_file_size: int | None) -> SourceFile:
    try:
        st = path.stat()
    except OSError:
        return SourceFile(path, rel, -1, -1)  # reported as unreadable when read, naming its record
    if max_file_size is not None and st.st_size > max_file_size:
        return SourceFile(path, rel, -1, -1)
    return SourceFile(path, rel, st.st_size, st.st_mtime_ns, (st.st_ctime_ns, st.st_ino))


def first_type(listing: SourceListing, column: int, name: str) -> str:
    """The type of file field ``name`` (``column``-th of each item): from its first readable file
    (a damaged one is passed over: the pack reports it under its record)."""
    for item in listing.items:
        file = item.files[column]
        try:
            found = field_type(_head(file.path, 2**20), file.rel)
        except OSError:
            continue
        if found is not None:
            return found
    raise SourceError(f"{listing.root}: no file of field {name!r} can be read (first: "
                      f"{listing.items[0].files[column].path if listing.items else '?'})")


def _head(path: Path, size: int) -> bytes:
    """The first ``size`` bytes of a regular file (enough for any header)."""
    fd = open_regular(path)
    try:
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)
