"""The ``fastload`` command: pack / info / verify, exit codes, messages, and the output folder's rules."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastload.converters.destination.out_dir import prepare_out
from fastload.format import read_manifest
from tests.conftest import (
    REPO, copy_dataset, fastload_command, imagefolder_files, load_manifest_json, make_jpeg, many_small_jpegs, run_fastload,
    run_unprivileged, save_manifest_json, write_tree,
)

STORAGES = ["lmdb", "hdf5"]


def assert_no_dataset(out: Path) -> None:
    assert not (out / "manifest.json").exists()


# --- the happy path -------------------------------------------------------------------------------

@pytest.mark.parametrize("storage", STORAGES)
def test_pack_info_verify(cli, imagefolder, tmp_path, storage):
    src, files = imagefolder
    out = tmp_path / "out"
    result = cli("pack", src, "-o", out, "--format", storage, "--shard-size", "4KB", "--workers", "2")
    assert result.rc == 0, result.err
    assert result.out.startswith(f"packed {len(files)} records (") and f"{storage} shards at {out}" in result.out
    assert result.err == ""  # no progress bar when stderr is not a terminal

    info = cli("info", out)
    assert info.rc == 0
    lines = info.out.splitlines()
    assert lines[0].startswith(f"{out}: {len(files)} records,") and f"{storage} shards" in lines[0]
    assert f"from {src} (imagefolder layout), re-encode: none (bytes copied exactly), skipped: 0" in lines[1]
    assert "  3 classes:" in lines and any(line.split() == ["0", "cat:", "4"] for line in lines)
    assert any(line.split() == ["2", "emu:", "2"] for line in lines)
    assert any(line.startswith("  shard-00000.") for line in lines)

    checked = cli("verify", out)
    assert checked.rc == 0 and checked.out.strip() == (f"OK: {len(files)} of {len(files)} records checked, "
                                                       "0 bad, 0 dataset problems")
    decoded = cli("verify", out, "--decode")
    assert decoded.rc == 0 and "records checked and decoded" in decoded.out


def test_info_json_parses(cli, packed):
    out, files = packed("hdf5")
    result = cli("info", out, "--json")
    assert result.rc == 0
    info = json.loads(result.out)
    assert info["records"] == len(files) and info["storage"] == "hdf5" and info["kind"] == "images"
    assert info["format_version"] == 1 and info["unlabeled"] == 0
    assert [(c["name"], c["label"], c["records"]) for c in info["classes"]] == [
        ("cat", 0, 6), ("dog", 1, 5), ("emu", 2, 4)]
    assert sum(s["records"] for s in info["shards"]) == len(files)
    assert info["payload_bytes"] == sum(len(b) for b in files.values())
    assert info["disk_bytes"] == sum((out / s["file"]).stat().st_size for s in info["shards"])
    assert info["packed"]["reencode"] is None and info["packed"]["layout"] == "imagefolder"


def test_a_reader_that_stops_early_is_no_error(packed):
    """`fastload info ... | head`: the pipe closes before the output is written."""
    out, _ = packed("lmdb")
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before a byte is written: every write meets EPIPE
    try:
        done = subprocess.run(fastload_command("info", out), stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=60, cwd=REPO)
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == ""  # as a shell reports `cat` ended by SIGPIPE


def test_info_shows_unlabeled_records_and_extra_fields(cli, tmp_path):
    write_tree(tmp_path, {"a.jpg": make_jpeg(seed=1), "b.jpg": make_jpeg(seed=2)})
    (tmp_path / "l.csv").write_text("path,score\na.jpg,0.5\nb.jpg,2\n")
    assert cli("pack", tmp_path / "l.csv").rc == 0
    result = cli("info", tmp_path / "l.fl")
    assert "unlabeled records: 2" in result.out and "extra fields: score (float64)" in result.out
    assert json.loads(cli("info", tmp_path / "l.fl", "--json").out)["fields"] == {"score": "float64"}


def test_the_console_script_runs(imagefolder, tmp_path):
    src, files = imagefolder
    script = Path(sys.executable).parent / "fastload"
    assert script.exists(), "the fastload console script is not installed next to this interpreter"
    result = subprocess.run([script, "pack", src, "-o", tmp_path / "out", "--quiet"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0 and f"packed {len(files)} records" in result.stdout
    result = subprocess.run([script, "info", tmp_path / "out", "--json"], capture_output=True, text=True,
                            timeout=120)
    assert json.loads(result.stdout)["records"] == len(files)


# --- where the output goes --------------------------------------------------------------------------

def test_default_output_is_src_fl_next_to_src(cli, imagefolder):
    src, files = imagefolder
    result = cli("pack", f"{src}/")  # a trailing slash does not change the name
    assert result.rc == 0, result.err
    out = src.with_name("images.fl")
    assert f"at {out}" in result.out and read_manifest(out).num_records == len(files)


def test_a_finished_dataset_is_never_overwritten_without_overwrite(cli, imagefolder, tmp_path):
    src, files = imagefolder
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out).rc == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (src / "cat" / "extra.jpg").write_bytes(make_jpeg(seed=50))
    result = cli("pack", src, "-o", out)
    assert result.rc == 2
    assert result.err.strip() == (f"fastload: error: {out}: already holds a finished dataset (packed "
                                  f"from {src}); pass --overwrite to replace it")
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # untouched, byte for byte
    assert cli("pack", src, "-o", out, "--format", "hdf5").rc == 2  # other options do not change that

    result = cli("pack", src, "-o", out, "--overwrite", "--format", "hdf5")
    assert result.rc == 0
    manifest = read_manifest(out)
    assert manifest.num_records == len(files) + 1 and manifest.storage == "hdf5"
    assert not list(out.glob("*.lmdb"))


@pytest.mark.parametrize("case", [
    "src missing", "src empty", "src has only other files", "out inside src", "out is src", "src inside out",
    "out is a file", "out under a file", "out holds other files",
])
def test_bad_locations_fail_clearly_and_write_no_manifest(cli, tmp_path, case):
    src, out = tmp_path / "src", tmp_path / "out"
    write_tree(src, imagefolder_files({"a": 2}))
    expected = {
        "src missing": f"{tmp_path / 'nope'}: no such folder or file list; check the path",
        "src empty": f"{tmp_path / 'empty'}: no files with extensions .jpg, .jpeg, .png",
        "src has only other files": "no files with extensions .jpg, .jpeg, .png, .ppm, .bmp, .pgm, .tif, .tiff, "
                                    ".webp found; it holds 2 files with other extensions; pass --extensions",
        "out inside src": f"{src / 'a' / 'out'}: the output is inside the source folder {src}",
        "out is src": f"{src}: the output is inside the source folder {src}",
        "src inside out": f"{tmp_path}: the source {src} is inside the output folder",
        "out is a file": f"{out}: exists and is not a folder; choose another -o",
        "out under a file": f"{out / 'sub'}: cannot write the output folder (Not a directory)",
        "out holds other files": f"{out}: exists and holds other files (notes.txt, ...)",
    }[case]
    if case == "src missing":
        src = tmp_path / "nope"
    elif case == "src empty":
        src = tmp_path / "empty"
        src.mkdir()
    elif case == "src has only other files":
        src = tmp_path / "docs"
        write_tree(src, {"a.txt": b"x", "b/c.md": b"y"})  # b/ makes it an ImageFolder tree
    elif case == "out inside src":
        out = src / "a" / "out"
    elif case == "out is src":
        out = src
    elif case == "src inside out":
        out = tmp_path
    elif case == "out is a file":
        out.write_text("x")
    elif case == "out under a file":
        out.write_text("x")
        out = out / "sub"
    elif case == "out holds other files":
        write_tree(out, {"notes.txt": b"mine"})
    result = cli("pack", src, "-o", out)
    assert result.rc == 2 and result.out == ""
    assert result.err.startswith("fastload: error: ") and expected in result.err
    assert "Traceback" not in result.err
    assert_no_dataset(out if out.is_dir() else tmp_path)
    assert not (src / "a" / "out").exists() and not (tmp_path / "nope.fl").exists()


@pytest.mark.parametrize("exists", [False, True])
def test_an_unwritable_output_folder_fails_clearly(world_tmp, exists):
    src = world_tmp / "src"
    write_tree(src, imagefolder_files({"a": 2}))
    os.chmod(src / "a", 0o755)
    locked = world_tmp / "locked"
    locked.mkdir(mode=0o755)
    out = locked / "out"
    if exists:
        out.mkdir(mode=0o755)  # there, empty, but owned by someone else
    result = run_unprivileged(["pack", src, "-o", out, "--quiet"])
    assert result.rc == 2
    assert f"fastload: error: {out}: cannot write the output folder (Permission denied); choose another -o" \
           in result.err
    assert not (out / "manifest.json").exists() and not (out / ".pack.lock").exists()


@pytest.mark.parametrize("argv, message", [
    (["--shard-size", "big"], "shard_size: cannot read 'big' as a size"),
    (["--shard-size", "0"], "shard_size: must be positive"),
    (["--quality", "0"], "quality=0: must be between 1 and 100"),
    (["--max-side", "-5"], "max_side=-5: must be a positive number of pixels"),
    (["--workers", "0"], "workers=0: must be at least 1"),
    (["--max-pixels", "0"], "max_pixels=0: must be a positive integer"),
])
def test_bad_option_values_fail_with_exit_2(cli, imagefolder, tmp_path, argv, message):
    src, _ = imagefolder
    result = cli("pack", src, "-o", tmp_path / "out", *argv)
    assert result.rc == 2 and message in result.err
    assert not (tmp_path / "out").exists()


def test_unknown_choices_are_argparse_errors(cli, imagefolder, tmp_path):
    src, _ = imagefolder
    with pytest.raises(SystemExit) as exit_:
        cli("pack", src, "-o", tmp_path / "out", "--format", "zip")
    assert exit_.value.code == 2


# --- re-encode --------------------------------------------------------------------------------------

def test_reencode_options_are_recorded_and_shown(cli, tmp_path):
    write_tree(tmp_path / "src", {"a/big.jpg": make_jpeg(120, 80, seed=1)})
    assert cli("pack", tmp_path / "src", "-o", tmp_path / "out", "--max-side", "60", "--quality", "75").rc == 0
    assert read_manifest(tmp_path / "out").packed["reencode"] == {"max_side": 60, "quality": 75}
    assert "re-encode: {'max_side': 60, 'quality': 75}" in cli("info", tmp_path / "out").out
    assert json.loads(cli("info", tmp_path / "out", "--json").out)["packed"]["reencode"] == {
        "max_side": 60, "quality": 75}
    assert cli("pack", tmp_path / "src", "-o", tmp_path / "q", "--max-side", "60").rc == 0
    assert read_manifest(tmp_path / "q").packed["reencode"] == {"max_side": 60, "quality": 90}


# --- two packs into one folder ------------------------------------------------------------------------

_HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.write(fd, str(os.getpid()).encode())
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_second_pack_into_a_locked_folder_refuses(cli, imagefolder, tmp_path):
    src, files = imagefolder
    out = tmp_path / "out"
    prepare_out(out)  # the folder as the first pack made it (its owner file), before it took the lock
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, out / ".pack.lock"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        result = cli("pack", src, "-o", out)
        assert result.rc == 2
        assert result.err.strip() == (f"fastload: error: {out}: another pack (pid {holder.pid}) is writing "
                                      "here; wait for it to finish or choose another -o")
        assert_no_dataset(out)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert cli("pack", src, "-o", out).rc == 0  # the lock went with its holder
    assert read_manifest(out).num_records == len(files)


def test_overwrite_takes_the_lock_before_deleting_anything(cli, imagefolder, tmp_path):
    src, files = imagefolder
    out = tmp_path / "out"
    assert cli("pack", src, "-o", out).rc == 0
    before = sorted(p.name for p in out.iterdir())
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, out / ".pack.lock"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        # Another shard size: a pack that must replace the dataset (an identical one is "already
        # packed" before any lock is taken, so that it also answers on read-only media).
        result = cli("pack", src, "-o", out, "--overwrite", "--shard-size", "16KB")
        assert result.rc == 2 and f"another pack (pid {holder.pid}) is writing here" in result.err
        # the finished dataset is untouched (the holder made the lock file)
        assert sorted(p.name for p in out.iterdir() if p.name != ".pack.lock") == before
        assert run_fastload("verify", out).returncode == 0
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


@pytest.mark.slow
def test_two_real_packs_at_once(cli, tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    files = many_small_jpegs(src, 1200)
    first = subprocess.Popen(fastload_command("pack", src, "-o", out, "--shard-size", "16KB", "--quiet"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240  # a guard against a hang, not a speed
    while not list(out.glob("shard-*.lmdb")):  # the first pack holds the lock once it writes shards
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read() if first.stderr else ""
        time.sleep(0.002)
    second = cli("pack", src, "-o", out, "--shard-size", "16KB")
    stdout, stderr = first.communicate(timeout=120)
    assert second.rc == 2 and f"another pack (pid {first.pid}) is writing here" in second.err
    assert first.returncode == 0, stderr
    assert f"packed {len(files)} records" in stdout
    assert run_fastload("verify", out).returncode == 0


# --- disk full ------------------------------------------------------------------------------------------

_WITH_FILE_SIZE_LIMIT = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))
from fastload.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("storage", STORAGES)
def test_disk_full_fails_clearly_and_the_same_command_then_finishes(tmp_path, storage):
    src, out = tmp_path / "src", tmp_path / "out"
    files = write_tree(src, {f"{i:02d}.jpg": make_jpeg(200, 150, seed=i, quality=95) for i in range(16)})
    assert sum(len(b) for b in files.values()) > 60_000  # one shard, larger than the limit below
    argv = ["pack", str(src), "-o", str(out), "--format", storage, "--quiet"]
    result = subprocess.run([sys.executable, "-c", _WITH_FILE_SIZE_LIMIT, "40000", *argv],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"fastload: error: {out}: disk full while writing shard-00000.")
    assert "free space or choose another -o, then run the same command again to resume" in result.stderr
    assert "Traceback" not in result.stderr
    assert_no_dataset(out)
    assert not list(out.glob("*.tmp")) and not list(out.glob("shard-*"))

    result = run_fastload(*argv)
    assert result.returncode == 0, result.stderr
    assert run_fastload("verify", out).returncode == 0
    assert read_manifest(out).num_records == len(files)


def test_interrupt_says_how_to_resume(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    many_small_jpegs(src, 600)
    proc = subprocess.Popen(fastload_command("pack", src, "-o", out, "--shard-size", "16KB", "--quiet"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240  # a guard against a hang, not a speed
    while len(list(out.glob("shard-*.lmdb"))) < 3:  # the first ones surely in the journal
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert stderr.strip() == "fastload: interrupted; run the same command again to resume"
    assert_no_dataset(out)
    result = run_fastload("pack", src, "-o", out, "--shard-size", "16KB", "--quiet")
    assert result.returncode == 0 and "resumed: kept" in result.stdout


# --- first-hour messages ---------------------------------------------------------------------------

def test_version_prints_the_version_and_exits_0(cli, capsys):
    from fastload import __version__
    from fastload.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"fastload {__version__}\n"


@pytest.mark.parametrize("command", ["info", "verify"])
def test_info_and_verify_say_what_a_folder_that_is_not_a_dataset_is(cli, imagefolder, packed, tmp_path, command):
    src, _ = imagefolder
    result = cli(command, src)
    assert result.rc == 2 and result.out == ""
    assert result.err == (f"fastload: error: {src}: is a folder of images, not a packed dataset; pack it with "
                          f"`fastload pack {src} -o {src}.fl`\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli(command, empty)
    assert result.rc == 2 and f"{empty}: is empty, not a packed dataset" in result.err
    assert "run the same" not in result.err and "interrupted" not in result.err
    # what a failed pack leaves: shards, no manifest; only this one is told to run pack again
    unfinished = copy_dataset(packed("lmdb")[0], tmp_path / "unfinished")
    (unfinished / "manifest.json").unlink()
    result = cli(command, unfinished)
    assert result.rc == 2 and result.err == (
        f"fastload: error: {unfinished}: holds an unfinished pack (shards, no manifest.json), so it is not "
        "a finished dataset yet; run the same `fastload pack` command again to finish it\n")


def test_info_uses_singular_and_plural_words(cli, tmp_path):
    write_tree(tmp_path / "src", {"a/one.jpg": make_jpeg(seed=1)})
    assert cli("pack", tmp_path / "src", "-o", tmp_path / "out").rc == 0
    lines = cli("info", tmp_path / "out").out.splitlines()
    assert lines[0].startswith(f"{tmp_path / 'out'}: 1 record, ") and " in 1 lmdb shard (" in lines[0]
    assert "  1 class:" in lines and any(ln.startswith("  shard-00000.lmdb: 1 record, ") for ln in lines)
    verified = cli("verify", tmp_path / "out").out
    assert verified == "OK: 1 of 1 record checked, 0 bad, 0 dataset problems\n"


def test_info_prints_odd_values_of_the_free_form_packed_object(cli, packed, tmp_path):
    out = copy_dataset(packed("lmdb")[0], tmp_path / "odd")
    raw = load_manifest_json(out)
    raw["packed"] = {"reencode": "x", "restart_markers": 5, "ignored": [1], "skipped": {"n": 2}}
    save_manifest_json(out, raw)
    result = cli("info", out)
    assert result.rc == 0, result.err
    assert "re-encode: x, skipped: {'n': 2}" in result.out
    assert "JPEGs rewritten losslessly with restart markers (fast crop decode)\n" in result.out
    assert "packed ? by fastload ? from ? (? layout)" in result.out


def test_info_counts_huge_labels_without_allocating_by_value(tmp_path):
    write_tree(tmp_path, {"a.jpg": make_jpeg(seed=1), "b.jpg": make_jpeg(seed=2), "c.jpg": make_jpeg(seed=3)})
    (tmp_path / "l.csv").write_text(f"path,label\na.jpg,{2**40}\nb.jpg,3\nc.jpg,{2**40}\n")
    assert run_fastload("pack", tmp_path / "l.csv", "--quiet").returncode == 0
    # a real process: counting by value asked for 8 TiB and glibc aborted it
    result = run_fastload("info", tmp_path / "l.fl")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "  2 distinct labels (no class names)" in result.stdout
    info = json.loads(run_fastload("info", tmp_path / "l.fl", "--json").stdout)
    assert info["labels"] == 2 and info["classes"] == [] and info["unlabeled"] == 0


def test_max_file_size_skips_larger_files_before_reading_them(cli, tmp_path):
    write_tree(tmp_path / "src", {"a/small.jpg": make_jpeg(seed=1), "a/big.jpg": make_jpeg(400, 300, seed=2)})
    big = (tmp_path / "src" / "a" / "big.jpg").stat().st_size
    result = cli("pack", tmp_path / "src", "-o", tmp_path / "out", "--max-file-size", "3KB")
    assert result.rc == 2 and f"a/big.jpg: {big} bytes is over --max-file-size 3000" in result.err
    result = cli("pack", tmp_path / "src", "-o", tmp_path / "out", "--max-file-size", "3KB", "--on-error", "skip")
    assert result.rc == 0 and read_manifest(tmp_path / "out").num_records == 1
    assert "skipped 1" in result.out + result.err


def test_max_pixels_takes_a_whole_number_written_as_5e8(cli, tmp_path):
    write_tree(tmp_path / "src", {"a/x.jpg": make_jpeg(seed=1)})
    assert cli("pack", tmp_path / "src", "-o", tmp_path / "out", "--max-pixels", "5e8").rc == 0
    result = cli("pack", tmp_path / "src", "-o", tmp_path / "bad", "--max-pixels", "1.5")
    assert result.rc == 2 and "max_pixels=1.5: must be a positive integer" in result.err


# --- help that matches the docs; what info and show say (issue 39, items 3 and 4) ----------------

def test_help_names_every_source_and_pack_takes_one_src(cli, capsys, imagefolder, tmp_path):
    from fastload.cli import _old_spellings
    from fastload.cli.parser import build_parser

    parser = build_parser()
    for words in ("CSV/JSONL file list", ".tar.gz", "brace list", ".parquet", "Hugging Face", "s3://"):
        assert words in " ".join(parser.format_help().split())
    pack_help = " ".join(next(a for a in parser._actions if a.dest == "command").choices["pack"].format_help().split())
    assert "SRC [SRC" not in pack_help and "[-q]" in pack_help and "table}" in pack_help
    # --ray takes no value: SRC after it stays SRC; the address comes from --ray-address (or RAY_ADDRESS)
    args = parser.parse_args(["pack", "--ray", "photos"])
    assert (args.src, args.ray, args.ray_address) == ("photos", True, None)
    args = parser.parse_args(_old_spellings(["pack", "photos", "--ray=auto"]))  # the old spelling still works
    assert (args.src, args.ray, args.ray_address) == ("photos", True, "auto")
    # what follows "--" stays as written, wherever an old --ray=ADDRESS grew the words before it
    assert _old_spellings(["pack", "--ray=auto", "--", "-photos"]) == \
        ["pack", "--ray", "--ray-address", "auto", "--", "-photos"]
    src, files = imagefolder
    done = cli("pack", src, "--ray", "host:6379")
    assert done.rc == 2 and "--ray host:6379: --ray takes no value; give the cluster's address with " \
                           "--ray-address host:6379" in done.err
    done = cli("pack", src, tmp_path / "more")
    assert done.rc == 2 and "fastload pack takes one SRC, got 2" in done.err
    done = cli("pack", src, "-q", "-o", tmp_path / "q.fl", "--layout", "imagefolder", "--on-error", "raise")
    assert done.rc == 0 and done.err == ""
    (tmp_path / "notes.txt").write_text("hi")
    done = cli("pack", tmp_path / "notes.txt")
    assert done.rc == 2 and "notes.txt: not a kind of file fastload packs; SRC is a folder of images" in done.err
    for kind in (".csv/.jsonl file list", ".tar.gz", "Hugging Face", ".parquet", "s3://"):
        assert kind in done.err


def test_info_names_what_was_packed_and_each_version(cli, tmp_path):
    import io
    import tarfile

    import fastload

    tar = tmp_path / "shards" / "one.tar"
    tar.parent.mkdir()
    with tarfile.open(tar, "w") as archive:
        for i in range(3):
            for name, data in ((f"{i}.jpg", make_jpeg(32, 24, seed=i)), (f"{i}.cls", b"1")):
                member = tarfile.TarInfo(name)
                member.size = len(data)
                archive.addfile(member, io.BytesIO(data))
    assert cli("pack", tar, "-o", tmp_path / "t.fl").rc == 0
    info = cli("info", tmp_path / "t.fl").out
    assert f"from {tar} (webdataset layout)" in info and "version" not in info  # the tar, not its folder
    write_tree(tmp_path / "more", {"2.jpg": make_jpeg(32, 24, seed=7), "3.jpg": make_jpeg(32, 24, seed=8)})
    assert cli("pack", tmp_path / "more", "-o", tmp_path / "t.fl", "--append").rc == 0
    lines = cli("info", tmp_path / "t.fl").out.splitlines()
    assert lines[1].startswith("  version 2, last written by fastload ")
    assert lines[2].startswith("    v1 ") and lines[2].endswith(f": 3 records from {tar}")
    assert lines[3].startswith("    v2 ") and lines[3].endswith(f": 2 records from {tmp_path / 'more'}")
    with fastload.Writer(tmp_path / "w.fl") as writer:  # pixels given: encoded here, as PNG
        writer.write({"image": make_jpeg(16, 16, seed=1), "label": 0})
        writer.write({"image": fastload.PackedDataset(tmp_path / "t.fl", image_size=8, train=True)[0][0], "label": 1})
    info = cli("info", tmp_path / "w.fl").out
    assert "re-encode: none (1 image given as pixels encoded to PNG, lossless; bytes given stored exactly)" in info


def test_show_prints_a_record_and_writes_its_image(cli, tmp_path, monkeypatch):
    import fastload

    with fastload.Writer(tmp_path / "d.fl", classes=["cat", "dog"]) as writer:
        for i in range(3):
            writer.write({"image": make_jpeg(40, 30, seed=i), "label": i % 2, "caption": f"photo {i}",
                          "boxes": [[1.0, 2.0, 3.0, 4.0]]})
    monkeypatch.chdir(tmp_path)
    done = cli("show", tmp_path / "d.fl", "-1")
    assert done.rc == 0, done.err
    assert done.out.splitlines()[:4] == [f"{tmp_path / 'd.fl'} record 2 of 3:", "  path: 00000002",
                                         "  label: 0 (cat)", "  image: 40x30, " + done.out.split("40x30, ")[1]
                                         .splitlines()[0]]
    assert "  caption (str): 'photo 2'" in done.out and "boxes (float64[*,4]): [[1., 2., 3., 4.]]" in done.out
    assert (tmp_path / "record-2.jpg").read_bytes() == make_jpeg(40, 30, seed=2)
    assert cli("show", tmp_path / "d.fl", "1", "-o", tmp_path / "one.jpg").rc == 0
    assert (tmp_path / "one.jpg").read_bytes() == make_jpeg(40, 30, seed=1)
    done = cli("show", tmp_path / "d.fl", "3")
    assert done.rc == 2 and "record 3 is out of range: the dataset holds 3 records (0..2, or -1 for the last)" in done.err
