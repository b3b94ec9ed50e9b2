"""How fastload touches files: it reads only regular files, never past a bound, and creates
nothing through a symbolic link.

Every file a dataset or a source is made of passes through here, so the rules hold in one place:
a FIFO, a device, or a link to one (a downloaded dataset or a shared folder can carry them) is
refused before a byte is read, since opening a FIFO blocks and a device reads without end; a read
stops at its bound even when the file grows; a file fastload writes is created new
(``O_EXCL | O_NOFOLLOW``), after removing whatever entry had its name, so a planted link is
replaced, never written through. Errors are ``OSError`` with a ``strerror`` that says what was
found, so callers keep their usual "<path>: cannot read (...)" messages.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from pathlib import Path

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"), (stat.S_ISLNK, "a symbolic link"))


def kind_of(mode: int) -> str:
    """What a file of this ``st_mode`` is, in words ("a FIFO", "a regular file", ...)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "a regular file" if stat.S_ISREG(mode) else "an unknown kind of file"


def not_regular(mode: int) -> OSError:
    return OSError(errno.EISDIR if stat.S_ISDIR(mode) else errno.EINVAL, f"not a regular file ({kind_of(mode)})")


# Kernel file systems: /proc/self/environ is a "regular file" holding the process's secrets.
KERNEL_FOLDERS = ("/proc", "/sys", "/dev")


@functools.cache
def _kernel_devices() -> frozenset[int]:
    """The devices of the file systems mounted at KERNEL_FOLDERS (those that are not the root's)."""
    found = set()
    for folder in KERNEL_FOLDERS:
        try:
            device = os.stat(folder).st_dev
            if device != os.stat("/").st_dev:
                found.add(device)
        except OSError:
            continue
    return frozenset(found)


def kernel_refusal(st: os.stat_result) -> str | None:
    """Why the file with this stat is never read (it lies on /proc, /sys or /dev, however it was
    reached: through links, or a folder linked in), or None."""
    if st.st_dev in _kernel_devices():
        return "lies in a kernel file system (/proc, /sys or /dev), never packed whatever the options"
    return None


def too_large(size: int, limit: int) -> OSError:
    return OSError(errno.EFBIG, f"{size} bytes, over the limit of {limit} bytes")


def open_regular(path: str | os.PathLike[str], *, follow_links: bool = True) -> int:
    """A read-only descriptor of ``path`` if it is a regular file outside the kernel's file systems;
    anything else raises OSError.

    ``O_NONBLOCK`` makes opening a FIFO return at once instead of waiting for a writer.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)  # of what was opened: a link swapped after a check changes nothing
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(st.st_mode)
        if (kernel := kernel_refusal(st)) is not None:
            raise OSError(errno.EACCES, kernel)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, limit: int) -> bytes:
    """All of a regular file's bytes, or OSError once it holds (or grows to) more than ``limit``."""
    size = os.fstat(fd).st_size
    if size > limit:
        raise too_large(size, limit)
    parts, total = [], 0
    want = size + 1  # one byte more: a file that grew (or a short read) reads on, up to the bound
    while True:
        chunk = os.read(fd, min(want, limit + 1 - total))
        if not chunk:
            break
        parts.append(chunk)
        total += len(chunk)
        if total > limit:
            raise too_large(total, limit)
        want = 1 << 20
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_regular(path: str | os.PathLike[str], limit: int, *, follow_links: bool = True) -> bytes:
    """The bytes of the regular file ``path`` if it holds at most ``limit``; else OSError."""
    fd = open_regular(path, follow_links=follow_links)
    try:
        return read_fd(fd, limit)
    finally:
        os.close(fd)


def create_new(path: str | os.PathLike[str], mode: int = 0o644) -> int:
    """A write descriptor of a new, empty regular file at ``path``.

    Whatever had that name (a stale file, or a planted link) is removed first, never followed;
    a folder there is refused.
    """
    remove_entry(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def remove_entry(path: str | os.PathLike[str]) -> None:
    """Unlink ``path`` itself if it exists (a link is removed, not its target); refuse a folder."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise OSError(errno.EISDIR, "a folder is in the way of a file fastload writes; remove it")
    os.unlink(path)


def ensure_dir(path: str | os.PathLike[str], mode: int = 0o777) -> None:
    """Create the folder ``path``, or accept a real one there; a link or a file is refused."""
    try:
        os.mkdir(path, mode)
        return
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, f"is {kind_of(st.st_mode)}, not a folder; fastload never writes "
                                     "through links or into other files: remove it")


def write_all(fd: int, data: bytes | memoryview) -> None:
    """All of ``data`` to ``fd`` (a write may take less than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_new(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to a new file at ``path`` (see ``create_new``) and fsync it."""
    fd = create_new(path, mode)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
