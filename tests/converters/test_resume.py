"""Interrupted packs: kill -9 at several points, failures and leftovers; the same command finishes the job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fastload.converters import pack
from fastload.converters.destination.out_dir import prepare_out
from fastload import PackedDataset
from fastload.errors import PackError
from fastload.format import shard_name
from fastload.verifier import verify
from tests.conftest import fastload_command, many_small_jpegs, run_fastload

STORAGES = ["lmdb", "hdf5"]


def shard_files(out: Path, storage: str) -> list[Path]:
    suffix = shard_name(storage, 0).split(".")[-1]
    return list(out.glob(f"shard-*.{suffix}"))  # finished (renamed) shards only, never *.tmp


def index_fingerprint(out: Path) -> tuple:
    """What makes two packs the same dataset: every index column's digest and every shard's records."""
    raw = json.loads((out / "manifest.json").read_text())
    shards = [(s["file"], s["num_records"], s["data_bytes"], s["records_digest"]) for s in raw["shards"]]
    return raw["index"], shards, raw["num_records"]


def assert_complete(out: Path, files: dict[str, bytes]) -> None:
    """Verified, every source file exactly once, in record order, with its exact bytes; no leftovers."""
    assert verify(out).ok
    ds = PackedDataset(out)
    assert len(ds) == len(files)
    paths = [ds.index.path[i] for i in range(len(ds))]
    assert paths == sorted(files)  # each path once, in the documented order
    for start in range(0, len(ds), 500):
        idx = list(range(start, min(start + 500, len(ds))))
        assert ds.reader.read_many(idx) == [files[paths[i]] for i in idx]
    ds.reader.close()
    assert not list(out.rglob("*.tmp")) and not (out / ".pack").exists()


# --- kill -9 --------------------------------------------------------------------------------------

def _start_and_kill(cmd: list[str], out: Path, storage: str, *, shards: int | None, delay: float = 0.0) -> int:
    """Start a pack; SIGKILL it once ``shards`` finished shard files exist (or after ``delay`` s)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        if shards is None:
            time.sleep(delay)
        else:
            while len(shard_files(out, storage)) < shards:
                assert proc.poll() is None, f"the pack ended before it could be killed: {proc.stderr.read()!r}"
                assert time.monotonic() < deadline, "the pack made no progress"
                time.sleep(0.002)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "manifest.json").exists()
    return len(shard_files(out, storage))


@pytest.mark.slow
@pytest.mark.parametrize("storage", STORAGES)
def test_kill_9_at_several_points_then_the_same_command_completes(tmp_path, storage):
    src, out = tmp_path / "src", tmp_path / "out"
    files = many_small_jpegs(src, 3000)
    cmd = fastload_command("pack", src, "-o", out, "--format", storage, "--shard-size", "64KB", "--quiet")
    planned = sum(len(b) for b in files.values()) // 64_000  # about this many shards (~90)

    _start_and_kill(cmd, out, storage, shards=None, delay=0.05)  # while starting up or listing
    done = _start_and_kill(cmd, out, storage, shards=1)  # inside the first shards
    for step in (7, 11, 13):  # later, at uneven points, each run resuming the last
        done = _start_and_kill(cmd, out, storage, shards=done + step)
    assert done < planned - 20

    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "resumed: kept" in result.stdout and "packed 3000 records" in result.stdout
    checked = run_fastload("verify", out)
    assert checked.returncode == 0 and checked.stdout.startswith("OK: 3000 of 3000 records checked")
    assert_complete(out, files)

    pack(src, tmp_path / "clean", format=storage, shard_size="64KB", progress=False)
    assert index_fingerprint(out) == index_fingerprint(tmp_path / "clean")


# --- resume after a failure, deterministic ------------------------------------------------------------

def _fail_in_shard_three(tmp_path: Path, storage: str, **kwargs) -> tuple[Path, Path, dict[str, bytes], str]:
    src, out = tmp_path / "src", tmp_path / "out"
    files = many_small_jpegs(src, 60, classes=3)
    bad = sorted(files)[40]
    (src / bad).write_bytes(b"")
    with pytest.raises(ValueError, match="empty file"):
        pack(src, out, format=storage, shard_size="10KB", progress=False, **kwargs)
    assert not (out / "manifest.json").exists()
    return src, out, files, bad


@pytest.mark.parametrize("storage", STORAGES)
def test_after_a_failure_finished_shards_are_kept(tmp_path, storage):
    src, out, files, bad = _fail_in_shard_three(tmp_path, storage, workers=2)
    finished = sorted(p.name for p in shard_files(out, storage))
    assert len(finished) >= 3 and len(list((out / ".pack").glob("shard-*.json"))) == len(finished)
    before = {name: (out / name).stat().st_mtime_ns for name in finished}

    (src / bad).write_bytes(files[bad])  # the user fixes the file and runs the same command
    report = pack(src, out, format=storage, shard_size="10KB", workers=5, progress=False)
    assert report.resumed_shards == len(finished)
    assert f"resumed: kept {len(finished)} finished shards" in report.summary()
    assert all((out / name).stat().st_mtime_ns == t for name, t in before.items())  # not rewritten
    assert_complete(out, files)
    pack(src, tmp_path / "clean", format=storage, shard_size="10KB", progress=False)
    assert index_fingerprint(out) == index_fingerprint(tmp_path / "clean")


def test_a_source_file_changed_between_runs_redoes_its_shard(tmp_path):
    src, out, files, bad = _fail_in_shard_three(tmp_path, "lmdb")
    finished = len(shard_files(out, "lmdb"))
    first = sorted(files)[0]
    files[first] = files[first].replace(b"image 0", b"IMAGE 0")  # same size: the shard cut stays
    (src / first).write_bytes(files[first])
    os.utime(src / first, ns=(1, 1))  # an mtime no earlier run can have seen
    (src / bad).write_bytes(files[bad])
    report = pack(src, out, shard_size="10KB", progress=False)
    assert report.resumed_shards == finished - 1  # all but shard 0
    assert_complete(out, files)


def test_different_options_redo_every_shard(tmp_path):
    src, out, files, bad = _fail_in_shard_three(tmp_path, "lmdb")
    (src / bad).write_bytes(files[bad])
    report = pack(src, out, shard_size="10KB", check="decode", progress=False)
    assert report.resumed_shards == 0
    assert_complete(out, files)


def test_resume_with_another_storage_kind_leaves_no_old_shards(tmp_path):
    src, out, files, bad = _fail_in_shard_three(tmp_path, "lmdb")
    (src / bad).write_bytes(files[bad])
    report = pack(src, out, format="hdf5", shard_size="10KB", progress=False)
    assert report.resumed_shards == 0 and not list(out.glob("*.lmdb"))
    assert_complete(out, files)


def test_leftovers_of_a_crash_are_cleaned_up_or_redone(tmp_path):
    """The states a kill can leave, made on purpose: each must be finished by the same command."""
    src, out, files, bad = _fail_in_shard_three(tmp_path, "lmdb")
    (src / bad).write_bytes(files[bad])
    (out / ".pack" / "shard-00001.json").unlink()  # killed between the shard's rename and its journal
    (out / "shard-00002.lmdb").write_bytes(b"half a shard")  # journal no longer matches the file
    (out / "shard-00003.lmdb.tmp").write_bytes(b"\0" * 5000)  # killed while writing a shard
    (out / ".pack" / "shard-00004.json.tmp").write_text("{")  # killed while writing a journal entry
    (out / "shard-00099.lmdb").write_bytes(b"from a longer plan")
    report = pack(src, out, shard_size="10KB", progress=False)
    assert report.resumed_shards >= 1
    assert_complete(out, files)
    assert not (out / "shard-00099.lmdb").exists()


def test_a_file_rewritten_with_its_size_and_mtime_kept_is_packed_again_on_resume(tmp_path):
    src, out, files, bad = _fail_in_shard_three(tmp_path, "lmdb")
    first = sorted(files)[0]  # in shard 0, finished before the failure
    st = (src / first).stat()
    new = bytearray(files[first])
    new[-3] ^= 0xFF  # the same size: a byte of the JPEG's last scan changed
    (src / first).write_bytes(bytes(new))
    os.utime(src / first, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the mtime set back
    (src / bad).write_bytes(files[bad])
    report = pack(src, out, shard_size="10KB", progress=False)
    assert report.resumed_shards >= 2  # the other finished shards are kept
    ds = PackedDataset(out)
    where = [ds.index.path[i] for i in range(len(ds))].index(first)
    assert ds.reader.read_many([where]) == [bytes(new)]
    assert verify(out).ok


def test_killed_after_the_skipped_report_before_the_manifest(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    files = many_small_jpegs(src, 30, classes=2)
    (src / "class_00" / "broken.jpg").write_bytes(b"not an image")
    pack(src, out, shard_size="10KB", on_error="skip", progress=False)
    (out / "manifest.json").rename(out / "manifest.json.tmp")  # as if killed during the rename,
    prepare_out(out)  # when the journal folder with its owner file (removed after the rename) was still there
    report = pack(src, out, shard_size="10KB", on_error="skip", progress=False)
    assert report.skipped == 1 and report.num_records == 30
    assert_complete(out, files)
    assert json.loads((out / "skipped.jsonl").read_text())["path"] == "class_00/broken.jpg"


def test_a_folder_without_a_manifest_is_an_unfinished_pack(tmp_path):
    src, out, files, bad = _fail_in_shard_three(tmp_path, "hdf5")
    with pytest.raises(FileNotFoundError, match="not a finished dataset .*run the same `fastload pack` command"):
        PackedDataset(out)
    result = run_fastload("verify", out)
    assert result.returncode == 2 and "not a finished dataset" in result.stderr


def test_a_journal_entry_that_cannot_be_written_is_blamed_not_its_shard(tmp_path):
    """The shard was written; recording it failed: the error names the journal, and the same
    command then finishes the pack (the unrecorded shard is removed and redone)."""
    src, out = tmp_path / "src", tmp_path / "out"
    files = many_small_jpegs(src, 30, classes=2)
    prepare_out(out)  # a folder of fastload's pack, where
    (out / ".pack" / "shard-00001.json.tmp").mkdir()  # the journal write fails
    with pytest.raises(PackError) as err:
        pack(src, out, shard_size="10KB", progress=False)
    assert str(err.value).startswith(f"{out}: cannot write the resume journal entry for shard-00001.lmdb "
                                     "in .pack/ ("), str(err.value)
    assert (out / "shard-00001.lmdb").exists() and not (out / ".pack" / "shard-00001.json").exists()
    os.rmdir(out / ".pack" / "shard-00001.json.tmp")
    report = pack(src, out, shard_size="10KB", progress=False)
    assert report.resumed_shards >= 1
    assert_complete(out, files)
