"""`fastload bench`, `fastload doctor` and `fastload tune` on tiny data: output, JSON, PNG, errors."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from fastload.benchmark import validate
from tests.conftest import fastload_command, write_tree

# Each run ends at --samples, whatever the machine's speed: the duration is longer than any run takes
# (with 0.3 s, a run on a machine at load 14-20 once ended after one batch of 4).
QUICK = ["--batch-size", "4", "--image-size", "32", "--duration", "300", "--samples", "8"]
BENCH = [*QUICK, "--repeats", "1"]  # one run per row: the repeat tests ask for more
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def flat(text: str) -> str:
    """``text`` with its lines wrapped back together (the report wraps prose at 100 columns)."""
    return " ".join(text.split())


def header(out: str) -> str:
    """The report's header (what ran, on what machine, under what load), unwrapped."""
    return flat(out.split("\n\n", 1)[0])


def table_rows(out: str) -> dict[str, str]:
    """Row name → its line, for the lines of the table (from the header to the first blank line)."""
    lines = out.splitlines()
    start = next(k for k, ln in enumerate(lines) if ln.startswith("run "))
    rows = {}
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows[line.split("  ")[0]] = line
    return rows


def test_bench_folder_and_both_packs_table_json_plot_and_verdict(cli, photos, tmp_path):
    out_json, out_png = tmp_path / "r" / "bench.json", tmp_path / "bench.png"
    result = cli("bench", photos("folder"), "--packed", photos("lmdb"), "--packed", photos("hdf5"), *QUICK,
                 "--repeats", "2", "--no-dali", "--stages", "--json", out_json, "--plot", out_png)
    assert result.rc == 0, result.out + result.err
    assert header(result.out).startswith(f"fastload bench: {photos('folder')}; batches of 4, 32 px train crops")
    assert "per run, 2 runs per row interleaved (median, min–max)" in header(result.out)
    assert "machine load: other processes used " in header(result.out)
    rows = table_rows(result.out)
    assert list(rows) == ["torch ImageFolder, defaults", "torch ImageFolder, tuned w2 pf4",
                          "raw reads: small files", "raw reads: fastload lmdb", "raw reads: fastload hdf5",
                          "fastload lmdb", "fastload lmdb, pixel cache", "fastload hdf5", "fastload hdf5, pixel cache"]
    assert "min–max" in next(ln for ln in result.out.splitlines() if ln.startswith("run "))
    assert "epoch >= 2 of a pixel cache at 37 px: " in " ".join(result.out.split())  # settings lines wrap
    torch_rows = [rows["torch ImageFolder, tuned w2 pf4"], rows["torch ImageFolder, defaults"]]
    assert any(" ref " in row for row in torch_rows)
    # --packed: the verdict is about what the user will run, fastload on the first packed dataset
    assert "\nverdict: " in result.out and "(fastload lmdb) — " in flat(result.out)
    assert "\nstages alone" in result.out and "\nceilings:" in result.out
    assert f"json: {out_json}" in result.out and f"plot: {out_png}" in result.out

    doc = json.loads(out_json.read_text())
    assert validate(doc) == []
    # None: the stage groups' timing rounds overlapped (a busy machine); the text then says so
    assert doc["command"] == "bench" and doc["verdict"]["bottleneck"] in ("io", "cpu", None)
    assert (doc["verdict"]["bottleneck"] is None) == ("verdict: too noisy to name the bottleneck" in result.out)
    assert doc["verdict"]["loader"] == "fastload lmdb" and doc["config"]["repeats"] == 2
    assert doc["config"]["packed"] == [str(photos("lmdb")), str(photos("hdf5"))]
    assert all(r["status"] == "ok" and r["samples"] >= 16 for r in doc["runs"])  # 8+ in each of 2 runs
    for r in doc["runs"]:
        assert len(r["per_repeat"]) == 2 and r["min"] <= r["median"] <= r["max"], r
        assert r["median"] == pytest.approx(r["samples_per_s"])
        assert r["min"] == min(r["per_repeat"]) and r["max"] == max(r["per_repeat"])
    assert {r["source"] for r in doc["runs"]} == {"folder", "lmdb", "hdf5"}
    assert "skipped" not in doc
    png = out_png.read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 10_000


def test_bench_a_folder_alone_packs_it_temporarily(cli, photos, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    result = cli("bench", photos("folder"), *BENCH, "--no-dali", "--work", work, "--torch-workers", "1")
    assert result.rc == 0, result.err
    assert "raw reads: fastload lmdb" in table_rows(result.out)
    assert "into a temporary LMDB dataset" in flat(result.out)
    assert f"`fastload pack {photos('folder')}`" in flat(result.out)
    assert list(work.iterdir()) == []  # removed after the run


def test_bench_a_packed_dataset_finds_its_source_folder(cli, photos):
    result = cli("bench", photos("lmdb"), *BENCH, "--no-dali", "--torch-workers", "1")
    assert result.rc == 0, result.err
    assert "torch ImageFolder, defaults" in table_rows(result.out)
    assert f"baseline: the source folder in the manifest, {photos('folder')}" in flat(result.out)


def test_prefetch_factor_applies_without_torch_workers(cli, photos):
    from fastload.config import available_cpus

    result = cli("bench", photos("lmdb"), *BENCH, "--no-dali", "--prefetch-factor", "2")
    assert result.rc == 0, result.err
    assert f"torch ImageFolder, tuned w{available_cpus()} pf2" in table_rows(result.out)


def test_bench_with_the_dali_row(cli, photos):
    result = cli("bench", photos("lmdb"), *BENCH, "--torch-workers", "1")
    rows = table_rows(result.out)
    dali = rows["fastload lmdb, DALI backend"]
    assert " failed " not in f" {dali} ", dali  # it runs, or is skipped with the reason


def test_doctor_prints_stages_verdict_and_data_wait(cli, photos, tmp_path):
    # Two timed batches of tiny images wait ~2 ms each; the 600 ms step keeps a stall of 100 ms on
    # a loaded CI machine from pushing the wait past the model-bound line (10%).
    result = cli("doctor", photos("folder"), *QUICK, "--num-workers", "0", "--model-step-ms", "600",
                 "--json", tmp_path / "d.json", "--plot", tmp_path / "d.png")
    assert result.rc == 0, result.err
    assert "\nfastload JPEG decode: " in result.out.split("\n\n")[0]
    assert "data wait" in next(ln for ln in result.out.splitlines() if ln.startswith("run "))
    assert "verdict: model-bound" in result.out, result.out
    doc = json.loads((tmp_path / "d.json").read_text())
    assert validate(doc) == [] and doc["command"] == "doctor" and doc["config"]["num_workers"] == 0
    assert [s["name"] for s in doc["stages"]] == ["read", "decode", "transform", "collate"]
    assert (tmp_path / "d.png").read_bytes().startswith(PNG_MAGIC)


def test_doctor_on_a_packed_dataset(cli, photos):
    result = cli("doctor", photos("hdf5"), *QUICK)
    assert result.rc == 0, result.err
    assert "doctor: fastload hdf5" in table_rows(result.out) and "\nverdict: " in result.out


@pytest.mark.parametrize("case", ["missing", "empty folder", "a file", "no images", "packed not a dataset",
                                  "doctor missing"])
def test_a_bad_src_fails_clearly(cli, tmp_path, photos, case):
    src, extra = tmp_path / "nope", []
    expected = f"{src}: no such image folder or packed dataset; check the path"
    command = "doctor" if case == "doctor missing" else "bench"
    if case == "empty folder":
        src = tmp_path / "empty"
        src.mkdir()
        expected = f"{src}: no files with extensions .jpg"
    elif case == "a file":
        src = tmp_path / "x.jpg"
        src.write_bytes(b"x")
        expected = f"{src}: is a file; pass an image folder or a packed dataset"
    elif case == "no images":
        src = tmp_path / "docs"
        write_tree(src, {"a/readme.txt": b"hello"})
        expected = "no files with extensions"
    elif case == "packed not a dataset":
        src = photos("folder")
        extra = ["--packed", tmp_path]
        expected = f"{tmp_path}: is empty, not a packed dataset"
    result = cli(command, src, *extra, *(QUICK if command == "doctor" else BENCH))
    assert result.rc == 2 and result.out == ""
    assert result.err.startswith("fastload: error: ") and expected in result.err
    assert "Traceback" not in result.err


def test_bad_bounds_fail_clearly(cli, photos):
    result = cli("bench", photos("lmdb"), "--duration", "0")
    assert result.rc == 2 and "duration=0.0: must be a positive number of seconds" in result.err
    result = cli("doctor", photos("lmdb"), "--samples", "0")
    assert result.rc == 2 and "samples=0: must be at least 1" in result.err


def test_tune_prints_the_settings_and_the_grid(cli, photos, monkeypatch):
    monkeypatch.setenv("FASTLOAD_CPUS", "1")  # a grid of 4 candidates, each run 3 times
    result = cli("tune", photos("lmdb"), "--batch-size", "4", "--image-size", "32", "--batches", "1")
    assert result.rc == 0, result.err
    assert result.out.startswith("LoaderSettings(mode=") and "\n  tune: " in result.out
    assert "\n  measured: samples/s, the median of 3 runs (slowest–fastest): " in result.out
    assert "\n  machine load: other processes used " in result.out
    result = cli("tune", photos("lmdb"), "--batch-size", "4", "--image-size", "32", "--batches", "1",
                 "--repeats", "2", "--json")
    doc = json.loads(result.out)
    assert doc["mode"] in ("main", "threads", "processes") and "tune" in doc["reasons"]
    assert doc["reasons"]["measured"].startswith("samples/s, the median of 2 runs")  # --repeats reached tune
    missing = cli("tune", photos("folder"))
    assert missing.rc == 2 and "is a folder of images, not a packed dataset; pack it with" in missing.err


def test_ctrl_c_prints_the_partial_table(photos, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    # stderr on a terminal: bench writes its progress line there, so the test sees the first row
    # time a batch before it presses Ctrl-C (a fixed wait could fall before the row had started).
    # PYTHONFAULTHANDLER: if it ever hangs, SIGABRT makes it print every thread's stack.
    terminal, child_end = os.openpty()
    proc = subprocess.Popen(fastload_command("bench", photos("folder"), "--batch-size", "4", "--image-size",
                                             "32", "--duration", "600", "--no-dali", "--work", work),
                            stdout=subprocess.PIPE, stderr=child_end, text=True,
                            env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    os.close(child_end)
    shown = _Terminal(terminal, re.compile(r"\[1/\d+\] [^\r]*, [1-9]\d* samples"))
    if not (shown.event.wait(timeout=240) and shown.found):  # the wait: a guard against a hang
        proc.kill()
        pytest.fail(f"the first row timed no batch (exit {proc.poll()}):\n{shown.text()[-3000:]}")
    proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        out, _ = proc.communicate()
        shown.closed.wait(10)
        pytest.fail(f"no exit within 120 s of Ctrl-C; its threads were:\n{shown.text()[-6000:]}\n{out[-2000:]}")
    shown.closed.wait(10)
    err = shown.text()
    assert proc.returncode == 130, err
    rows = table_rows(out)
    assert list(rows)[0] == "torch ImageFolder, defaults"
    assert re.search(r"^  torch ImageFolder, defaults: .*\[partial: interrupted\]$", out, re.MULTILINE), out
    assert "interrupted: the table holds what was measured before Ctrl-C" in out
    assert "Traceback" not in err and list(Path(work).iterdir()) == []


class _Terminal:
    """Reads what a child writes to a pseudo-terminal, in a thread (a full terminal would stop the
    child); ``found`` once ``pattern`` has shown; ``event`` is set then, or at the end."""

    def __init__(self, fd: int, pattern: re.Pattern[str]) -> None:
        self.fd, self.pattern = fd, pattern
        self.chunks: list[bytes] = []
        self.found = False
        self.event, self.closed = threading.Event(), threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def text(self) -> str:
        return b"".join(self.chunks).decode(errors="replace")

    def _read(self) -> None:
        try:
            while True:
                try:
                    chunk = os.read(self.fd, 65536)
                except OSError:  # EIO: every writer has closed its end
                    break
                if not chunk:
                    break
                self.chunks.append(chunk)
                if not self.found and self.pattern.search(self.text()):
                    self.found = True
                    self.event.set()
        finally:
            os.close(self.fd)
            self.closed.set()
            self.event.set()


def test_cold_bench_and_doctor_drop_the_cache_and_read_once(cli, photos, tmp_path):
    result = cli("bench", photos("folder"), "--packed", photos("lmdb"), *BENCH, "--no-dali", "--cold",
                 "--json", tmp_path / "b.json")
    assert result.rc == 0, result.err
    assert "cold page cache (one pass per row)" in header(result.out)
    doc = json.loads((tmp_path / "b.json").read_text())
    assert validate(doc) == [] and doc["config"]["cold"] is True
    assert doc["ceilings"]["read_cold_mb_s"] > 0 and doc["ceilings"]["disk_sequential_mb_s"] > 0
    assert all(r["status"] == "ok" for r in doc["runs"])
    doctor = cli("doctor", photos("hdf5"), *QUICK, "--cold")
    assert doctor.rc == 0, doctor.err
    assert "cold page cache, one read at a time" in flat(doctor.out)


# --- issue 47: -q as pack takes it, and help that says what an option does --------------------------


@pytest.mark.parametrize("command", ["pack", "bench", "doctor", "tune"])
def test_q_is_quiet_for_every_command_that_shows_progress(command):
    from fastload.cli.parser import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices[command]
    quiet = next(a for a in sub._actions if a.dest == "quiet")
    assert quiet.option_strings == ["-q", "--quiet"]


def test_the_stages_help_says_the_section_appears_only_with_it():
    from fastload.cli.parser import build_parser

    bench = build_parser()._subparsers._group_actions[0].choices["bench"]
    stages = next(a for a in bench._actions if a.dest == "stages")
    assert "always given" not in stages.help and "the verdict drawn from them is printed either way" in stages.help


def test_the_progress_line_fits_one_row_of_the_terminal(capsys, monkeypatch):
    from fastload.benchmark.monitor import Progress

    monkeypatch.setenv("COLUMNS", "60")
    Progress(True).note("x" * 300)
    assert capsys.readouterr().err == "\r\033[K" + "x" * 59
