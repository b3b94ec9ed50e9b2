"""bench/README.md's current figures are the table bench/results_table.py makes from
bench/results/*.json: a result added without running the script fails here (issue 39, item 8)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tests.conftest import REPO


def _script():
    spec = importlib.util.spec_from_file_location("results_table", REPO / "bench" / "results_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_table_is_the_one_the_result_files_make():
    script = _script()
    text = (REPO / "bench" / "README.md").read_text()
    assert script.replace_block(text, script.block()) == text, (
        "bench/README.md's results table is out of date with bench/results/*.json: "
        "run python bench/results_table.py")


def test_every_current_run_has_its_figures_read():
    table = _script().table()
    assert "see the file" not in table, f"a benchmark without a reader in bench/results_table.py:\n{table}"


def test_a_benchmark_shows_its_newest_date_one_run_a_label(tmp_path: Path):
    script = _script()
    for name in ("load-2026-11-21-aaaaaaa", "load-2026-11-25-bbbbbbb", "gpu-2026-11-28-ccccccc-h200-small",
                 "gpu-2026-11-28-ccccccc-h200-resnet50", "gpu-2026-11-25-ddddddd-h100", "remote-2026-11-26-eeeeeee-cold"):
        (tmp_path / f"{name}.json").write_text("{}")
    (tmp_path / "pack.json").write_text(json.dumps({"created": "2026-11-21T11:18:25+00:00"}))
    runs = {(bench, date, path.name) for bench, date, _, path in script.current_runs(tmp_path)}
    assert runs == {("load", "2026-11-25", "load-2026-11-25-bbbbbbb.json"),
                    ("gpu", "2026-11-28", "gpu-2026-11-28-ccccccc-h200-small.json"),
                    ("gpu", "2026-11-28", "gpu-2026-11-28-ccccccc-h200-resnet50.json"),
                    ("remote", "2026-11-26", "remote-2026-11-26-eeeeeee-cold.json"),
                    ("pack", "2026-11-21", "pack.json")}
