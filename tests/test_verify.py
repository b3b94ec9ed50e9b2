"""verify: every record's checksum (and decode) against the index; damage is found and named."""

from __future__ import annotations

import os

import pytest

from fastload.converters import pack
from fastload import DatasetNotFoundError, ManifestError
from fastload.format import read_manifest
from fastload.verifier import BadRecord, VerifyReport, verify
from tests.conftest import copy_dataset, flip_payload_byte, make_png, run_fastload, write_tree

STORAGES = ["lmdb", "hdf5"]


@pytest.fixture(params=STORAGES)
def damaged(packed, tmp_path, request):
    """A private copy of a packed dataset, free to damage, and its source files."""
    out, files = packed(request.param)
    return copy_dataset(out, tmp_path / "ds"), files


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("decode", [False, True])
def test_a_sound_dataset_verifies(packed, storage, decode):
    out, files = packed(storage)
    seen = []
    report = verify(out, decode=decode, progress=seen.append)
    assert isinstance(report, VerifyReport) and report.ok
    assert report.checked == report.num_records == len(files) == sum(seen)
    assert report.bad == [] and report.problems == []


def test_a_flipped_byte_is_found_and_named(damaged):
    out, files = damaged
    path = sorted(files)[7]
    shard = flip_payload_byte(out, 7)
    report = verify(out)
    assert not report.ok and report.problems == [] and report.checked == len(files)
    assert report.bad == [BadRecord(shard=shard, record=7, path=path, problem="checksum mismatch")]
    assert str(report.bad[0]) == f"{shard} record 7 ({path}): checksum mismatch"


def test_the_cli_names_the_damaged_record_and_exits_1(damaged):
    out, files = damaged
    shard = flip_payload_byte(out, 0)
    last = len(files) - 1
    shard_last = flip_payload_byte(out, last)
    result = run_fastload("verify", out)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"BAD {shard} record 0 ({sorted(files)[0]}): checksum mismatch",
        f"BAD {shard_last} record {last} ({sorted(files)[last]}): checksum mismatch",
    ]
    assert result.stdout.strip() == (f"FAILED: {len(files)} of {len(files)} records checked, 2 bad, "
                                     "0 dataset problems")


def test_a_missing_shard_is_a_dataset_problem_and_its_records_are_bad(damaged):
    out, files = damaged
    manifest = read_manifest(out)
    gone = manifest.shards[1]
    (out / gone.file).unlink()
    report = verify(out)
    assert not report.ok and report.checked == len(files)
    assert report.problems == [f"{gone.file}: No such file or directory"]
    assert len(report.bad) == gone.num_records and {b.shard for b in report.bad} == {gone.file}


def test_damage_is_found_batch_after_batch_with_the_next_batch_read_ahead(damaged, monkeypatch):
    import fastload.verifier
    from fastload.format import RecordIndex

    monkeypatch.setattr(fastload.verifier, "BATCH", 3)  # many batches, each read while one is checked
    out, files = damaged
    manifest = read_manifest(out)
    shards = RecordIndex(out, manifest).shard
    victim = int((shards == 0).nonzero()[0][-1])  # shard 0's last record: not in the first batch
    assert victim >= 3
    flip_payload_byte(out, victim)
    gone = manifest.shards[1]
    (out / gone.file).unlink()
    seen = []
    report = verify(out, progress=seen.append)
    assert report.checked == report.num_records == len(files) == sum(seen) and max(seen) == 3
    assert {b.record for b in report.bad} == {victim, *(shards == 1).nonzero()[0].tolist()}
    assert report.problems == [f"{gone.file}: No such file or directory"]


def test_a_truncated_shard_is_reported_not_a_crash(damaged):
    # LMDB maps its file: a truncated shard read naively is SIGBUS, so run the real CLI and watch it.
    out, files = damaged
    shard = read_manifest(out).shards[0]
    os.truncate(out / shard.file, shard.bytes // 2)
    result = run_fastload("verify", out)
    assert result.returncode == 1, result.stderr
    assert f"BAD {shard.file}: {shard.bytes // 2} bytes on disk, the manifest says {shard.bytes}" in result.stderr
    assert f"BAD {shard.file} record 0 (" in result.stderr
    assert result.stdout.endswith(f"{shard.num_records} bad, 1 dataset problem\n")  # not "1 ... problems"


def test_decode_finds_images_whose_bytes_are_intact_but_do_not_decode(tmp_path):
    data = bytearray(make_png(48, 40, seed=3))
    data[data.find(b"IDAT") + 20] ^= 0xFF  # packed as-is: the default check reads only the header
    write_tree(tmp_path / "src", {"a.png": make_png(seed=1), "b.png": bytes(data)})
    pack(tmp_path / "src", tmp_path / "out", progress=False)
    assert verify(tmp_path / "out").ok
    report = verify(tmp_path / "out", decode=True)
    assert [(b.record, b.path) for b in report.bad] == [(1, "b.png")]
    assert report.bad[0].problem.startswith("does not decode (")
    result = run_fastload("verify", tmp_path / "out", "--decode")
    assert result.returncode == 1 and "BAD shard-00000.lmdb record 1 (b.png): does not decode" in result.stderr


def test_non_image_records_are_not_decoded(tmp_path):
    write_tree(tmp_path / "src", {"a.bin": b"\x00\x01 not an image"})
    pack(tmp_path / "src", tmp_path / "out", extensions=["bin"], progress=False)
    assert verify(tmp_path / "out", decode=True).ok


def test_verify_refuses_what_is_not_a_dataset(tmp_path, damaged):
    with pytest.raises(DatasetNotFoundError):
        verify(tmp_path / "nowhere")
    out, _ = damaged
    index = out / "index" / "checksum.npy"
    index.write_bytes(index.read_bytes()[:-1] + b"\x00")
    with pytest.raises(ManifestError, match="checksum.npy: index column 'checksum' does not match the digest"):
        verify(out)
    result = run_fastload("verify", out)
    assert result.returncode == 2 and "does not match the digest" in result.stderr


def test_decode_honours_the_pixel_bound_the_dataset_was_packed_with(tmp_path):
    """Over Pillow's own bomb limit (the default), under the pack's --max-pixels: the pack took it,
    so verify --decode passes it; run in fresh processes, where nothing raised Pillow's limit."""
    from PIL import Image

    big = tmp_path / "src" / "c0" / "big.png"
    big.parent.mkdir(parents=True)
    Image.new("1", (13_400, 13_400)).save(big)  # 179.6 Mpx, 1 bit each: a small file, 180 MB decoded
    out = tmp_path / "big.fl"
    packed = run_fastload("pack", tmp_path / "src", "-o", out, "--max-pixels", "200000000")
    assert packed.returncode == 0, packed.stderr
    assert read_manifest(out).packed["max_pixels"] == 200_000_000
    checked = run_fastload("verify", out, "--decode")
    assert checked.returncode == 0, checked.stdout + checked.stderr
