"""The pixel cache in the commands (issue 45, item 6): ``fastload info`` estimates what it stores an
image, ``fastload doctor`` advises it when decode bounds the loader (with the disk it takes and
whether its disk has room), ``fastload bench`` has its row (see tests/benchmark/test_cli_bench.py);
and bench/pixel_cache_bench.py runs, tiny."""

from __future__ import annotations

import importlib.util
import json

from fastload import PackedDataset
from fastload.benchmark.pixel_row import pixel_cache_advice, pixel_cache_need
from fastload.benchmark.verdict import Evidence, diagnose
from fastload.pixels.layout import ALIGN, index_bytes, stored_size
from tests.benchmark.test_verdict import stages
from tests.conftest import REPO
from tests.pixels.conftest import RECORDS


def stored_total(ds: PackedDataset, side: int) -> int:
    """Each image's planes (Y at the stored size, Cb and Cr at half of it, rounded up), aligned."""
    sizes = [stored_size(int(w), int(h), side) for w, h in zip(ds.index.width, ds.index.height)]
    each = [-(-(w * h + 2 * ((w + 1) // 2) * ((h + 1) // 2)) // ALIGN) * ALIGN for w, h in sizes]
    return index_bytes(len(each)) + sum(each)


def test_info_estimates_the_cache_from_the_image_sizes(cli, photos):
    want = stored_total(PackedDataset(photos), 256)
    info = json.loads(cli("info", photos, "--json").out)["pixel_cache"]
    assert info == {"image_size": 224, "side": 256, "bytes": want, "bytes_per_image": want / RECORDS}
    text = cli("info", photos).out
    assert "pixel cache (pixel_cache=True, 224 px crops): " in text and "an image at 256 px" in text


def test_doctor_advises_the_cache_with_its_size_when_decode_bounds(photos, tmp_path):
    need = pixel_cache_need(PackedDataset(photos), 224)
    assert need is not None and need[0] == stored_total(PackedDataset(photos), 256) and need[2] == 256
    verdict = diagnose(Evidence(stages(decode=8e-3), cores=2, batch_size=64, source="packed",
                                reduced_decode=True, pixel_cache=need))
    advice = [a for a in verdict.advice if "pixel_cache=True" in a]
    assert verdict.bottleneck == "cpu" and len(advice) == 1 and "free" in advice[0] and "256 px" in advice[0]
    tight = pixel_cache_advice((10**12, 10**9, 256))
    assert "only 1.00 GB free" in tight and "pixel_cache_limit=" in tight
    io_bound = diagnose(Evidence(stages(read=20e-3), cores=2, batch_size=64, source="packed", pixel_cache=need))
    assert not any("pixel_cache" in a for a in io_bound.advice)  # decode is not what bounds it
    assert pixel_cache_need(PackedDataset(photos, image_size=224, train=True, pixel_cache=tmp_path), 224) is None


def test_the_benchmark_script_runs_on_a_tiny_pack(photos, tmp_path):
    spec = importlib.util.spec_from_file_location("pixel_cache_bench", REPO / "bench" / "pixel_cache_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "result.json"
    assert bench.main([str(photos), "--work", str(tmp_path / "work"), "--repeats", "1", "--batch-size", "8",
                       "--quality-records", "6", "--no-memory", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {row: len(runs) for row, runs in result["runs"].items()} == {"jpeg": 1, "fill": 1, "cache": 1}
    assert result["runs"]["cache"][0]["samples"] == RECORDS and result["val_difference"]["mean_abs_levels"] < 1.5
    assert result["disk"]["cache_bytes_per_image"] > 0 and result["fill_ms_per_image"]["fill_write"] > 0
