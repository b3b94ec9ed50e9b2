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
    assert any(ln.startswith("torch defaults") and " ref " in ln for ln in lines)
    assert any(ln.startswith("fastload lmdb") and "2.00x" in ln for ln in lines)
    assert any(ln.startswith("dali") and "skipped" in ln and "ImportError: no DALI" in ln for ln in lines)
    assert "verdict: CPU-decode-bound" in text and "note: a note" in text
    assert "full-size JPEG decode 300/s per core × 2 cores = 600/s" in text
    markdown = made_report().table(markdown=True).splitlines()
    assert any(ln.startswith("| fastload lmdb | 160 | 4.0 | 2.00x |") for ln in markdown)


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
