"""Compressed WebDataset tars (.tar.gz, .tar.xz, .tar.bz2, .tar.zst): read by streaming them, never
unpacked to disk.

A compressed tar cannot be read at an offset: its members' offsets are offsets in the
decompressed stream. Listing walks that stream once with ``tarfile``'s stream mode (``r|``), which
gives each member's name, data offset and size, and reads the small text members (.cls, .txt,
.json) as it passes them; packing streams each tar again, once, skipping forward to each member it
needs (``TarStream``). The compression is told by the file's first bytes, not its name.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from fastload.converters.sources.tar_headers import NotATar, TarDamaged

from fastload.errors import SourceError

_MAGIC = ((b"\x1f\x8b", "gzip"), (b"\xfd7zXZ\x00", "xz"), (b"BZh", "bzip2"), (b"\x28\xb5\x2f\xfd", "zstd"))
_SKIP_CHUNK = 1 << 20
STREAM_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError, tarfile.TarError, ValueError)
"""What a damaged or truncated compressed stream raises as it is read (zstandard's ZstdError is
matched by name: ``is_stream_error``)."""


def compression_of(path: Path) -> str | None:
    """``"gzip"``, ``"xz"``, ``"bzip2"`` or ``"zstd"`` from the file's first bytes; None: not compressed."""
    with open(path, "rb") as f:
        head = f.read(6)
    return next((kind for magic, kind in _MAGIC if head.startswith(magic)), None)


def open_decompressed(path: Path, kind: str) -> IO[bytes]:
    """The decompressed bytes of ``path`` as a stream read from its start."""
    if kind == "gzip":
        return gzip.open(path, "rb")
    if kind == "xz":
        return lzma.open(path, "rb")
    if kind == "bzip2":
        return bz2.open(path, "rb")
    try:
        from compression import zstd  # type: ignore[import-not-found]  # Python 3.14's standard library

        return zstd.open(path, "rb")  # type: ignore[no-any-return]
    except ImportError:
        pass
    try:
        import zstandard
    except ImportError:
        raise SourceError(f"{path}: a zstd-compressed tar; reading it needs the zstandard package "
                          "(pip install zstandard) or Python 3.14's compression.zstd; or decompress it "
                          "first (zstd -d)") from None
    return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)  # noqa: SIM115


def is_stream_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the compressed stream is damaged or ends early (zstandard's ZstdError too)."""
    return isinstance(exc, STREAM_ERRORS) or type(exc).__name__ == "ZstdError"


class StreamWalk:
    """The entries of a compressed tar, read once in order through ``tarfile``'s stream mode: the
    ``(name, offset, size, kind)`` tuples of tar_headers.TarWalk, and ``read`` for the entry just
    given (a text member's bytes)."""

    def __init__(self, stream: IO[bytes], name: str) -> None:
        self.stream, self.name = stream, name
        self.tar: tarfile.TarFile | None = None
        self.current: tarfile.TarInfo | None = None

    def __iter__(self) -> Iterator[tuple[str, int, int, bytes]]:
        try:
            self.tar = tarfile.open(fileobj=self.stream, mode="r|")  # noqa: SIM115 - closed with the stream
            for info in self.tar:
                self.current = info
                yield info.name, info.offset_data, info.size, info.type
        except BaseException as exc:
            raise self._damage(exc) from None

    def read(self, offset: int, size: int) -> bytes:
        """The bytes of the entry just given (``offset`` and ``size`` are its own)."""
        assert self.tar is not None and self.current is not None and self.current.offset_data == offset
        try:
            member = self.tar.extractfile(self.current)
            return member.read(size) if member is not None else b""
        except BaseException as exc:
            raise self._damage(exc) from None

    def _damage(self, exc: BaseException) -> BaseException:
        """What ``exc``, raised while reading the stream, says: no tar, a tar damaged from here, or itself."""
        if not is_stream_error(exc):
            return exc
        if self.current is None:
            return NotATar(f"decompressed, it is no tar ({exc})")
        at = self.current.offset_data
        return TarDamaged(at, f"damaged or truncated at byte {at} of the decompressed tar ({exc})", self.current.name)


class TarStream:
    """One compressed tar read forward: ``read(offset, size)`` skips to ``offset`` (reopening the
    stream when it lies behind) and reads ``size`` bytes."""

    def __init__(self, path: Path, kind: str) -> None:
        self.path, self.kind = path, kind
        self.stream: IO[bytes] | None = None
        self.position = 0

    def read(self, offset: int, size: int) -> bytes:
        if self.stream is None or offset < self.position:
            self.close()
            self.stream, self.position = open_decompressed(self.path, self.kind), 0
        try:
            while self.position < offset:
                skipped = len(self.stream.read(min(_SKIP_CHUNK, offset - self.position)))
                if not skipped:
                    break
                self.position += skipped
            data = self.stream.read(size) if self.position == offset else b""
        except BaseException as exc:
            if not is_stream_error(exc):
                raise
            self.close()
            raise OSError(f"{self.path}: its {self.kind} stream is damaged or truncated ({exc})") from None
        self.position += len(data)
        if len(data) != size:
            raise OSError(f"{self.path} ends inside this member (read {len(data)} of {size} bytes at {offset} of "
                          "the decompressed tar)")
        return data

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
