"""Tiny file systems for full-disk tests: a tmpfs, or a loop-mounted ext4 image, mounted for one
test and skipped with the reason where this machine will not mount them (not root, no
CAP_SYS_ADMIN, no loop devices, no mkfs.ext4). The check is a real attempt, not a guess."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _run(*command: str | Path) -> str:
    """Run ``command``; its stderr (empty when it succeeded)."""
    done = subprocess.run([str(part) for part in command], check=False, capture_output=True, text=True,
                          timeout=60)
    return "" if done.returncode == 0 else (done.stderr.strip() or f"exit status {done.returncode}")


@contextlib.contextmanager
def tmpfs(folder: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``folder`` (made if missing) for the ``with`` block."""
    folder.mkdir(parents=True, exist_ok=True)
    failed = _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", folder)
    if failed:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {failed}")
    try:
        yield folder
    finally:
        _run("umount", "-l", folder)


@contextlib.contextmanager
def ext4(folder: Path, size: str = "2M") -> Iterator[Path]:
    """A loop-mounted ext4 image of ``size`` at ``folder`` (made if missing) for the ``with`` block."""
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 is not installed: no ext4 image to loop-mount (apt-get install e2fsprogs)")
    image = folder.with_name(folder.name + ".img")
    failed = _run("truncate", "-s", size, image) or _run("mkfs.ext4", "-q", "-F", image)
    if failed:
        pytest.skip(f"cannot make an ext4 image: {failed}")
    folder.mkdir(parents=True, exist_ok=True)
    failed = _run("mount", "-o", "loop", image, folder)
    if failed:
        image.unlink()
        pytest.skip(f"cannot loop-mount an ext4 image here (needs root and loop devices): {failed}")
    try:
        yield folder
    finally:
        _run("umount", "-l", folder)
        image.unlink()


def fill_up(folder: Path, leave: int) -> None:
    """Write a ballast file in ``folder`` that leaves ``leave`` blocks of its file system free (as
    root sees it: ext4 keeps its reserved blocks for root)."""
    st = os.statvfs(folder)
    free = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    size = max(free - leave, 0) * st.f_frsize
    fd = os.open(folder / "ballast", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        chunk = b"\xaa" * (1 << 16)
        while size > 0:
            try:
                size -= os.write(fd, chunk[:size])
            except OSError:
                break  # the file system's own metadata took a few blocks: as full as it gets
        os.fsync(fd)
    finally:
        os.close(fd)
