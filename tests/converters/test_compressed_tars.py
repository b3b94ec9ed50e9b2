"""Compressed tars held to what a plain tar is held to (issue 44, items 4 and 12/T2): a damaged
header is damage named by byte and member, never the archive's quiet end; a stream whose own check
fails (gzip's CRC, xz's, bzip2's) is an error, never a dataset; a long name or pax member is bounded
before it is read; under ``--on-error skip`` the damage is named in the skip report."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import tarfile

import pytest
from fastload.converters import pack
from fastload.converters.sources.tar_headers import MAX_HEADER_MEMBER

import fastload
from fastload.errors import SourceError
from tests.conftest import make_jpeg

COMPRESS = {"gz": lambda data: gzip.compress(data, compresslevel=0, mtime=0),  # stored blocks: bytes stay put
            "xz": lambda data: lzma.compress(data, preset=0), "bz2": bz2.compress}
JPEGS = [make_jpeg(24, 16, seed=k) for k in range(6)]


def _tar(count: int = 6) -> tuple[bytes, dict[str, int]]:
    """A tar of ``count`` samples (``000k.jpg``, ``000k.cls``) and each member's header offset."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for k in range(count):
            for name, data in ((f"{k:04d}.jpg", JPEGS[k]), (f"{k:04d}.cls", str(k % 2).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as archive:
        return out.getvalue(), {m.name: m.offset for m in archive.getmembers()}


@pytest.mark.parametrize("kind", sorted(COMPRESS))
def test_a_damaged_header_in_a_compressed_tar_is_named_not_the_end_of_it(tmp_path, kind):
    """Before: ``tarfile`` took the damaged header for the archive's end: 3 of 6 samples, rc 0, "skipped 0"."""
    data, headers = _tar()
    damaged = bytearray(data)
    at = headers["0003.jpg"]
    damaged[at + 10] ^= 0x41  # a name byte: the header's checksum no longer holds
    path = tmp_path / f"d.tar.{kind}"
    path.write_bytes(COMPRESS[kind](bytes(damaged)))
    with pytest.raises(SourceError, match=rf"d\.tar\.{kind}: a damaged header at byte {at}, after member 0002\.cls"):
        pack(path, tmp_path / "a.fl", progress=False)
    assert not (tmp_path / "a.fl" / "manifest.json").exists()
    report = pack(path, tmp_path / "b.fl", on_error="skip", progress=False)
    assert (report.num_records, report.skipped) == (2, 1)  # sample 0002 may go on past the damage: reported
    [skip] = report.skipped_files
    assert skip.rel == f"d.tar.{kind}@{at}" and "after member 0002.cls" in skip.reason
    assert "sample '0002' before it (0002.jpg, 0002.cls) is left out too" in skip.reason


def test_damage_in_a_plain_tar_under_skip_names_the_member_and_byte(tmp_path):
    """Issue 44, T2: the skip report said only ``d.tar@7680``; now the member before the damage,
    the byte, and the sample it takes with it."""
    data, headers = _tar()
    damaged = bytearray(data)
    at = headers["0004.cls"]
    damaged[at + 1] ^= 0x20
    (tmp_path / "d.tar").write_bytes(bytes(damaged))
    report = pack(tmp_path / "d.tar", tmp_path / "out.fl", on_error="skip", progress=False)
    assert report.num_records == 4 and report.skipped == 1
    [skip] = report.skipped_files
    assert skip.rel == f"d.tar@{at}"
    assert skip.reason.startswith(f"a damaged header at byte {at}, after member 0004.jpg")
    assert "sample '0004' before it (0004.jpg) is left out too" in skip.reason
    assert "after member 0004.jpg" in (tmp_path / "out.fl" / "skipped.jsonl").read_text()


def _flipped(packed: bytes, kind: str, payload: bytes) -> bytes:
    """``packed`` with one byte flipped: in gzip's stored blocks, a byte in the middle of ``payload``
    (deflate reads it; only the CRC can tell); in xz and bzip2, one in the middle of the stream."""
    blob = bytearray(packed)
    at = blob.find(payload) + len(payload) // 2 if kind == "gz" else len(blob) // 2
    assert at > 0
    blob[at] ^= 0x10
    return bytes(blob)


@pytest.mark.parametrize("kind", sorted(COMPRESS))
def test_a_stream_that_fails_its_own_check_is_an_error_never_a_dataset(tmp_path, kind):
    """Before: a gzip byte flipped in a member's data was packed as the record's bytes (the CRC at the
    stream's end was never read) and ``verify`` said OK."""
    data, _ = _tar()
    src = tmp_path / "src"
    src.mkdir()
    (src / f"a.tar.{kind}").write_bytes(COMPRESS[kind](_tar(2)[0]))
    (src / f"b.tar.{kind}").write_bytes(_flipped(COMPRESS[kind](data), kind, JPEGS[3]))
    with pytest.raises(SourceError, match=rf"b\.tar\.{kind}: its \w+ stream is damaged: it fails its own check at "
                                          r"byte \d+ of the decompressed tar"):
        pack(src / f"b.tar.{kind}", tmp_path / "a.fl", progress=False)
    assert not (tmp_path / "a.fl" / "manifest.json").exists()
    report = pack(src, tmp_path / "b.fl", on_error="skip", progress=False)  # the whole tar is left out
    assert (report.num_records, report.skipped) == (2, 1)
    assert report.skipped_files[0].rel == f"b.tar.{kind}" and "no byte of it can be trusted" in \
        report.skipped_files[0].reason
    ds = fastload.PackedDataset(tmp_path / "b.fl")
    assert [ds.record(i)["data"] for i in range(len(ds))] == JPEGS[:2] and fastload.verify(tmp_path / "b.fl").ok


@pytest.mark.parametrize("kind, what", [(tarfile.GNUTYPE_LONGNAME, "long name"), (tarfile.XHDTYPE, "pax header")])
def test_a_header_member_declaring_3_gb_in_a_small_tar_gz_is_refused_unread(tmp_path, kind, what):
    """Before: ``tarfile``'s stream mode read the member whole (here: to the stream's end)."""
    declared = 3 * 2**30
    info = tarfile.TarInfo("././@LongLink")
    info.size, info.type = declared, kind
    path = tmp_path / "big.tar.gz"
    path.write_bytes(gzip.compress(info.tobuf(format=tarfile.USTAR_FORMAT) + bytes(2 * MAX_HEADER_MEMBER)))
    with pytest.raises(SourceError, match=rf"big\.tar\.gz: the {what} member at byte 0 declares {declared} bytes, "
                                          rf"over the {MAX_HEADER_MEMBER} a {what} may hold \(not read\)"):
        pack(path, tmp_path / "out.fl", progress=False)
