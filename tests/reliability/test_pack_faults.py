"""Faults while packing: `fastload pack` SIGKILLed (or interrupted with Ctrl-C) at 20 random points
in a row, each run resuming the last, still ends with a dataset that verifies and holds every file
exactly once, and every Ctrl-C ends the run at once with the resume message; a disk that
fills up (a file-size limit, RLIMIT_FSIZE) during a shard or while the index is written is a clear
error with no manifest, and the same command then finishes the job.

(kill -9 at five chosen points, a full disk in the first shard and two packs into one OUT:
tests/converters/test_resume.py and tests/test_cli.py.)
"""

from __future__ import annotations

import random
import resource
import signal
import subprocess
import time

import pytest

from fastload.converters import pack
from fastload.format import PACK_LOCK_NAME
from tests.conftest import (
    fastload_command, make_jpeg, many_small_jpegs, run_fastload, with_comment, write_tree,
)
from tests.converters.test_resume import assert_complete, index_fingerprint, shard_files

STORAGES = ["lmdb", "hdf5"]


def _with_file_size_limit(limit: int):
    """A preexec_fn: files the child writes stop at ``limit`` bytes (a write past it fails with
    EFBIG; SIGXFSZ, which would kill it instead, is ignored)."""

    def set_limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return set_limit


# --- SIGKILL or Ctrl-C at 20 random points in a row -----------------------------------------------

KILLS = 20
INTERRUPTED = "fastload: interrupted; run the same command again to resume"


def _stop(proc: subprocess.Popen, how: str) -> None:
    if how == "kill -9":
        proc.kill()
    else:
        proc.send_signal(signal.SIGINT)


def _wait_for_lock(out, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if (out / PACK_LOCK_NAME).read_text() == str(proc.pid):
                return
        except FileNotFoundError:
            pass
        time.sleep(0.001)


def _assert_stopped(proc: subprocess.Popen, how: str, stderr: str, context: object) -> None:
    if how == "kill -9":
        assert proc.returncode == -signal.SIGKILL, context
    else:  # handled, at once (a hang here was a lock left held by Ctrl-C: converters.packing.interrupt)
        assert proc.returncode == 130 and stderr.strip() == INTERRUPTED, (proc.returncode, context)


@pytest.mark.reliability
@pytest.mark.parametrize("how", ["kill -9", "ctrl-c"])
@pytest.mark.parametrize("storage", STORAGES)
def test_stopped_at_20_random_points_in_a_row(tmp_path, storage, how):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    src, out = tmp_path / "src", tmp_path / "out"
    files = many_small_jpegs(src, 3000)
    # The whole pack, uninterrupted, for comparison: ~400 shards, about a second of writing.
    shards = pack(src, tmp_path / "clean", format=storage, shard_size="16KB", progress=False).num_shards
    cmd = fastload_command("pack", src, "-o", out, "--format", storage, "--shard-size", "16KB", "--quiet")
    log = []
    for kill in range(KILLS):
        done = len(shard_files(out, storage))
        if kill < 3:  # while starting up, listing, planning, in the first shards
            # (Ctrl-C's are timed from the lock, below: a short wait reaches the same stages)
            point = ("after", rng.uniform(0.0, 0.4 if how == "kill -9" else 0.05))
        elif kill == KILLS - 1:  # in the last shards, or while the index and manifest are written
            point = ("shards", shards - rng.randint(0, 2), rng.uniform(0.0, 0.005))
        else:  # inside or between shards, at uneven points; never past the end (a finish there)
            point = ("shards", min(done + rng.randint(1, 12), shards - 3), rng.uniform(0.0, 0.01))
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            if how == "ctrl-c":  # from when the pack holds OUT's lock: a Ctrl-C while Python is
                _wait_for_lock(out, proc)  # still starting may be lost in an import callback
            if point[0] == "after":
                time.sleep(point[1])
            else:
                deadline = time.monotonic() + 120
                while len(shard_files(out, storage)) < point[1] and proc.poll() is None:
                    assert time.monotonic() < deadline, f"seed {seed}: the pack made no progress"
                    time.sleep(0.002)
                time.sleep(point[2])
            finished_first = proc.poll() is not None
            _stop(proc, how)
            _, stderr = proc.communicate(timeout=30)
        finally:
            proc.kill()
        log.append((point, len(shard_files(out, storage))))
        context = f"seed {seed}, kill {kill} {point}: {stderr!r} {log}"
        if kill == KILLS - 1 and (out / "manifest.json").exists():
            break  # the stop came after the manifest (at exit): a finished pack, checked below
        assert not finished_first, f"the pack ended first: {context}"
        _assert_stopped(proc, how, stderr, context)
        assert not (out / "manifest.json").exists(), context
    else:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"seed {seed}, kills {log}: {result.stderr}"
        assert "packed 3000 records" in result.stdout

    print(f"seed {seed}: finished shards at each kill: {[n for _, n in log]} of {shards}")
    assert len({n for _, n in log}) >= KILLS // 2, log  # spread over the run, not all at one point
    checked = run_fastload("verify", out)
    assert checked.returncode == 0 and checked.stdout.startswith("OK: 3000 of 3000 records checked"), checked
    assert_complete(out, files)  # every file exactly once, in order, bit-exact; no leftovers
    assert index_fingerprint(out) == index_fingerprint(tmp_path / "clean"), f"seed {seed}"


# --- disk full ------------------------------------------------------------------------------------

def _big_jpeg(extra: int) -> bytes:
    """A valid JPEG made ``extra`` bytes bigger with comment segments (no slow encode)."""
    data = make_jpeg(64, 48, seed=99)
    while extra > 0:
        chunk = min(extra, 60_000)
        data = with_comment(data, "x" * chunk)
        extra -= chunk
    return data


@pytest.mark.parametrize("storage", STORAGES)
def test_disk_full_after_finished_shards_keeps_them_and_the_same_command_finishes(tmp_path, storage):
    """Shards before the failing one are kept; the rerun resumes instead of starting over."""
    src, out = tmp_path / "src", tmp_path / "out"
    files = {f"{i:03d}.jpg": make_jpeg(64, 48, seed=i) for i in range(60)}
    files["040-big.jpg"] = _big_jpeg(400_000)  # a shard of its own, past the file-size limit
    write_tree(src, files)
    argv = ["pack", src, "-o", out, "--format", storage, "--shard-size", "16KB", "--quiet"]
    result = subprocess.run(fastload_command(*argv), capture_output=True, text=True, timeout=120,
                            preexec_fn=_with_file_size_limit(300_000))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"fastload: error: {out}: disk full while writing shard-")
    assert "run the same command again to resume" in result.stderr and "Traceback" not in result.stderr
    assert not (out / "manifest.json").exists()
    kept = len(shard_files(out, storage))
    assert kept >= 3

    result = run_fastload(*argv)
    assert result.returncode == 0, result.stderr
    assert f"resumed: kept {kept} finished shards" in result.stdout
    assert_complete(out, files)


LONG_NAME = "a-photo-with-a-long-descriptive-file-name-" * 2


@pytest.mark.parametrize("storage", STORAGES)
def test_disk_full_while_the_index_is_written_is_a_clear_error(tmp_path, storage):
    """Every shard fits under the limit, the path index column (~120 KB) does not."""
    src, out = tmp_path / "src", tmp_path / "out"
    # 1,200 ~2 KB files (~156 shards of 16 KB) whose ~100-byte paths make a ~120 KB column (3,000
    # short-named files made ~66 KB): 40% of the records to pack, resume and read back
    bases = [make_jpeg(96, 72, seed=k, quality=95) for k in range(12)]
    files = write_tree(src, {f"class_{i % 10:02d}/{LONG_NAME}{i:05d}.jpg":
                             with_comment(bases[i % len(bases)], f"image {i}") for i in range(1200)})
    argv = ["pack", src, "-o", out, "--format", storage, "--shard-size", "16KB", "--quiet"]
    failed = subprocess.run(fastload_command(*argv), capture_output=True, text=True, timeout=300,
                            preexec_fn=_with_file_size_limit(60_000))
    assert len(shard_files(out, storage)) > 100 and (out / "index").is_dir()  # it got that far
    assert not (out / "manifest.json").exists()
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr

    result = run_fastload(*argv)  # the same command, with room: finishes, keeping every shard
    assert result.returncode == 0, result.stderr
    assert "resumed: kept" in result.stdout
    assert_complete(out, files)

    assert failed.stderr.startswith(f"fastload: error: {out}: disk full while writing "), failed.stderr
    assert "run the same command again to resume" in failed.stderr
