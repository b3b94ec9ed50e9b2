"""Files beside each image that share its basename, as its fields (``fastload pack --sidecars``).

As in WebDataset, ``0001.jpg`` with ``0001.json``, ``0001.txt``, ``0001.png`` and ``0001.npy`` beside
it is one sample: the JSON object's keys become fields (numbers, text, lists as typed arrays: see
converters.sources.file_lists.typed_field), the text file is the field ``txt``, and another image or
a ``.npy`` of the basename a file field named by its extension (``png``: a mask, say; see
converters.sources.file_fields). ``names`` renames those by extension (``{"png": "mask"}``:
``--sidecar-names png=mask``), so a sample's fields can say what they hold. When a basename has
several images, the JPEG is the sample's image.
Once one image has a sidecar of a kind, every image must: a missing one is an error naming the
image, or with ``--on-error skip`` the image is skipped and reported. The sidecars are counted as
fields, not as ignored files.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from fastload.converters.sources.file_lists import typed_field
from fastload.converters.sources.items import Skip, SourceItem, SourceListing, check_field_names
from fastload.converters.sources.json_text import BadJson, parse_json

from fastload.errors import SourceError
from fastload.format.files import read_regular
from fastload.format.layout import RESERVED_FIELD_NAMES

SIDECAR_KINDS = (".json", ".txt")
FILE_SIDECARS = (".npy",)  # files beside an image that are file fields, besides other images
_JPEG = (".jpg", ".jpeg")
MAX_SIDECAR_BYTES = 16 * 2**20


def attach_sidecars(listing: SourceListing, on_error: str, names: dict[str, str] | None = None) -> None:
    """Read each item's sidecars into ``listing.fields`` / ``field_values`` and its other files of
    its basename into file fields, named by extension unless ``names`` renames one; drop (under
    ``on_error="skip"``) or refuse items whose sidecars are missing or unreadable."""
    rename = {ext.lstrip(".").lower(): name for ext, name in (names or {}).items()}
    check_field_names(listing.root, rename.values(), "a name given by --sidecar-names")
    files = _attach_file_sidecars(listing, on_error, rename)
    found = {kind: [_beside(Path(item.path), kind) for item in listing.items] for kind in SIDECAR_KINDS}
    kinds = [kind for kind in SIDECAR_KINDS if any(p is not None for p in found[kind])]
    txt = rename.pop("txt", "txt") if ".txt" in kinds else "txt"
    if rename:
        raise SourceError(f"{listing.root}: --sidecar-names renames {', '.join(sorted(rename))}, but no image "
                          "has such a file beside it; name the extension of a sidecar (0001.png: png=mask)")
    named = [*files, *([txt] if ".txt" in kinds else [])]
    if len(set(named)) < len(named):
        raise SourceError(f"{listing.root}: --sidecar-names gives two kinds of sidecar one name (their fields "
                          f"would be {', '.join(named)}); give each its own")
    if not kinds:
        if files:
            return
        raise SourceError(f"{listing.root}: --sidecars, but no image has a file of its basename beside it "
                          "(0001.jpg + 0001.json, .txt, .png or .npy)")
    rows: list[tuple[str, dict[str, Any]]] = []
    kept = []
    for k, item in enumerate(listing.items):
        try:
            row = {}
            for kind in kinds:
                path = found[kind][k]
                if path is None:
                    raise SourceError(f"{item.path}: no {Path(item.rel).stem}{kind} beside it, though other "
                                      f"images have one; add it, or pass --on-error skip")
                row.update(_read(path, kind, txt, (*RESERVED_FIELD_NAMES, txt, *files)))
        except SourceError as exc:
            if on_error != "skip":
                raise
            listing.skipped.append(Skip(item.rel, str(exc).split(": ", 1)[1]))
            continue
        kept.append(item)
        rows.append((Path(item.rel).with_suffix(kinds[0]).as_posix(), row))
        for kind in kinds:
            listing.ignored[kind] -= 1
    for kind in kinds:
        if listing.ignored[kind] <= 0:
            del listing.ignored[kind]
    listing.items = kept
    for name in sorted({key for _, row in rows for key in row}):
        listing.fields[name], listing.field_values[name] = typed_field(listing.root, rows, name)


def _attach_file_sidecars(listing: SourceListing, on_error: str, rename: dict[str, str]) -> list[str]:
    """Images and ``.npy`` files sharing an image's basename become its file fields (named by
    extension, or as ``rename`` says: the entries used are taken out of it); returns their names."""
    from fastload.converters.sources.file_fields import first_type, source_file

    groups: dict[str, list[SourceItem]] = {}
    for item in listing.items:
        groups.setdefault(str(Path(item.path).with_suffix("")), []).append(item)
    images = {stem: _primary(group) for stem, group in groups.items()}
    others = {stem: {Path(i.path).suffix.lower(): i.path for i in group if i is not images[stem]}
              for stem, group in groups.items()}
    for stem, image in images.items():
        for kind in FILE_SIDECARS:
            if (path := _beside(Path(image.path), kind)) is not None:
                others[stem][kind] = path
    kinds = sorted({kind for found in others.values() for kind in found})
    names = [rename.pop(kind.lstrip("."), kind.lstrip(".")) for kind in kinds]
    if not kinds:
        return []
    kept = []
    for stem, image in images.items():
        missing = [kind for kind in kinds if kind not in others[stem]]
        if missing:
            own = Path(image.rel).suffix.lower()
            reason = (f"a {own} with no image of its basename beside it, though it is another image's field "
                      "elsewhere; add its image or remove it, or pass --on-error skip" if own in kinds else
                      f"no {Path(image.rel).stem}{missing[0]} beside it, though other images have one; "
                      "add it, or pass --on-error skip")
            if on_error != "skip":
                raise SourceError(f"{image.path}: {reason}")
            listing.skipped.append(Skip(image.rel, reason))
            continue
        files = tuple(source_file(Path(others[stem][kind]), Path(image.rel).with_suffix(kind).as_posix(), None)
                      for kind in kinds)
        kept.append(replace(image, files=files))
    for kind in kinds:
        if kind in listing.ignored:  # not an image: it was counted as a file left out
            listing.ignored[kind] -= sum(kind in found for found in others.values())
            if listing.ignored[kind] <= 0:
                del listing.ignored[kind]
    listing.items = kept
    for column, name in enumerate(names):
        listing.file_fields[name] = first_type(listing, column, name)
    return names


def _primary(group: list[SourceItem]) -> SourceItem:
    """The sample's image among the images of one basename: its JPEG, else the only one."""
    jpegs = [item for item in group if Path(item.rel).suffix.lower() in _JPEG]
    if len(group) > 1 and len(jpegs) != 1:
        raise SourceError(f"{group[0].path.with_suffix('')}.*: {len(group)} images share this basename and "
                          "none (or more than one) is a JPEG, so which is the sample's image is unclear; pack "
                          "them from a CSV list with --file-columns instead")
    return jpegs[0] if len(group) > 1 else group[0]


def _beside(image: Path, kind: str) -> Path | None:
    path = image.with_suffix(kind)
    return path if path.is_file() else None


def _read(path: Path, kind: str, txt: str, taken: tuple[str, ...]) -> dict[str, Any]:
    try:
        raw = read_regular(path, MAX_SIDECAR_BYTES)
    except OSError as exc:
        raise SourceError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SourceError(f"{path}: is not UTF-8 text") from None
    if kind == ".txt":
        return {txt: text}
    try:
        value = parse_json(text)
    except BadJson as exc:
        raise SourceError(f"{path}: {exc}") from None
    if not isinstance(value, dict):
        raise SourceError(f"{path}: must hold a JSON object (its keys become fields), not {type(value).__name__}")
    clash = [key for key in value if key in taken]
    if clash:
        raise SourceError(f"{path}: key {clash[0]!r} is taken (a sample already has {', '.join(taken)}); "
                          "rename it")
    check_field_names(path, value, "a key of this sidecar")
    return value
