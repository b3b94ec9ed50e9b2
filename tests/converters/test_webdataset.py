"""WebDataset tars as a pack source (issue 27): members grouped by key as WebDataset groups them,
read in place, and the same records as the same samples packed from files; bad tars named or
skipped and reported."""

from __future__ import annotations

import csv
import io
import json
import tarfile

import numpy as np
import pytest
from fastload.converters import pack
from fastload.converters.sources.tars import expand_braces
from PIL import Image

import fastload
from fastload.errors import SourceError, SourceNotFoundError
from tests.conftest import make_jpeg

COUNT, PER_TAR = 12, 5


def _mask(width: int, height: int, seed: int) -> bytes:
    ids = np.random.default_rng(seed).integers(0, 7, (height, width), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(ids, "L").save(out, "PNG")
    return out.getvalue()


def _samples() -> list[dict]:
    out = []
    for i in range(COUNT):
        width, height = 40 + i, 30 + (i % 4)
        out.append({"key": f"{i:06d}", "jpg": make_jpeg(width, height, seed=i), "cls": i % 3,
                    "txt": f"a photo, number {i}", "json": {"score": i / 4, "n": i * 7},
                    "png": _mask(width, height, seed=i)})
    return out


def _add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    archive.addfile(info, io.BytesIO(data))


def write_tars(folder, samples, per_tar: int = PER_TAR, prefix: str = "data") -> list:
    """WebDataset's layout: each sample's members one after the other, ``<key>.<ext>``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for t in range(0, len(samples), per_tar):
        path = folder / f"{prefix}-{t // per_tar:06d}.tar"
        with tarfile.open(path, "w") as archive:
            for s in samples[t:t + per_tar]:
                _add(archive, s["key"] + ".jpg", s["jpg"])
                _add(archive, s["key"] + ".cls", str(s["cls"]).encode())
                _add(archive, s["key"] + ".txt", s["txt"].encode())
                _add(archive, s["key"] + ".json", json.dumps(s["json"]).encode())
                _add(archive, s["key"] + ".png", s["png"])
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("wds")
    samples = _samples()
    tars = write_tars(root / "tars", samples)
    files = root / "files"
    files.mkdir()
    with open(files / "list.csv", "w", newline="") as f:  # the same samples as files and a list
        rows = csv.writer(f)
        rows.writerow(["path", "label", "txt", "score", "n", "mask"])
        for s in samples:
            (files / f"{s['key']}.jpg").write_bytes(s["jpg"])
            (files / f"{s['key']}.png").write_bytes(s["png"])
            rows.writerow([f"{s['key']}.jpg", s["cls"], s["txt"], s["json"]["score"], s["json"]["n"],
                           f"{s['key']}.png"])
    return root, samples, tars


def test_tars_pack_to_the_records_their_samples_pack_to_from_files(made, tmp_path):
    root, samples, _ = made
    from_tars = pack(f"{root}/tars/data-{{000000..000002}}.tar", tmp_path / "t.fl", progress=False,
                     sidecar_names={"png": "mask"})
    from_files = pack(root / "files" / "list.csv", tmp_path / "f.fl", file_columns=["mask"], progress=False)
    assert from_tars.num_records == from_files.num_records == COUNT and from_tars.skipped == 0
    t, f = fastload.PackedDataset(tmp_path / "t.fl"), fastload.PackedDataset(tmp_path / "f.fl")
    assert t.manifest.fields == f.manifest.fields == {"txt": "str", "score": "float64", "n": "int64",
                                                      "mask": "mask"} | t.manifest.fields
    assert t.manifest.kind == "images" and t.manifest.packed["layout"] == "webdataset"
    for i, s in enumerate(samples):
        a, b = t.record(i), f.record(i)
        assert a["data"] == b["data"] == s["jpg"]
        assert a["mask"] == b["mask"] == s["png"]
        assert (a["label"], a["txt"], a["score"], a["n"]) == (b["label"], b["txt"], b["score"], b["n"])
        assert (a["label"], a["score"]) == (s["cls"], s["json"]["score"])
        assert (a["width"], a["height"]) == (b["width"], b["height"])
        assert a["path"] == f"data-{i // PER_TAR:06d}.tar/{s['key']}.jpg"
    assert fastload.verify(tmp_path / "t.fl", decode=True).ok
    batch = next(iter(fastload.DataLoader(fastload.PackedDataset(tmp_path / "t.fl", image_size=16, train=False,
                                                                 fields=("image", "mask", "score")), batch_size=4)))
    assert batch["image"].shape == (4, 3, 16, 16) and batch["mask"].shape == (4, 16, 16)


def test_a_folder_a_brace_list_and_one_tar_each_are_sources(made, tmp_path):
    root, samples, tars = made
    folder = pack(root / "tars", tmp_path / "folder.fl", progress=False)
    assert folder.num_records == COUNT
    one = pack(tars[1], tmp_path / "one.fl", progress=False)
    assert one.num_records == PER_TAR
    ds = fastload.PackedDataset(tmp_path / "one.fl")
    assert ds.record(0)["data"] == samples[PER_TAR]["jpg"]
    assert "png" in ds.manifest.fields  # named by its extension unless renamed
    assert expand_braces("a-{08..10}-{x,y}.tar") == ["a-08-x.tar", "a-08-y.tar", "a-09-x.tar", "a-09-y.tar",
                                                     "a-10-x.tar", "a-10-y.tar"]
    with pytest.raises(SourceNotFoundError, match=r"data-000003.tar: no such tar \(7 of the 10"):
        pack(f"{root}/tars/data-{{000000..000009}}.tar", tmp_path / "x.fl", progress=False)


def test_the_cli_packs_a_brace_list_to_a_default_output(made, tmp_path, cli):
    copy = tmp_path / "copy"
    write_tars(copy, _samples()[:6], per_tar=3)
    done = cli("pack", f"{copy}/data-{{000000..000001}}.tar")
    assert done.rc == 0, done.err
    assert fastload.PackedDataset(copy / "data.fl").__len__() == 6


def _bad(folder, samples, damage):
    write_tars(folder, samples, per_tar=len(samples))
    path = folder / "data-000000.tar"
    damage(path)
    return path


def test_a_truncated_tar_is_named_or_what_precedes_it_kept_and_the_rest_reported(tmp_path):
    samples = _samples()[:6]
    path = _bad(tmp_path / "src", samples, lambda p: p.write_bytes(p.read_bytes()[:p.stat().st_size // 2]))
    with pytest.raises(SourceError, match=r"data-000000.tar: member 0000\d\d\.\w+ is truncated"):
        pack(path, tmp_path / "a.fl", progress=False)
    report = pack(path, tmp_path / "b.fl", on_error="skip", progress=False)
    assert report.skipped == 1 and "truncated" in report.skipped_files[0].reason
    ds = fastload.PackedDataset(tmp_path / "b.fl")
    assert 0 < len(ds) < 6 and all(ds.record(i)["data"] == samples[i]["jpg"] for i in range(len(ds)))


def test_a_sample_without_its_image_is_named_or_skipped(tmp_path):
    samples = _samples()[:4]
    folder = tmp_path / "src"
    folder.mkdir()
    with tarfile.open(folder / "d.tar", "w") as archive:
        for k, s in enumerate(samples):
            if k != 2:
                _add(archive, s["key"] + ".jpg", s["jpg"])
            _add(archive, s["key"] + ".cls", b"1")
    with pytest.raises(SourceError, match=r"d.tar: sample '000002': no .jpg member"):
        pack(folder / "d.tar", tmp_path / "a.fl", progress=False)
    report = pack(folder / "d.tar", tmp_path / "b.fl", on_error="skip", progress=False)
    assert report.num_records == 3 and [s.rel for s in report.skipped_files] == ["d.tar/000002.jpg"]


def test_duplicate_keys_and_bad_labels_are_refused(tmp_path):
    s = _samples()[0]
    folder = tmp_path / "src"
    folder.mkdir()
    with tarfile.open(folder / "dup.tar", "w") as archive:
        for name in ("a.jpg", "b.jpg", "a.cls"):  # a's members apart: WebDataset would make two samples
            _add(archive, name, s["jpg"] if name.endswith("jpg") else b"1")
    with pytest.raises(SourceError, match=r"dup.tar: key 'a' appears again"):
        pack(folder / "dup.tar", tmp_path / "a.fl", progress=False)
    with tarfile.open(folder / "cls.tar", "w") as archive:
        _add(archive, "a.jpg", s["jpg"])
        _add(archive, "a.cls", b"cat")
    with pytest.raises(SourceError, match=r"sample 'a': its .cls member holds 'cat', not a whole-number"):
        pack(folder / "cls.tar", tmp_path / "b.fl", progress=False)
    with tarfile.open(folder / "gz.tar", "w:gz") as archive:
        _add(archive, "a.jpg", s["jpg"])
    # a gzipped tar, whatever its name: streamed (test_compressed_tars)
    assert pack(folder / "gz.tar", tmp_path / "c.fl", progress=False).num_records == 1


def test_a_brace_list_the_shell_expanded_is_named_with_how_to_quote_it(made, cli):
    _, _, tars = made
    done = cli("pack", *tars)
    assert done.rc != 0 and "quote a brace list" in done.err and str(tars[0]) in done.err


@pytest.mark.parametrize("form", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_the_header_walk_finds_what_tarfile_finds_and_names_a_damaged_header(tmp_path, form):
    """Tars are walked by our own header reader (6.5x tarfile's speed): long names (GNU L, pax path,
    ustar prefix) and sizes as tarfile reads them; a bad checksum mid-tar is damage, not the quiet
    end tarfile makes of it."""
    from fastload.converters.sources.tar_headers import TarDamaged, tar_entries

    names = ["a/" * 60 + "x.jpg", "b.cls", "c.txt"] + (["é" * 120 + ".json"] if form != tarfile.USTAR_FORMAT else [])
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=form) as archive:
        for k, name in enumerate(names):
            _add(archive, name, bytes(range(k + 3)))
    data = path.read_bytes()
    with tarfile.open(path) as archive:
        found = archive.getmembers()
    assert [(e.name, e.offset, e.size) for e in tar_entries(data)] == [(m.name, m.offset_data, m.size) for m in found]
    damaged = bytearray(data)
    second = found[1].offset
    damaged[second + 10] ^= 0xFF  # a name byte of the second header: its checksum no longer holds
    with pytest.raises(TarDamaged, match=f"a damaged header at byte {second}"):
        list(tar_entries(bytes(damaged)))


def _reheader(data: bytearray, at: int, size_field: bytes, checksum_format: str, signed: bool = False) -> None:
    """Rewrite the header at ``at`` with another spelling of its size and checksum, as other writers spell them."""
    data[at + 124:at + 136] = size_field
    data[at + 148:at + 156] = b" " * 8
    header = data[at:at + 512]
    checksum = sum(b - 256 if signed and b > 127 else b for b in header)
    field = (checksum_format % checksum).encode().ljust(8, b"\0")
    assert len(size_field) == 12 and len(field) == 8
    data[at + 148:at + 156] = field


def test_the_header_walk_reads_other_spellings_of_sizes_and_checksums_and_members_past_its_reads(tmp_path):
    """Sizes NUL-padded, space-padded, in all 12 digits or in base-256; checksums in 7 digits or
    summed as signed bytes (old tars); a text member longer than what is read with its header."""
    from fastload.converters.sources.tar_headers import CHUNK, TarEntry, tar_entries, walk_file

    big = json.dumps({"text": "x" * (3 * CHUNK)}).encode()
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as archive:
        for name, payload in (("a.jpg", b"j" * 700), ("a.cls", b"3"), ("a.json", big), ("c.cls", b"1"),
                              ("b.jpg", b"k" * 1300)):
            _add(archive, name, payload)
    with tarfile.open(path) as archive:
        found = archive.getmembers()
    expected = [(m.name, m.offset_data, m.size) for m in found]
    data = bytearray(path.read_bytes())
    headers = [m.offset for m in found]
    _reheader(data, headers[0], b"1274\0\0\0\0\0\0\0\0", "%07o\0")
    _reheader(data, headers[1], b"          1 ", "%06o\0 ")
    _reheader(data, headers[2], b"%012o" % len(big), "%o")  # NUL-padded
    data[headers[3] + 265] = 0xE9  # a byte over 127 (in the owner's name): an old writer summed it as -23
    _reheader(data, headers[3], b"00000000001\0", "%06o\0 ", signed=True)
    _reheader(data, headers[4], b"\x80" + (1300).to_bytes(11, "big"), "%06o\0 ")
    assert [(e.name, e.offset, e.size) for e in tar_entries(bytes(data))] == expected
    path.write_bytes(bytes(data))
    with walk_file(path) as walk:
        entries = [TarEntry(*entry) for entry in walk]
        assert [(e.name, e.offset, e.size) for e in entries] == expected
        assert walk.read(entries[2].offset, entries[2].size) == big


def _zstd_available() -> bool:
    try:
        from compression import zstd  # noqa: F401 - Python 3.14
    except ImportError:
        try:
            import zstandard  # noqa: F401
        except ImportError:
            return False
    return True


def _compress(data: bytes, kind: str) -> bytes:
    import bz2
    import gzip
    import lzma

    if kind == "zst":
        try:
            from compression import zstd
            return zstd.compress(data)
        except ImportError:
            import zstandard
            return zstandard.ZstdCompressor().compress(data)
    return {"gz": gzip.compress, "xz": lzma.compress, "bz2": bz2.compress}[kind](data)


@pytest.mark.parametrize("kind", ["gz", "xz", "bz2", pytest.param("zst", marks=pytest.mark.skipif(
    not _zstd_available(), reason="zstd needs the zstandard package or Python 3.14"))])
def test_compressed_tars_pack_the_records_of_the_plain_ones(made, tmp_path, kind):
    """Issue 39, item 3: a .tar.gz/.xz/.bz2/.zst is streamed (never unpacked to disk), in shards
    cut anywhere, to the plain tars' records; a sample whose members come in another order too."""
    root, samples, tars = made
    folder = tmp_path / "packed"
    folder.mkdir()
    for tar in tars:
        (folder / f"{tar.name}.{kind}").write_bytes(_compress(tar.read_bytes(), kind))
    plain = pack(root / "tars", tmp_path / "plain.fl", progress=False)
    report = pack(folder, tmp_path / "c.fl", progress=False, shard_size="3KB")  # several shards per tar
    assert report.num_records == plain.num_records == COUNT and report.num_shards > len(tars)
    p, c = fastload.PackedDataset(tmp_path / "plain.fl"), fastload.PackedDataset(tmp_path / "c.fl")
    assert c.manifest.fields == p.manifest.fields and c.manifest.packed["layout"] == "webdataset"
    for i in range(COUNT):
        a, b = p.record(i), c.record(i)
        assert b.pop("path") == a.pop("path").replace(".tar/", f".tar.{kind}/")
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert fastload.verify(tmp_path / "c.fl").ok
    one = tmp_path / f"one.tar.{kind}"  # one tar, named as itself in the manifest; members out of order
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as archive:
        _add(archive, "k.png", samples[0]["png"])
        _add(archive, "k.cls", b"2")
        _add(archive, "k.jpg", samples[0]["jpg"])
    one.write_bytes(_compress(buf.getvalue(), kind))
    pack(one, tmp_path / "one.fl", progress=False)
    record = fastload.PackedDataset(tmp_path / "one.fl").record(0)
    assert (record["data"], record["png"], record["label"]) == (samples[0]["jpg"], samples[0]["png"], 2)
    assert fastload.PackedDataset(tmp_path / "one.fl").manifest.packed["source"] == str(one)


def test_a_truncated_compressed_tar_is_named_or_its_samples_before_the_damage_kept(made, tmp_path):
    _, samples, tars = made
    data = _compress(tars[0].read_bytes(), "gz")
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(data[:len(data) * 2 // 3])
    with pytest.raises(SourceError, match=r"bad\.tar\.gz: damaged or truncated at byte \d+ of the decompressed "
                                          r"tar, in or after member 0000\d\d\.\w+ \(Compressed file ended"):
        pack(bad, tmp_path / "a.fl", progress=False)
    report = pack(bad, tmp_path / "b.fl", progress=False, on_error="skip")
    assert 0 < report.num_records < PER_TAR and report.skipped == 1
    ds = fastload.PackedDataset(tmp_path / "b.fl")
    assert [ds.record(i)["data"] for i in range(len(ds))] == [s["jpg"] for s in samples[:len(ds)]]
    (tmp_path / "junk.tar.gz").write_bytes(_compress(b"not a tar at all", "gz"))
    with pytest.raises(SourceError, match=r"junk\.tar\.gz: not a tar file \(decompressed, it is no tar"):
        pack(tmp_path / "junk.tar.gz", tmp_path / "c.fl", progress=False)


@pytest.mark.skipif(_zstd_available(), reason="zstd can be read here")
def test_a_zstd_tar_without_a_zstd_reader_names_the_package(tmp_path):
    (tmp_path / "a.tar.zst").write_bytes(b"\x28\xb5\x2f\xfd" + bytes(60))
    with pytest.raises(SourceError, match=r"a\.tar\.zst: a zstd-compressed tar; reading it needs the zstandard "
                                          r"package \(pip install zstandard\)"):
        pack(tmp_path / "a.tar.zst", tmp_path / "a.fl", progress=False)
