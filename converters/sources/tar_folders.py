"""An ImageFolder tree packed in tars (``cat/001.jpg``, ``dog/002.jpg``, or all under one top
folder, ``train/cat/001.jpg``, as ``tar czf train.tar.gz train/`` writes it): each image member one
record, labelled by its class folder as a folder pack labels it, the class names (sorted) in the
manifest.

``--layout auto`` tells such a tree from WebDataset samples: no member is a ``.cls`` label, no
image shares its key with another member, and every image lies in one of two or more class folders
(the images of one folder are that folder tarred, not one class). Images both in class folders and
at the top are refused, naming both ways to read them. WebDataset samples whose images lie in
class folders but that carry no label are read as WebDataset, with a warning that says their labels
are -1 and names ``--layout imagefolder``.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from fastload.converters.sources.items import (
    MemberReader,
    SourceItem,
    SourceListing,
    bad_entry,
    escaped,
)
from fastload.converters.sources.tar_walks import Member, TarObject, Walked, report_damage

from fastload.errors import SourceError


def reads_as_tree(src: object, walked: Sequence[Walked], layout: str, extensions: tuple[str, ...]) -> bool:
    """Whether the walked tars are read as an ImageFolder tree (see the module's docstring)."""
    if layout == "imagefolder":
        return True
    labelled = any(m.ext == "cls" for walk in walked for m in walk.members)
    placed: list[tuple[str, str | None]] = []  # each image member's name, and the class folder it lies in
    for walk in walked:
        top = _root(walk)
        placed += [(m.name, _class_of(m.name, top)) for m in walk.members if _is_image(m, extensions)]
    classes = {c for _, c in placed if c is not None}
    if labelled or len(classes) < 2:  # one folder of images is the folder tarred, not a class
        return False
    inside = next(name for name, c in placed if c is not None)
    outside = next((name for name, c in placed if c is None), None)
    if layout == "auto" and _lone(walked, extensions):
        if outside is None:
            return True
        raise SourceError(f"{src}: holds both images in class folders ({escaped(inside)}, ...) and images outside "
                          f"them ({escaped(outside)}, ...); pass --layout imagefolder (labels from the folders, the "
                          "others left out) or --layout webdataset (every image, no labels)")
    warnings.warn(f"{src}: its images lie in {len(classes)} folders ({escaped(inside)}, ...) and no sample has a "
                  ".cls label, so it is packed as WebDataset samples with label -1; pass --layout imagefolder to "
                  "label each image by its class folder", stacklevel=2)
    return False


def list_tree(src: object, root: object, tars: Sequence[TarObject], walked: Sequence[Walked], reader: MemberReader,
              *, on_error: str, max_file_size: int | None, extensions: tuple[str, ...]) -> SourceListing:
    """Every image member of ``tars`` in a class folder, in tar and member order, labelled by its folder."""
    listing = SourceListing(root=root, layout="imagefolder", items=[], classes=None, images=True,  # type: ignore[arg-type]
                            reader=reader)
    found: list[tuple[TarObject, Member, str]] = []
    classes: set[str] = set()
    for tar, walk in zip(tars, walked):
        report_damage(listing, tar, walk.damage, on_error)
        listing.ignored.update(walk.ignored)
        top = _root(walk)
        classes.update(c for c in (_folder_class(name, top) for name in walk.folders) if c is not None)
        for member in walk.members:
            name = _clean(member.name)
            if any(part.startswith(".") for part in name.split("/")):
                listing.ignored["(hidden)"] += 1
            elif not _is_image(member, extensions):
                listing.ignored[Path(name).suffix.lower() or "(no extension)"] += 1
            elif (label := _class_of(member.name, top)) is None:
                listing.ignored["(file outside a class folder)"] += 1
            else:
                found.append((tar, member, label))
                classes.add(label)
    listing.classes = sorted(classes)
    ids = {name: k for k, name in enumerate(listing.classes)}
    twice = Counter(f"{tar.name}/{member.name}" for tar, member, _ in found)
    for tar, member, label in found:
        rel = f"{tar.name}/{member.name}"
        if twice[rel] > 1:
            raise SourceError(f"{tar.path}: member {escaped(member.name)} appears {twice[rel]} times; an image is one "
                              "record: write each once")
        problem = _problem(member, max_file_size)
        if problem is not None:
            bad_entry(listing, on_error, f"{tar.path}/{member.name}", rel, problem, fix=None)
            continue
        listing.items.append(SourceItem(tar.path, rel, ids[label], member.size, tar.mtime_ns, (), tar.stamp,
                                        offset=member.offset))
    if not listing.items:
        raise SourceError(f"{src}: no images with extensions {', '.join(extensions)} in class folders in "
                          f"{len(tars)} tar file(s)" + (f" (first skipped: {listing.skipped[0].rel}: "
                                                        f"{listing.skipped[0].reason})" if listing.skipped else ""))
    return listing


def _problem(member: Member, max_file_size: int | None) -> str | None:
    if escaped(member.name) != member.name:  # a name is stored as UTF-8 text in the index
        return f"member name {escaped(member.name)} is not valid UTF-8; rename it"
    if max_file_size is not None and member.size > max_file_size:
        return f"member {member.name} holds {member.size} bytes, over the {max_file_size} limit (--max-file-size)"
    return None


def _is_image(member: Member, extensions: tuple[str, ...]) -> bool:
    return member.name.lower().endswith(extensions)


def _clean(name: str) -> str:
    """A member's path without the ``./`` or ``/`` it may start with (``tar cf x.tar .`` writes ``./cat/1.jpg``)."""
    while name.startswith(("./", "/")):
        name = name[2:] if name.startswith("./") else name[1:]
    return name


def _root(walk: Walked) -> str:
    """The one top folder every member lies under (``train/``), when the images lie in folders below
    it; else "" (the class folders are the tar's top folders)."""
    names = [_clean(m.name) for m in walk.members]
    tops = {name.split("/", 1)[0] for name in names}
    if len(tops) != 1 or not all("/" in name for name in names) or not any(name.count("/") >= 2 for name in names):
        return ""
    return tops.pop() + "/"


def _class_of(name: str, root: str) -> str | None:
    """The class folder ``name`` (a member or a folder entry) lies in, below ``root``; None: none."""
    rel = _clean(name).rstrip("/")
    if root:
        if not rel.startswith(root):
            return None
        rel = rel[len(root):]
    head, slash, _ = rel.partition("/")
    return head if slash and head and not head.startswith(".") else None


def _folder_class(name: str, root: str) -> str | None:
    """The class a folder entry of the tar is, or lies in (None: the top folder, or a hidden one)."""
    return _class_of(name.rstrip("/") + "/x", root)


def _lone(walked: Sequence[Walked], extensions: tuple[str, ...]) -> bool:
    """Whether no image shares its key with another member (WebDataset would make them one sample)."""
    for walk in walked:
        keys = Counter(m.key for m in walk.members)
        if any(keys[m.key] > 1 for m in walk.members if _is_image(m, extensions)):
            return False
    return True
