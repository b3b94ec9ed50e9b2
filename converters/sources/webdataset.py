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
Each tar is walked once (converters.sources.tar_walks); tars that hold an ImageFolder tree rather
than samples are read as one (converters.sources.tar_folders).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

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
from fastload.converters.sources.tar_folders import list_tree, reads_as_tree
from fastload.converters.sources.tar_streams import compression_of
from fastload.converters.sources.tar_walks import (
    MAX_TEXT_BYTES,
    TEXT_EXTS,
    Member,
    TarObject,
    Walked,
    report_damage,
    walk_tar,
)
from fastload.converters.sources.tars import TarMembers, tar_paths

from fastload.errors import SourceError
from fastload.format.layout import IMAGE_EXTENSIONS, RESERVED_FIELD_NAMES

_IMAGE_EXTS = tuple(ext.lstrip(".") for ext in IMAGE_EXTENSIONS)
_MAX_LABEL = 2**63 - 1  # labels are stored as int64; -1 is "no label", which a .cls cannot say

Groups = list[tuple[str, dict[str, Member]]]


def list_tars(src: Path, *, on_error: str, max_file_size: int | None, extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
              layout: str = "auto", names: dict[str, str] | None = None) -> SourceListing:
    """Every sample of the tars ``src`` names, in tar and member order (see the module's docstring)."""
    root, paths = tar_paths(src)
    tars = []
    for path in paths:
        st = path.stat()
        tars.append(TarObject(path, path.name, st.st_size, st.st_mtime_ns, (st.st_ctime_ns, st.st_ino),
                              lambda path=path: open(path, "rb"), local=True,  # noqa: SIM115 - the walk closes it
                              compression=compression_of(path)))
    return list_tar_objects(src, root, tars, TarMembers(), on_error=on_error, max_file_size=max_file_size,
                            extensions=extensions, layout=layout, names=names)


def list_tar_objects(src: object, root: object, tars: list[TarObject], reader: MemberReader, *, on_error: str,
                     max_file_size: int | None, extensions: tuple[str, ...] = IMAGE_EXTENSIONS, layout: str = "auto",
                     names: dict[str, str] | None = None, walks: int = 1) -> SourceListing:
    """Every sample of ``tars`` (their headers walked ``walks`` tars at a time), read by ``reader``:
    WebDataset samples, or an ImageFolder tree (converters.sources.tar_folders)."""
    with ThreadPoolExecutor(walks, thread_name_prefix="fastload-tar-walk") as pool:
        walked = list(pool.map(walk_tar, tars))
    if reads_as_tree(src, walked, layout, extensions):
        if names:
            raise SourceError(f"{src}: --sidecar-names renames WebDataset members' fields; an ImageFolder tree in "
                              "tars packs its images alone: leave it out, or pass --layout webdataset")
        listing = list_tree(src, root, tars, walked, reader, on_error=on_error, max_file_size=max_file_size,
                            extensions=extensions)
    else:
        if extensions != IMAGE_EXTENSIONS and len(extensions) != 1:
            raise SourceError(f"{src}: --extensions names the one member that is each sample's image in WebDataset "
                              f"tars (jpg), not {len(extensions)}")
        image_ext = extensions[0].lstrip(".") if extensions != IMAGE_EXTENSIONS else None
        listing = _list_samples(src, root, tars, walked, reader, on_error=on_error, max_file_size=max_file_size,
                                image_ext=image_ext, names=names)
    if isinstance(reader, TarMembers):
        reader.close()  # reopened when the pack reads
    return listing


def _list_samples(src: object, root: object, tars: list[TarObject], walked: list[Walked], reader: MemberReader, *,
                  on_error: str, max_file_size: int | None, image_ext: str | None,
                  names: dict[str, str] | None) -> SourceListing:
    """Every WebDataset sample of the walked ``tars`` (see the module's docstring)."""
    listing = SourceListing(root=root, layout="webdataset", items=[], classes=None, images=True,  # type: ignore[arg-type]
                            reader=reader)
    groups: list[tuple[TarObject, str, dict[str, Member]]] = []
    seen: dict[str, TarObject] = {}
    for tar, walk in zip(tars, walked):
        listing.ignored.update(walk.ignored)
        found, lost = _groups(tar, walk)
        for key, members in found:
            if key in seen:
                where = "earlier in this tar" if seen[key] == tar else f"in {seen[key].name}"
                raise SourceError(f"{tar.path}: key {key!r} appears again ({where}): WebDataset keys name one "
                                  "sample each; give each sample its own key")
            seen[key] = tar
            groups.append((tar, key, members))
        report_damage(listing, tar, walk.damage, on_error, lost)  # what came before the damage is kept
    if not groups:
        raise SourceError(f"{src}: no samples in {len(tars)} tar file(s) (members named <key>.<ext>)" +
                          (f" (first skipped: {listing.skipped[0].rel}: {listing.skipped[0].reason})"
                           if listing.skipped else ""))
    image = image_ext or next((e for e in _IMAGE_EXTS if e in groups[0][2]), None)
    if image is None:
        raise SourceError(f"{groups[0][0].path}: sample {groups[0][1]!r} has no image member "
                          f"({', '.join(sorted(groups[0][2]))}); name its extension with --image-ext")
    rename = {ext.lstrip(".").lower(): name for ext, name in (names or {}).items()}
    check_field_names(root, rename.values(), "a name given by --sidecar-names")
    exts = sorted({ext for _, _, members in groups for ext in members} - {image})
    payloads = [e for e in exts if e not in TEXT_EXTS]
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
    return listing


def _groups(tar: TarObject, walk: Walked) -> tuple[Groups, str]:
    """``(key, {ext: member})`` for each run of members sharing a key, in the tar's order; a walk
    that damage ended loses its last run (its members may go on past the damage), said in the
    words returned."""
    groups: Groups = []
    for member in walk.members:
        if groups and groups[-1][0] == member.key:
            if member.ext in groups[-1][1]:
                raise SourceError(f"{tar.path}: sample {member.key!r} has two .{member.ext} members; one sample has "
                                  "one of each")
            groups[-1][1][member.ext] = member
        else:
            groups.append((member.key, {member.ext: member}))
    if walk.damage is None or not groups:
        return groups, ""
    key, members = groups.pop()
    return groups, (f"; sample {escaped(key)!r} before it ({', '.join(escaped(m.name) for m in members.values())}) "
                    "is left out too, as its members may go on past the damage")


def _sample(tar: TarObject, key: str, members: dict[str, Member], image: str, exts: list[str],
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


def _text(member: Member) -> str:
    if member.text is None:
        raise SourceError(f"its member {member.name} holds {member.size} bytes, over {MAX_TEXT_BYTES}")
    try:
        return member.text.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        raise SourceError(f"its member {member.name} is not UTF-8 text") from None


def _json(member: Member) -> dict[str, Any]:
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
