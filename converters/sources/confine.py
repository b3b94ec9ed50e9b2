"""Where a pack may read: a file list's paths only inside its root, and nothing ever from a kernel
file system (/proc, /sys, /dev).

A list names its files by path, so a careless or hostile one could pack ``/proc/self/environ``
(the packer's environment, cloud credentials and all), ``/etc/shadow`` or ``../../.ssh/id_rsa``.
Each path a list gives (its ``path`` column, its file columns) is resolved, symlinks followed,
before it is checked: a link inside the root that points out of it is outside. A folder source
follows its links as documented (converters.sources.folders); no source file is ever read from a kernel
file system (fastload.format.files refuses them at open, by device, whatever the path). A
``save_to_disk`` folder's state.json names its data files by path too, and is held to the same rule
(``where_outside``), inside the folder that holds it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fastload.errors import SourceError
from fastload.format.files import KERNEL_FOLDERS

_NEVER = "a kernel file system, never packed whatever the options"


def _kernel_folder(real: str) -> str | None:
    return next((f for f in KERNEL_FOLDERS if real == f or real.startswith(f + "/")), None)


@dataclass(frozen=True)
class ListRoot:
    """Where a file list's relative paths start (``base``: the list's folder) and the folder every
    path must resolve inside (``root``: the list's folder or the one given, as a real path),
    unless ``outside`` allows any (never a kernel file system)."""

    base: Path
    root: Path
    outside: bool = False

    @classmethod
    def of(cls, src: Path, root: str | os.PathLike[str] | None, outside: bool) -> ListRoot:
        """The rule for the list ``src``: inside ``root`` (None: the list's folder)."""
        folder = src.parent if root is None else Path(root)
        if not folder.is_dir():
            raise SourceError(f"{folder}: the root of {src}'s paths must be a folder; pass --root the folder "
                              "that holds the files the list names")
        return cls(src.parent, Path(os.path.realpath(folder)), outside)

    def locate(self, raw: str) -> tuple[Path, str | None]:
        """The file the list's path ``raw`` names (relative: to the list's folder), and why it may
        not be read (None: it may)."""
        path = Path(raw) if os.path.isabs(raw) else self.base / raw
        return path, where_outside(path, None if self.outside else self.root, (
            "the list's paths must stay; move it in, pass --root a folder that holds it, or pass "
            "--allow-outside-root"))


def where_outside(path: Path, root: Path | None, hint: str) -> str | None:
    """Why ``path`` may not be read: it resolves (links followed) into a kernel file system, or
    outside the real folder ``root`` (None: anywhere will do), where ``hint`` says what must stay
    and what to do; None when it may."""
    real = os.path.realpath(path)
    folder = _kernel_folder(real) if os.path.isfile(real) else None  # a device: "not a regular file"
    if folder is not None:
        return f"resolves to {real}, in {folder}: {_NEVER}"
    if root is not None and not Path(real).is_relative_to(root):
        return f"resolves to {real}, outside {root}, where {hint}"
    return None
