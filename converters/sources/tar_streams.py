"""Compressed WebDataset tars (.tar.gz, .tar.xz, .tar.bz2, .tar.zst): read by streaming them, never
unpacked to disk.

A compressed tar cannot be read at an offset: its members' offsets are offsets in the
decompressed stream. Listing walks that stream once, forward, through the same bounded header walk
as a plain tar (tar_headers.TarWalk: damage named by byte and member, a long name or pax member
bounded before it is read), reading the small text members (.cls, .txt, .json) as it passes them;
then it reads the stream to its end, so the stream's own check (gzip's CRC and length, xz's,
bzip2's, zstd's) is verified before anything of it is packed. (``tarfile``'s stream mode takes a
damaged header for the end of the archive, reads a header member whole, and stops before the
check.) Packing streams each tar again, skipping forward to each member it needs (``TarStream``).
The compression is told by the file's first bytes, not its name.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from fastload.converters.sources.items import escaped
from fastload.converters.sources.tar_headers import NotATar, TarDamaged, TarWalk

from fastload.errors import SourceError

_MAGIC = ((b"\x1f\x8b", "gzip"), (b"\xfd7zXZ\x00", "xz"), (b"BZh", "bzip2"), (b"\x28\xb5\x2f\xfd", "zstd"))
_SKIP_CHUNK = 1 << 20
UNBOUNDED = 2**63  # a stream's length: known only at its end, so a member's extent is checked by reading
STREAM_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)
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
    return zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), read_across_frames=True,
                                                      closefd=True)


def is_stream_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the compressed stream is damaged or ends early (zstandard's ZstdError too)."""
    return isinstance(exc, STREAM_ERRORS) or type(exc).__name__ == "ZstdError"


class StreamCheckFailed(TarDamaged):
    """The compressed stream fails its own check (gzip's CRC or length, xz's, bzip2's or zstd's), or
    its compressed data is corrupt: any byte of it may be wrong, so none of its members is kept."""


class ForwardReads:
    """``read_at`` (tar_headers.ReadAt) over a decompressed stream, for a walk whose reads never go
    back before the last one's start: the bytes skipped are decompressed and dropped, never held."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.buf, self.base = b"", 0  # the bytes held, and where they start in the tar
        self.position = 0  # decompressed bytes taken from the stream

    def __call__(self, offset: int, count: int) -> bytes:
        end = self.base + len(self.buf)
        if offset < self.base:
            raise RuntimeError(f"a read at byte {offset} goes back before byte {self.base} of a stream read forward")
        if offset >= end:
            self._take(offset - end, keep=False)
            self.buf, self.base = b"", offset
            if self.position < offset:  # the member before ``offset`` goes on past the stream's end
                raise EOFError(f"the decompressed tar ends at byte {self.position}, inside a member")
        elif offset > self.base:
            self.buf, self.base = self.buf[offset - self.base:], offset
        if len(self.buf) < count:
            self.buf += self._take(count - len(self.buf), keep=True)
        return self.buf[:count]

    def finish(self) -> None:
        """Read the stream to its end: its check (and any trailing data) is verified there."""
        self._take(-1, keep=False)

    def _take(self, count: int, keep: bool) -> bytes:
        """``count`` more bytes (-1: all that are left), fewer where the stream ends; dropped unless ``keep``."""
        parts = []
        while count:
            got = self.stream.read(_SKIP_CHUNK if count < 0 else min(_SKIP_CHUNK, count))
            if not got:
                break
            self.position += len(got)
            count -= len(got) if count > 0 else 0
            if keep:
                parts.append(got)
        return b"".join(parts)


class StreamWalk:
    """The entries of a compressed tar through the same bounded header walk as a plain tar's
    (tar_headers.TarWalk), read forward from its decompressed stream; after the end-of-archive
    blocks (or the damage that stops the walk) the stream is read to its end, so its own check is
    verified before the walk is done. A stream that fails it is StreamCheckFailed; one that ends
    early is TarDamaged, naming the last member read and the byte."""

    def __init__(self, stream: IO[bytes], name: str, kind: str) -> None:
        self.name, self.kind = name, kind
        self.reads = ForwardReads(stream)
        self.walk = TarWalk(self.reads, UNBOUNDED)
        self.last: str | None = None  # the last entry given

    def __iter__(self) -> Iterator[tuple[str, int, int, bytes]]:
        try:
            try:
                for entry in self.walk:
                    self.last = entry[0]
                    yield entry
            except TarDamaged:
                try:  # a tar damaged before it was compressed, or its stream damaged too: its check says which
                    self.reads.finish()
                except EOFError:
                    pass  # the stream ends early as well: the damage found first is the one named
                raise
            except NotATar as exc:
                if self.reads.position == 0:  # zstandard's reader returns a frame cut short as nothing
                    raise NotATar("decompressed, it holds no bytes: cut short, or empty") from None
                raise NotATar(f"decompressed, it is no tar ({exc})") from None
            self.reads.finish()
        except BaseException as exc:
            if isinstance(exc, (TarDamaged, NotATar)) or not is_stream_error(exc):
                raise
            raise self._damage(exc) from None

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes at ``offset`` of the decompressed tar (a member just given), fewer where it ends."""
        try:
            return self.walk.read(offset, size)
        except BaseException as exc:
            if not is_stream_error(exc):
                raise
            raise self._damage(exc) from None

    def _damage(self, exc: BaseException) -> TarDamaged:
        """What ``exc``, raised by the decompressor, says: the stream ends early, or fails its check."""
        at = self.reads.position
        member = f", in or after member {escaped(self.last)}" if self.last is not None else ""
        if isinstance(exc, EOFError):  # what was read before it is as it was written, as far as anyone can tell
            return TarDamaged(at, f"damaged or truncated at byte {at} of the decompressed tar{member} ({exc})",
                              self.last)
        if isinstance(exc, OSError) and exc.errno is not None:  # the file could not be read: not the stream's fault
            return TarDamaged(at, f"cannot be read at byte {at} of the decompressed tar{member} ({exc})", self.last)
        return StreamCheckFailed(at, f"its {self.kind} stream is damaged: it fails its own check at byte {at} of "
                                 f"the decompressed tar{member} ({exc}), so no byte of it can be trusted", self.last)


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
