"""Dataset versions: an earlier version's manifest, kept once an append published a newer one."""

from __future__ import annotations

from fastload.errors import DatasetNotFoundError
from fastload.format.columns import ReadFile
from fastload.format.layout import MANIFEST_NAME, version_manifest_name
from fastload.format.manifest import MAX_MANIFEST_BYTES, Manifest, parse_manifest


def pinned_manifest(current: Manifest, version: int | None, root: object, read: ReadFile) -> Manifest:
    """``current`` (the published manifest) when it is ``version`` (None: any), else the kept
    manifest of that earlier version: a reader opened before an append, and the workers it
    starts after, read the version it opened."""
    if version is None or current.version == version:
        return current
    name = version_manifest_name(version)
    if version > current.version:
        raise DatasetNotFoundError(f"{root}: holds version {current.version}, not {version} (its {MANIFEST_NAME} was "
                                   "replaced by an older one); open the dataset again")
    try:
        text = read(name, MAX_MANIFEST_BYTES)
    except OSError as exc:
        raise DatasetNotFoundError(
            f"{root}/{name}: version {version}, which this reader opened, is no longer kept "
            f"({exc.strerror or exc}; it was pruned after an append); open the dataset again to read "
            f"version {current.version}") from None
    manifest = parse_manifest(text.decode("utf-8", errors="replace"), f"{root}/{name}")
    if manifest.version != version:
        raise DatasetNotFoundError(f"{root}/{name}: holds version {manifest.version}, not {version}; "
                                   "the dataset is damaged: open it again")
    return manifest
