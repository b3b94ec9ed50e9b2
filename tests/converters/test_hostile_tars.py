"""WebDataset tars written to hurt (issue 37): header members that never end or declare gigabytes,
pax records no writer makes, names that are not UTF-8, labels and JSON no index can hold, brace
lists of a billion names. Each is a clear error naming the tar, member and limit, or under
``--on-error skip`` a skipped, counted and reported sample; never a hang, MemoryError or traceback."""

from __future__ import annotations

import io
import tarfile

import pytest
from fastload.converters import pack
from fastload.converters.sources.json_text import MAX_DEPTH
from fastload.converters.sources.tar_headers import MAX_HEADER_MEMBER, TarDamaged, tar_entries
from fastload.converters.sources.tars import MAX_BRACE_NAMES, expand_braces

from fastload.errors import SourceError
from tests.conftest import make_jpeg

END = bytes(1024)  # the two zero blocks that end a tar
JPEG = make_jpeg(16, 12, seed=1)


def _member(name: str, payload: bytes, kind: bytes = tarfile.REGTYPE, size: int | None = None) -> bytes:
    """One member as a writer lays it out: a ustar header (``size`` may claim other than the
    payload's length), the payload, padding to a block."""
    info = tarfile.TarInfo(name)
    info.size, info.type = len(payload) if size is None else size, kind
    return info.tobuf(format=tarfile.USTAR_FORMAT) + payload + bytes(-len(payload) % 512)


def _tar(members: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


# --- header members: pax records and sizes ---------------------------------------------------------

@pytest.mark.parametrize("record, reason", [
    (b"0 path=a.jpg\n", "declares a length of 0"),  # would never move the parse on
    (b"-8 path=a.jpg\n", "does not start with a length and a space"),
    (b"14path=a.jpg\n\n", "does not start with a length and a space"),
    (b"13 size=-500\n", "its size record holds b'-500', not a number of bytes"),
    (b"99 path=a.jpg\n", "declares a length of 99, which does not end at a newline"),
    (b"5011 size=" + b"9" * 5000 + b"\n", "its size record holds b'9999999999"),  # past int()'s 4,300 digits
], ids=["length-0", "negative", "no-space", "negative-size", "past-the-end", "5000-digit-size"])
def test_a_pax_record_no_writer_makes_is_damage_not_a_hang(tmp_path, record, reason):
    data = _member("././@PaxHeader", record, tarfile.XHDTYPE) + _member("a.jpg", JPEG) + END
    with pytest.raises(TarDamaged, match=rf"a damaged pax header at byte 0 \(.*{reason}"):
        list(tar_entries(data))
    (tmp_path / "p.tar").write_bytes(data)
    with pytest.raises(SourceError, match=rf"p.tar: a damaged pax header at byte 0 .*{reason}"):
        pack(tmp_path / "p.tar", tmp_path / "out.fl", progress=False)


@pytest.mark.parametrize("kind, what", [(tarfile.GNUTYPE_LONGNAME, "long name"), (tarfile.XHDTYPE, "pax header")])
def test_a_header_member_declaring_3_gb_is_refused_before_it_is_read(tmp_path, kind, what):
    declared = 3 * 2**30
    path = tmp_path / "big.tar"
    with open(path, "wb") as f:
        f.write(_member("././@LongLink", b"", kind, size=declared))
        f.truncate(512 + declared + len(END))  # sparse: the member's zeros take no disk
    with pytest.raises(SourceError, match=rf"big.tar: the {what} member at byte 0 declares {declared} bytes, "
                                          rf"over the {MAX_HEADER_MEMBER} a {what} may hold \(not read\)"):
        pack(path, tmp_path / "out.fl", progress=False)


# --- names, labels and JSON ------------------------------------------------------------------------

def test_member_names_that_are_not_utf8_are_named_or_skipped_and_reported(tmp_path):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT, encoding="utf-8",
                      errors="surrogateescape") as archive:
        for name, data in (("ok.jpg", JPEG), ("ok.cls", b"1"), ("caf\udce9.jpg", JPEG), ("caf\udce9.cls", b"2")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    (tmp_path / "n.tar").write_bytes(out.getvalue())
    with pytest.raises(SourceError, match=r"n.tar: sample 'caf\\udce9': member name caf\\xe9.jpg is not valid "
                                          r"UTF-8; rename it; fix the tar, or pass --on-error skip"):
        pack(tmp_path / "n.tar", tmp_path / "a.fl", progress=False)
    report = pack(tmp_path / "n.tar", tmp_path / "b.fl", on_error="skip", progress=False)
    assert report.num_records == 1 and report.skipped == 1
    assert [(s.rel, s.reason) for s in report.skipped_files] == [
        ("n.tar/caf\\xe9.jpg", "member name caf\\xe9.jpg is not valid UTF-8; rename it")]
    assert "caf\\\\xe9.jpg" in (tmp_path / "b.fl" / "skipped.jsonl").read_text()


@pytest.mark.parametrize("label", [b"1" * 40, b"-5"], ids=["40-digits", "negative"])
def test_a_cls_label_the_index_cannot_store_is_named(tmp_path, label):
    (tmp_path / "c.tar").write_bytes(_tar([("a.jpg", JPEG), ("a.cls", label)]))
    with pytest.raises(SourceError, match=r"c.tar: sample 'a': its .cls member holds '.*', out of the range a "
                                          r"label is stored in \(0..2\*\*63-1\)"):
        pack(tmp_path / "c.tar", tmp_path / "out.fl", progress=False)


def test_a_json_member_100000_deep_is_named_not_a_recursion_error(tmp_path):
    (tmp_path / "j.tar").write_bytes(_tar([("a.jpg", JPEG), ("a.json", b"[" * 100_000)]))
    with pytest.raises(SourceError, match=rf"j.tar: sample 'a': its member a.json is nested 100000 levels deep, "
                                          rf"over the {MAX_DEPTH} accepted"):
        pack(tmp_path / "j.tar", tmp_path / "out.fl", progress=False)


def test_a_json_sidecar_100000_deep_is_named_not_a_recursion_error(tmp_path):
    (tmp_path / "src" / "cat").mkdir(parents=True)
    (tmp_path / "src" / "cat" / "a.jpg").write_bytes(JPEG)
    (tmp_path / "src" / "cat" / "a.json").write_text('{"x": ' + "[" * 100_000)
    with pytest.raises(SourceError, match=rf"a.json: nested 100001 levels deep, over the {MAX_DEPTH} accepted"):
        pack(tmp_path / "src", tmp_path / "out.fl", sidecars=True, progress=False)


# --- brace lists -----------------------------------------------------------------------------------

def test_a_brace_list_of_a_billion_names_is_refused_before_one_is_made(tmp_path):
    with pytest.raises(SourceError, match=rf"names 1000000000 files, over the {MAX_BRACE_NAMES} a brace list"):
        expand_braces(f"{tmp_path}/x-{{0..999999999}}.tar")
    with pytest.raises(SourceError, match=r"names 1000000 \* 1000 files|names 1000000000 files"):
        pack(f"{tmp_path}/x-{{000000..999999}}-{{000..999}}.tar", tmp_path / "out.fl", progress=False)
    assert expand_braces("d-{08..10}-{a,b}.tar") == ["d-08-a.tar", "d-08-b.tar", "d-09-a.tar", "d-09-b.tar",
                                                     "d-10-a.tar", "d-10-b.tar"]
