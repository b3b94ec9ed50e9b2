"""The report's JSON schema, its validator, and the text table."""

from __future__ import annotations

import copy
import json
import math

from fastload.benchmark.report import SCHEMA, SCHEMA_ID, BenchReport, validate
from fastload.benchmark.runs import RunResult
from fastload.benchmark.stages import Stage
from fastload.benchmark.verdict import Evidence, diagnose


def made_report() -> BenchReport:
    config = {"source": "imgs", "packed": ["imgs.fl"], "batch_size": 8, "image_size": 32,
              "duration_s": 1.0, "samples": None, "cold": False, "model_step_ms": None,
              "model_step_callable": False}
    runs = [RunResult("torch defaults", "baseline", "folder", samples=80, batches=10, seconds=1.0,
                      samples_per_s=80.0, mb_per_s=2.0, settings="num_workers=0"),
            RunResult("files raw", "raw", "folder", samples=800, batches=100, seconds=1.0,
                      samples_per_s=800.0, mb_per_s=20.0),
            RunResult("lmdb raw", "raw", "lmdb", samples=1600, batches=200, seconds=1.0,
                      samples_per_s=1600.0, mb_per_s=40.0),
            RunResult("fastload lmdb", "fastload", "lmdb", samples=160, batches=20, seconds=1.0,
                      samples_per_s=160.0, mb_per_s=4.0),
            RunResult("dali", "dali", "lmdb", status="skipped", note="ImportError: no DALI")]
    stages = [Stage("read", "io", 1e-4, 2), Stage("decode", "cpu", 2e-3, 2), Stage("collate", "cpu", 0.0, 2)]
    report = BenchReport("bench", config, runs, stages=stages,
                         ceilings={"decode_per_core": 300.0, "cores": 2, "decode_ceiling": 600.0,
                                   "decode_all_cores_measured": 550.0, "decode_reduced_per_core": None,
                                   "memcpy_mb_s": 9000.0, "read_warm_mb_s": 500.0, "read_cold_mb_s": None,
                                   "disk_sequential_mb_s": None, "h2d_pinned_mb_s": None,
                                   "h2d_pageable_mb_s": None},
                         verdict=diagnose(Evidence(stages, 2, 8)), notes=["a note"])
    report.compute_speedups()
    return report


def test_speedups_are_against_the_best_torch_row_and_the_small_file_reads():
    report = made_report()
    assert report.reference == {"pipeline": "torch defaults", "raw": "files raw"}
    by_name = {r.name: r for r in report.runs}
    assert by_name["fastload lmdb"].speedup == 2.0 and by_name["lmdb raw"].speedup == 2.0
    assert by_name["torch defaults"].speedup == 1.0 and by_name["dali"].speedup is None


def test_a_report_is_valid_json_against_its_schema():
    doc = json.loads(json.dumps(made_report().to_dict()))
    assert validate(doc) == []
    assert doc["schema"] == SCHEMA_ID and doc["verdict"]["bottleneck"] == "cpu"
    assert doc["stages"][2]["samples_per_s"] is None  # a free stage: infinity is not JSON


def test_the_validator_finds_what_is_wrong():
    doc = made_report().to_dict()
    bad = copy.deepcopy(doc)
    del bad["machine"]["cores"]
    bad["runs"][0]["status"] = "great"
    bad["runs"][1]["samples"] = 1.5
    bad["verdict"]["mood"] = "fine"
    bad["config"]["extra_is_fine"] = 1
    problems = validate(bad)
    assert "$.machine: missing 'cores'" in problems
    assert any(p.startswith("$.runs[0].status: 'great' is not one of") for p in problems)
    assert any(p.startswith("$.runs[1].samples: expected integer") for p in problems)
    assert "$.verdict: unexpected key 'mood'" in problems
    assert len(problems) == 4
    assert validate({**doc, "ceilings": None}) == []
    assert validate({**doc, "created": math.nan}) != []
    # Documents written before machine.jpeg_decoder existed are still valid; a wrong type is not.
    machine = {k: v for k, v in doc["machine"].items() if k != "jpeg_decoder"}
    assert "jpeg_decoder" in doc["machine"] and validate({**doc, "machine": machine}) == []
    assert validate({**doc, "machine": {**machine, "jpeg_decoder": 3}}) != []
    assert SCHEMA["properties"]["schema"]["enum"] == [SCHEMA_ID]


def test_the_table_shows_rows_references_skips_and_the_verdict():
    text = made_report().table()
    lines = text.splitlines()
    header = next(ln for ln in lines if ln.startswith("run "))
    assert header.split()[:5] == ["run", "samples/s", "MB/s", "×", "ref"]
    assert any(ln.startswith("torch defaults") and " ref " in f"{ln} " for ln in lines)
    assert any(ln.startswith("fastload lmdb") and "2.00x" in ln for ln in lines)
    assert any(ln.startswith("dali ") and ln.split()[1] == "skipped" for ln in lines)
    assert "\n  dali: skipped: ImportError: no DALI\n" in text  # why, under the table
    assert "\n  torch defaults: num_workers=0\n" in text
    assert "verdict: CPU-decode-bound" in text and "note: a note" in text
    assert "full-size JPEG decode 300/s per core × 2 cores = 600/s" in text
    markdown = made_report().table(markdown=True).splitlines()
    assert any(ln.startswith("| fastload lmdb | 160 | 4.0 | 2.00x |") for ln in markdown)


DALI_HINT = ("MissingDependencyError: the DALI backend needs the nvidia-dali-cuda120 package, which is not "
             "importable here (No module named 'nvidia'); install it: pip install nvidia-dali-cuda120 (or pip "
             "install -e '.[dali]' in fastload's clone (the fastload-torch distribution)); it runs on CUDA 12 "
             "drivers; without a GPU, its CPU operators still run the same pipeline here")


def test_every_line_fits_a_terminal_and_a_skipped_rows_hint_goes_below_the_table():
    """Issue 47 item 7: a skipped DALI row once put its 355-character install hint in a cell."""
    from fastload.benchmark.machine_load import MachineLoad
    from fastload.benchmark.text import WIDTH
    from fastload.benchmark.training import Headspace

    report = made_report()
    report.config.update(repeats=3, model_step_ms=50.0)
    report.runs[-1].note = DALI_HINT
    report.runs.append(RunResult("raw reads: hdf5 shards, store, s3torchconnector ranged", "raw", "hdf5",
                                 samples=800, batches=100, seconds=1.0, samples_per_s=812345.0, mb_per_s=12345.6,
                                 min=700000.0, max=900000.0, wait_fraction=0.5, peak_rss_mb=12345.0,
                                 settings="16 reads in flight, " * 8))
    report.headspace = Headspace("resnet18 (float32, cpu)", "cpu", 123.0, 520.0, 3)
    report.load = MachineLoad(cores=2, seconds=30.0, others_cores=1.2, steal_cores=0.0, own_cores=0.8,
                              load_average=9.5, machine_cores=2)
    report.compute_speedups()
    text = report.table()
    too_wide = [ln for ln in text.splitlines() if len(ln) > WIDTH]
    assert not too_wide, too_wide
    assert len(DALI_HINT) > 300 and DALI_HINT in " ".join(text.split())  # whole, in the lines below
    table = text.split("\n\n")[1].splitlines()
    assert table[0].startswith("run ") and "settings" not in table[0]
    assert not any("pip install" in ln for ln in table)
    assert any(ln.startswith("raw reads:") for ln in table)  # a long name wraps in its column
    assert any(ln.startswith("  ") and ln.strip().endswith("ranged") for ln in table)
    assert "machine load: other processes used 1.2 of the 2 cores" in " ".join(text.split())


def test_stage_timings_show_their_spread_and_the_load_goes_into_the_json():
    from fastload.benchmark.machine_load import MachineLoad

    report = made_report()
    report.stages[1].low, report.stages[1].high = 1.5e-3, 2.5e-3
    report.load = MachineLoad(cores=2, seconds=3.0, others_cores=0.1, steal_cores=0.0, own_cores=1.5,
                              load_average=0.4, machine_cores=2)
    text = report.table()
    decode = next(ln for ln in text.splitlines() if ln.startswith("  decode "))
    assert "2.000 (1.500–2.500)" in decode
    flat = " ".join(text.split())
    assert "a busy machine" not in flat and "(5%) during the 3 s measured; load average 0.4 on 2 cores" in flat
    doc = json.loads(json.dumps(report.to_dict()))
    assert validate(doc) == [] and doc["load"]["busy"] is False and doc["load"]["others_cores"] == 0.1
    assert doc["stages"][1]["low"] == 1.5e-3 and doc["stages"][0]["low"] is None


def test_the_table_json_and_plot_show_the_median_and_range_of_repeats(tmp_path):
    from fastload.benchmark.plot import _panels

    report = made_report()
    report.config["repeats"] = 3
    lmdb = next(r for r in report.runs if r.name == "fastload lmdb")
    lmdb.median, lmdb.min, lmdb.max, lmdb.per_repeat = 160.0, 1105.0 / 10, 283.32, [110.5, 160.0, 283.32]
    header = next(ln for ln in report.table().splitlines() if ln.startswith("run "))
    assert header.split()[:3] == ["run", "samples/s", "min–max"]
    assert any(ln.startswith("fastload lmdb") and " 160  110–283 " in ln for ln in report.table().splitlines())
    doc = json.loads(json.dumps(report.to_dict()))
    assert validate(doc) == [] and doc["config"]["repeats"] == 3
    assert {k: doc["runs"][3][k] for k in ("median", "min", "max")} == {"median": 160.0, "min": 110.5,
                                                                         "max": 283.32}
    bars = {b[0]: b for panel in _panels(report) for b in panel[1]}
    assert bars["fastload lmdb"][1:] == (160.0, "fastload", (110.5, 283.32))
    bad = copy.deepcopy(doc)
    bad["runs"][3]["median"] = "fast"
    assert any(p.startswith("$.runs[3].median: expected number") for p in validate(bad))
