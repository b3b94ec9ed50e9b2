"""Files beside each image that share its basename, as its fields (``fastload pack --sidecars``).

As in WebDataset, ``0001.jpg`` with ``0001.json`` and ``0001.txt`` beside it is one sample: the JSON
object's keys become fields (numbers, text, lists as typed arrays: see converters.sources._field), and
the text file is the field ``txt``. Once one image has a sidecar of a kind, every image must: a
missing one is an error naming the image, or with ``--on-error skip`` the image is skipped and
reported. The sidecars are counted as fields, not as ignored files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from converters.sources import Skip, SourceListing, _field
from fastload.errors import SourceError
from fastload.format.files import read_regular

SIDECAR_KINDS = (".json", ".txt")
MAX_SIDECAR_BYTES = 16 * 2**20
RESERVED = ("path", "label", "image")  # names a sample already has


def attach_sidecars(listing: SourceListing, on_error: str) -> None:
    """Read each item's sidecars into ``listing.fields`` / ``field_values``; drop (under
    ``on_error="skip"``) or refuse items whose sidecars are missing or unreadable."""
    found = {kind: [_beside(Path(item.path), kind) for item in listing.items] for kind in SIDECAR_KINDS}
    kinds = [kind for kind in SIDECAR_KINDS if any(p is not None for p in found[kind])]
    if not kinds:
        raise SourceError(f"{listing.root}: --sidecars, but no image has a .json or .txt file of its basename "
                          "beside it (0001.jpg + 0001.json)")
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
                row.update(_read(path, kind))
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
        listing.fields[name], listing.field_values[name] = _field(listing.root, rows, name)


def _beside(image: Path, kind: str) -> Path | None:
    path = image.with_suffix(kind)
    return path if path.is_file() else None


def _read(path: Path, kind: str) -> dict[str, Any]:
    try:
        raw = read_regular(path, MAX_SIDECAR_BYTES)
    except OSError as exc:
        raise SourceError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SourceError(f"{path}: is not UTF-8 text") from None
    if kind == ".txt":
        return {"txt": text}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(value, dict):
        raise SourceError(f"{path}: must hold a JSON object (its keys become fields), not {type(value).__name__}")
    clash = [key for key in value if key in RESERVED or key == "txt"]
    if clash:
        raise SourceError(f"{path}: key {clash[0]!r} is taken (a sample already has path, label, image, txt); "
                          "rename it")
    return value
