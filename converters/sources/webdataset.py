"""WebDataset tar shards as a source: each key's members are one sample, read in place from the tars.

Members are grouped as WebDataset groups them: a member's key is its path up to the first dot of
its file name (``a/0001.seg.png``: key ``a/0001``, extension ``seg.png``, lower-cased), and the
consecutive members of one key are one sample. The sample's image is its member of the image
extension (``image_ext``; by default the first of jpg, jpeg, png, webp, ... that the first sample
has); ``cls`` is its label (a whole number), ``txt`` the text field ``txt``, ``json`` an object
whose keys become typed fields (as a JSONL list's columns), and every other member a file field
named by its extension (``png``: a mask, ``npy``: an array; ``names`` renames them, as
``--sidecar-names`` does). Members are read in place (offsets from the tar's headers), never
extracted. A source is a ``.tar`` file, a brace list (``data-{000000..000099}.tar``) or a folder of
``.tar`` files, on disk or in an object store (converters.sources.store_files); on disk, a tar may
be compressed (``.tar.gz``, ``.tar.xz``, ``.tar.zst``: streamed, converters.sources.tar_streams).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

from fastload.converters.sources.file_fields import field_type
from fastload.converters.sources.file_lists import typed_field
from fastload.converters.sources.items import (
    MemberReader,
    Skip,
    SourceFile,
    SourceItem,
    SourceListing,
    check_field_names,
    escaped,
)
from fastload.converters.sources.json_text import BadJson, parse_json
from fastload.converters.sources.tar_headers import (
    FOLDER_KIND,
    REGULAR_KINDS,
    NotATar,
    TarDamaged,
    TarWalk,
    walk_file,
    walk_stream,
)
from fastload.converters.sources.tar_streams import StreamWalk, compression_of, open_decompressed
from fastload.converters.sources.tars import TarMembers, tar_paths

from fastload.errors import SourceError
from fastload.format.layout import IMAGE_EXTENSIONS, RESERVED_FIELD_NAMES

_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # WebDataset's own rule (webdataset.tariterators)
_IMAGE_EXTS = tuple(ext.lstrip(".") for ext in IMAGE_EXTENSIONS)
_TEXT_EXTS = ("cls", "txt", "json")  # read at listing time into the index; the rest are payloads
_MAX_TEXT_BYTES = 16 * 2**20
_MAX_LABEL = 2**63 - 1  # labels are stored as int64; -1 is "no label", which a .cls cannot say


class _DamagedTar(Exception):
    def __init__(self, rel: str, reason: str) -> None:
        super().__init__(reason)
        self.rel, self.reason = rel, reason


@dataclass(frozen=True)
class TarObject:
    """One tar: where it is (a path, or an object's URL: what its items name), its name, size and
    version (mtime, or the store's ETag), what a rewrite cannot keep, and how to open it."""

    path: Path
    name: str
    size: int
    mtime_ns: int
    stamp: tuple[int, int]
    open: Callable[[], IO[bytes]]
    local: bool = False  # a file on this machine: its headers are read with pread (tar_headers.walk_file)
    compression: str | None = None  # a compressed tar's ("gzip", "zstd", ...): walked as a stream


class _Member(NamedTuple):
    name: str
    offset: int
    size: int
    text: bytes | None  # a text member's bytes (within _MAX_TEXT_BYTES), read with the headers


Groups = list[tuple[str, dict[str, _Member]]]


def list_tars(src: Path, *, on_error: str, max_file_size: int | None, image_ext: str | None = None,
              names: dict[str, str] | None = None) -> SourceListing:
    """Every sample of the tars ``src`` names, in tar and member order (see the module's docstring)."""
    root, paths = tar_paths(src)
    tars = []
    for path in paths:
        st = path.stat()
        tars.append(TarObject(path, path.name, st.st_size, st.st_mtime_ns, (st.st_ctime_ns, st.st_ino),
                              lambda path=path: open(path, "rb"), local=True,  # noqa: SIM115 - the walk closes it
                              compression=compression_of(path)))
    return list_tar_objects(src, root, tars, TarMembers(), on_error=on_error, max_file_size=max_file_size,
                            image_ext=image_ext, names=names)


def list_tar_objects(src: object, root: object, tars: list[TarObject], reader: MemberReader, *, on_error: str,
                     max_file_size: int | None, image_ext: str | None = None, names: dict[str, str] | None = None,
                     walks: int = 1) -> SourceListing:
    """Every sample of ``tars`` (their headers walked ``walks`` tars at a time), read by ``reader``."""
    listing = SourceListing(root=root, layout="webdataset", items=[], classes=None, images=True,  # type: ignore[arg-type]
                            reader=reader)
    groups: list[tuple[TarObject, str, dict[str, _Member]]] = []
    seen: dict[str, TarObject] = {}
    with ThreadPoolExecutor(walks, thread_name_prefix="fastload-tar-walk") as pool:
        for tar, (found, ignored, damage) in zip(tars, pool.map(_walk, tars)):
            listing.ignored.update(ignored)
            for key, members in found:
                if key in seen:
                    where = "earlier in this tar" if seen[key] == tar else f"in {seen[key].name}"
                    raise SourceError(f"{tar.path}: key {key!r} appears again ({where}): WebDataset keys name one "
                                      "sample each; give each sample its own key")
                seen[key] = tar
                groups.append((tar, key, members))
            if damage is not None:  # what came before the damage is kept; the rest cannot be read
                if on_error != "skip":
                    raise SourceError(f"{tar.path}: {damage.reason}; re-copy or re-write the tar, or pass "
                                      "--on-error skip") from None
                listing.skipped.append(Skip(damage.rel, damage.reason))
    if not groups:
        raise SourceError(f"{src}: no samples in {len(tars)} tar file(s) (members named <key>.<ext>)")
    image = image_ext or next((e for e in _IMAGE_EXTS if e in groups[0][2]), None)
    if image is None:
        raise SourceError(f"{groups[0][0].path}: sample {groups[0][1]!r} has no image member "
                          f"({', '.join(sorted(groups[0][2]))}); name its extension with --image-ext")
    rename = {ext.lstrip(".").lower(): name for ext, name in (names or {}).items()}
    check_field_names(root, rename.values(), "a name given by --sidecar-names")
    exts = sorted({ext for _, _, members in groups for ext in members} - {image})
    payloads = [e for e in exts if e not in _TEXT_EXTS]
    field_names = {ext: rename.get(ext, ext) for ext in exts if ext not in ("cls", "json")}
    taken = (*RESERVED_FIELD_NAMES, *field_names.values())
    rows: list[tuple[str, dict[str, Any]]] = []
    for tar, key, members in groups:
        try:
            item, row = _sample(tar, key, members, image, exts, payloads, field_names, taken, max_file_size)
        except SourceError as exc:
            if on_error != "skip":
                raise SourceError(f"{tar.path}: sample {key!r}: {exc}; fix the tar, or pass --on-error skip") from None
            listing.skipped.append(Skip(escaped(f"{tar.name}/{key}.{image}"), str(exc)))
            continue
        listing.items.append(item)
        rows.append((item.rel, row))
    if not listing.items:
        raise SourceError(f"{src}: every sample was skipped (first: {listing.skipped[0].rel}: "
                          f"{listing.skipped[0].reason})")
    for name in sorted({key for _, row in rows for key in row}):
        listing.fields[name], listing.field_values[name] = typed_field(root, rows, name)
    for column, ext in enumerate(payloads):
        listing.file_fields[field_names[ext]] = _first_type(listing, column, field_names[ext])
    if isinstance(reader, TarMembers):
        reader.close()  # reopened when the pack reads
    return listing


def _walk(tar: TarObject) -> tuple[Groups, Counter[str], _DamagedTar | None]:
    """``(key, {ext: member})`` for each run of members sharing a key, in the tar's order; the members
    left out, by why; the damage that ended the walk (the groups before it are kept)."""
    groups: Groups = []
    ignored: Counter[str] = Counter()
    key_now: str | None = None  # the key being grouped, and its members
    members: dict[str, _Member] = {}
    try:
        with _walk_of(tar) as walk:
            for name, offset, size, kind in walk:
                if kind not in REGULAR_KINDS:
                    if kind != FOLDER_KIND:
                        ignored["(link or device in a tar)"] += 1
                    continue
                found = _KEY.match(name)
                if found is None:
                    ignored["(tar member without an extension)"] += 1
                    continue
                key, ext = found.groups()
                ext = ext.lower()
                if key != key_now:
                    if key_now is not None:
                        groups.append((key_now, members))
                    key_now, members = key, {}
                if ext in members:
                    raise SourceError(f"{tar.path}: sample {key!r} has two .{ext} members; one sample has one of each")
                # a text member is read with the headers, from the bytes read with its header
                text = walk.read(offset, size) if ext in _TEXT_EXTS and size <= _MAX_TEXT_BYTES else None
                members[ext] = _Member(name, offset, size, text)
    except NotATar as exc:
        raise SourceError(f"{tar.path}: not a tar file ({exc}); a WebDataset shard is a tar, plain or "
                          "compressed with gzip, xz, bzip2 or zstd") from None
    except TarDamaged as exc:  # the sample being grouped when the damage came is part of what is lost
        where = f"{tar.name}/{exc.name}" if exc.name else f"{tar.name}@{exc.offset}"
        return groups, ignored, _DamagedTar(where, f"{exc.reason}; nothing after it can be read")
    if key_now is not None:
        groups.append((key_now, members))
    return groups, ignored, None


@contextmanager
def _walk_of(tar: TarObject) -> Iterator[TarWalk | StreamWalk]:
    if tar.compression is not None:
        with open_decompressed(tar.path, tar.compression) as stream:
            yield StreamWalk(stream, tar.name)  # type: ignore[misc]
    elif tar.local:
        with walk_file(tar.path) as walk:
            yield walk
    else:
        with tar.open() as f:
            yield walk_stream(f, tar.size)


def _sample(tar: TarObject, key: str, members: dict[str, _Member], image: str, exts: list[str],
            payloads: list[str], field_names: dict[str, str], taken: tuple[str, ...],
            max_file_size: int | None) -> tuple[SourceItem, dict[str, Any]]:
    """One group as an item (its image and file fields located in the tar, its label), its text fields."""
    if len(members) != len(exts) + 1:  # its members are among these: one is missing
        missing = [f".{e}" for e in (image, *exts) if e not in members]
        raise SourceError(f"no {', '.join(missing)} member, though other samples have one")
    undecodable = [m.name for m in members.values() if escaped(m.name) != m.name]
    if undecodable:  # a name is stored as UTF-8 text in the index
        raise SourceError(f"member name {escaped(undecodable[0])} is not valid UTF-8; rename it")
    main = members[image]
    if max_file_size is not None:
        for member in (main, *(members[e] for e in payloads)):
            if member.size > max_file_size:
                raise SourceError(f"member {member.name} holds {member.size} bytes, over the {max_file_size} "
                                  "limit (--max-file-size)")
    row: dict[str, Any] = {}
    label = -1
    if "cls" in members:
        text = _text(members["cls"])
        try:
            label = int(text)  # around it, white space as str.strip takes it
        except ValueError:  # not digits, or more digits than int() parses
            raise SourceError(f"its .cls member holds {text.strip()[:40]!r}, not a whole-number class id") from None
        if not 0 <= label <= _MAX_LABEL:
            raise SourceError(f"its .cls member holds {text.strip()[:40]!r}, out of the range a label is stored "
                              f"in (0..2**63-1); give class ids from 0")
    if "txt" in members:
        row[field_names["txt"]] = _text(members["txt"])
    if "json" in members:
        value = _json(members["json"])
        clash = [k for k in value if k in taken]
        if clash:
            raise SourceError(f"its .json key {clash[0]!r} is taken (a sample already has {', '.join(taken)})")
        check_field_names(f"{tar.path}: {key}.json", value, "a key of this member")
        row.update(value)
    files = tuple(SourceFile(tar.path, f"{tar.name}/{members[e].name}", members[e].size, tar.mtime_ns, tar.stamp,
                             offset=members[e].offset) for e in payloads) if payloads else ()
    item = SourceItem(tar.path, f"{tar.name}/{main.name}", label, main.size, tar.mtime_ns, files, tar.stamp,
                      offset=main.offset)
    return item, row


def _text(member: _Member) -> str:
    if member.text is None:
        raise SourceError(f"its member {member.name} holds {member.size} bytes, over {_MAX_TEXT_BYTES}")
    try:
        return member.text.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise SourceError(f"its member {member.name} is not UTF-8 text") from None


def _json(member: _Member) -> dict[str, Any]:
    try:
        value = parse_json(_text(member))
    except BadJson as exc:
        raise SourceError(f"its member {member.name} is {exc}") from None
    if not isinstance(value, dict):
        raise SourceError(f"its member {member.name} must hold a JSON object (its keys become fields), "
                          f"not {type(value).__name__}")
    return value


def _first_type(listing: SourceListing, column: int, name: str) -> str:
    """A file field's type from its first readable member (as a folder's sidecars take it)."""
    reader = listing.reader
    for item in listing.items:
        file = item.files[column]
        found = field_type(reader.read(file.path, file.offset, min(file.size, 2**20)), file.rel)
        if found is not None:
            return found
    raise SourceError(f"{listing.root}: no member of field {name!r} can be read")
