"""The current figures: one table made from ``bench/results/*.json``, written between the markers
in ``bench/README.md``.

A run is current when it is its benchmark's newest: a file ``<bench>-<YYYY-MM-DD>-<commit>[-<label>].json``
is dated by its name, a file without a date (``pack.json``) by the date inside it, or not at all.
The rows: on each benchmark's newest date, the newest run of each label (``h200-small``,
``train-a``: a run's parts, or an A/B pair); older runs are in ``bench/HISTORY.md``. Each row's figures are read from the file by the
benchmark's own reader below; a benchmark without one shows its file alone.

    python bench/results_table.py            # rewrite the block in bench/README.md
    python bench/results_table.py --check    # exit 1 when the block is not the JSON files' table
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
README = BENCH / "README.md"
BEGIN = "<!-- results table: made by bench/results_table.py from bench/results/*.json; do not edit -->"
END = "<!-- end of results table -->"

_NAME = re.compile(r"^(?P<bench>.+?)-(?P<date>\d{4}-\d{2}-\d{2})(?:-(?P<rest>.+))?$")
_DATE_FIELDS = ("created", "date", "when", "started")


def _rate(value: float) -> str:
    return f"{value:,.0f}/s"


def _x(value: float) -> str:
    return f"{value:.2f}×"


def _median(values: list[float]) -> float:
    return statistics.median(values)


# --- each benchmark's figures, read from its JSON ------------------------------------------------

def _gpu(data: dict[str, Any]) -> str:
    model = data["args"].get("model", "resnet18-shaped")
    parts = []
    for step, rows in data["medians"].items():
        label = "data only" if step.startswith("data") else f"{model} step"
        rates = ", ".join(f"{_short(name)} {_rate(row['samples_per_s'])}" for name, row in rows.items())
        parts.append(f"{label}: {rates}")
    cut = " (cut short: the rows measured before the end)" if data.get("complete") is False else ""
    return f"{data['device']}, {data['cores']} cores{cut}; " + "; ".join(parts)


def _short(name: str) -> str:
    return (name.replace("fastload, device='cuda', ", "fastload ").replace("headspace: the step on a batch on the GPU",
                                                                          "step alone"))


def _nvimgcodec_profile(data: dict[str, Any]) -> str:
    return f"{data['device']}; decode alone: " + ", ".join(
        f"{name} {_rate(v['decode_alone_samples_per_s'])}" for name, v in data["variants"].items())


def _nvimgcodec_parent(data: dict[str, Any]) -> str:
    before, after = data["medians"]["before"], data["medians"]["after"]
    return (f"the training process's CPU a batch of {data['args']['batch_size']} for the GPU's share: read + plan "
            f"there {before['parent_ms']:.2f} ms, planned parts from {data['args']['workers']} workers "
            f"{after['parent_ms']:.2f} ms ({_x(data['after_over_before'])}; of which freeing their shared memory "
            f"{after['free_ms']:.2f} ms); the workers' CPU {after['workers_ms']:.1f} ms" + _pooled(data))


def _pooled(data: dict[str, Any]) -> str:
    """The pooled row (payload slots reused), in the runs that have one."""
    if "pooled" not in data["medians"]:
        return ""
    pooled = data["medians"]["pooled"]
    return (f"; in reused payload slots {pooled['parent_ms']:.2f} ms ({_x(data['pooled_over_after'])} the fresh "
            f"buffers; freeing {pooled['free_ms']:.2f} ms), the workers' {pooled['workers_ms']:.1f} ms")


def _loader_runs(runs: list[dict[str, Any]]) -> str:
    """The best torch row against the best fastload row of a loader comparison."""
    def best(prefix: str) -> dict[str, Any] | None:
        rows = [r for r in runs if r["name"].startswith(prefix) and r.get("samples_per_s")]
        return max(rows, key=lambda r: r["samples_per_s"], default=None)

    torch, ours = best("torch"), best("fastload")
    if torch is None or ours is None:
        return ", ".join(f"{r['name']} {_rate(r['samples_per_s'])}" for r in runs if r.get("samples_per_s"))
    return (f"{torch['name']} {_rate(torch['samples_per_s'])}; {ours['name']} {_rate(ours['samples_per_s'])} "
            f"({_x(ours['samples_per_s'] / torch['samples_per_s'])} the torch row)")


def _load(data: dict[str, Any]) -> str:
    runs = data["warm"]["runs"] if "warm" in data else data["runs"]
    met = [t for t in data.get("targets", []) if t.get("met") is not None]
    targets = f"; targets met {sum(t['met'] for t in met)} of {len(met)}" if met else ""
    return _loader_runs(runs) + targets


def _named_runs(data: dict[str, Any]) -> str:
    return ", ".join(f"{r['name']} {_rate(r['samples_per_s'])}" for r in data["runs"] if r.get("samples_per_s"))


def _ratios(data: dict[str, Any], at_most: int = 3) -> str:
    return "; ".join(f"{name}: {_x(value)}" for name, value in list(data["ratios"].items())[:at_most])


def _pack(data: dict[str, Any]) -> str:
    return ", ".join(f"{name} {row['median_s']:.2f} s" for name, row in data["results"].items())


def _ray_pack(data: dict[str, Any]) -> str:
    return ", ".join(f"{row['what']}: first {row['seconds']:.2f} s, later {row['warm_seconds']:.2f} s"
                     for row in data["rows"].values())


def _ray_finalize(data: dict[str, Any]) -> str:
    return (f"{data['records']:,} records from {data['tasks']:,} tasks: {data['seconds']:.2f} s, "
            f"peak RSS {data['peak_rss_mb']:.0f} MB")


def _ray_task_cost(data: dict[str, Any]) -> str:
    return ", ".join(f"{name} {row['seconds']:.2f} s" for name, row in data["rows"].items())


def _ray_decode(data: dict[str, Any]) -> str:
    ray, threads = data["medians"]["ray"], data["medians"]["threads"]
    raylet = ray.get("head_raylet_cpu_ms_per_sample")
    machine = data.get("ray_over_threads_machine_cpu_per_sample")
    if machine is None and raylet is not None:  # runs before the threads row's raylet was measured
        machine = (ray["cpu_ms_per_sample"] + raylet) / threads["cpu_ms_per_sample"]
    with_raylet = "" if machine is None else (
        f"; with the head raylet that pulls the batches ({raylet:.3f} ms), {_x(machine)}"
        + (": over the target" if machine > data.get("target_ray_over_threads_cpu_per_sample", 0.15) else ""))
    return (f"the training process's CPU per sample: ray {ray['cpu_ms_per_sample']:.2f} ms, threads "
            f"{threads['cpu_ms_per_sample']:.2f} ms ({_x(data['ray_over_threads_cpu_per_sample'])}, target "
            f"≤ 0.15×){with_raylet}; ray {_rate(ray['samples_per_s'])}, threads {_rate(threads['samples_per_s'])}")


def _ray_elastic(data: dict[str, Any]) -> str:
    return "; ".join(f"step {step} ms: elastic ended at {row['elastic_actors']} actors (fixed rows: {row['needed']} "
                     f"needed), {_rate(row['elastic_samples_per_s'])} against {_rate(row['fixed_needed_samples_per_s'])}"
                     for step, row in data["summary"].items())


def _records_per_s(data: dict[str, Any]) -> str:
    return ", ".join(f"{name} {_rate(row['records_per_s'])}" for name, row in data["results"].items())


def _store_sources(data: dict[str, Any]) -> str:
    return ", ".join(f"{row['row']} {_rate(row['records/s'])}" for row in data["rows"])


def _restarts(data: dict[str, Any]) -> str:
    return f"train crops with restart markers: {_x(data['speedup_median'])} as fast as plain JPEGs"


def _crops(data: dict[str, Any]) -> str:
    return ", ".join(f"{name} {_median(ms):.2f} ms" for name, ms in data["ms_per_sample"].items()) + " a sample"


def _pixel_cache(data: dict[str, Any]) -> str:
    rate = {row: _median([r["samples_per_s"] for r in runs]) for row, runs in data["runs"].items()}
    s = data["summary"]
    text = (f"epoch ≥ 2: pixel cache {_rate(rate['cache'])}, JPEG path {_rate(rate['jpeg'])} "
            f"({_x(s['cache_over_jpeg_samples_per_s'])}; per CPU-second {_x(s['cache_over_jpeg_samples_per_cpu_s'])}); "
            f"epoch 1 filling it: {_x(s['fill_cpu_over_jpeg_epoch_cpu'])} the CPU; "
            f"{data['disk']['cache_bytes_per_image'] / 1e3:.0f} KB an image; "
            f"val crops {data['val_difference']['mean_abs_levels']:.2f} levels apart")
    ffcv = data.get("ffcv")
    return text + (f"; FFCV RAW fields at the same size: the cache {_x(ffcv['cache_over_ffcv_samples_per_s'])} "
                   f"their samples/s, peak RSS {ffcv['peak_rss_mb']['cache']:,.0f} MB against "
                   f"{ffcv['peak_rss_mb']['ffcv']:,.0f}" if ffcv else "")


def _litdata(data: dict[str, Any]) -> str:
    return f"{data['competitor']}: " + ", ".join(f"{row['name']} {_rate(row['rate'])}" for row in data["rows"])


def _client(data: dict[str, Any]) -> str:
    row = data["rows"]["import + client"]
    return "memory added by import + client: " + ", ".join(f"{c} {v['added_mb']:.0f} MB" for c, v in row.items())


def _threads(data: dict[str, Any]) -> str:
    parts = []
    for dataset in data["datasets"]:
        auto = next((row for row in dataset["summary"] if row["row"] == "auto"), None)
        if auto is not None:
            parts.append(f"{dataset['storage']}: auto {_rate(auto['median_samples_per_s'])} "
                         f"({auto['median_x_best_explicit']:.0%} of the best explicit)")
    return "; ".join(parts)


def _proxy_cost(data: dict[str, Any]) -> str:
    return "CPU s per 1000 requests: " + ", ".join(
        f"{name} {row['cpu_s_per_1000_requests']:.2f}" for name, row in data["report"].items())


def _parent_cost(data: dict[str, Any]) -> str:
    return "parent CPU a batch: " + ", ".join(
        f"{name} {row['parent_ms']:.1f} ms (caps at {_rate(row['cap_parent'])})" for name, row in data["medians"].items())


READERS: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {  # in the table's order
    "load": ("loading, 2 cores", _load),
    "load-cold-lmdb-readahead": ("cold LMDB reads", _load),
    "threads": ("decode threads", _threads),
    "threads-shared": ("decode threads, shared cores", _threads),
    "crops": ("crop decode", _crops),
    "restarts": ("restart markers", _restarts),
    "pixel-cache": ("decode once: the pixel cache", _pixel_cache),
    "transform": ("your augmentations", _named_runs),
    "fields": ("samples with fields", _named_runs),
    "gpu": ("a real GPU fed", _gpu),
    "nvimgcodec-profile": ("GPU decode stages", _nvimgcodec_profile),
    "nvimgcodec-parent": ("GPU decode: the training process's CPU", _nvimgcodec_parent),
    "parent-cost": ("the training process's CPU, processes mode", _parent_cost),
    "pack": ("packing 10,000 photos", _pack),
    "sources": ("packing each way in", _records_per_s),
    "writer": ("writing from Python", _records_per_s),
    "store_sources": ("packing from a store", _store_sources),
    "ray-pack": ("packing on Ray", _ray_pack),
    "ray-task-cost": ("a Ray task's cost", _ray_task_cost),
    "ray-finalize": ("Ray finalize", _ray_finalize),
    "ray-decode": ("decoding on Ray", _ray_decode),
    "ray-elastic": ("elastic decode actors", _ray_elastic),
    "remote": ("far storage", _ratios),
    "remote-cli": ("`fastload bench` on a store", lambda d: _loader_runs(d["runs"])),
    "litdata": ("against LitData", _litdata),
    "client": ("store clients", _client),
    "proxy-cost": ("the test bed's cost", _proxy_cost),
}


# --- which runs are current ------------------------------------------------------------------------

def _describe(path: Path) -> tuple[str, str, str]:
    """(benchmark, date or "", commit and label) of a result file, from its name or its contents."""
    match = _NAME.match(path.stem)
    if match:
        return match["bench"], match["date"], match["rest"] or ""
    data = json.loads(path.read_text())
    found = next((str(data[f]) for f in _DATE_FIELDS if isinstance(data.get(f), str)), "")
    return path.stem, found[:10] if re.match(r"\d{4}-\d{2}-\d{2}", found) else "", ""


def _label(rest: str) -> str:
    """A run's label without its commit: ``4138d3c-h200-small`` → ``h200-small``."""
    return "-".join(part for part in rest.split("-") if not re.fullmatch(r"[0-9a-f]{7,40}", part))


def _added_order(results: Path) -> dict[str, int]:
    """Each committed result file's commit time (when git can tell): orders the runs of one day."""
    try:
        log = subprocess.run(["git", "log", "--diff-filter=A", "--name-only", "--format=@%ct", "--", "."],
                             cwd=results, capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    added: dict[str, int] = {}
    when = 0
    for line in log.splitlines():
        if line.startswith("@"):
            when = int(line[1:])
        elif line.strip():
            added.setdefault(Path(line).name, when)  # newest first: a file added again keeps its last add
    return added


def current_runs(results: Path = RESULTS) -> list[tuple[str, str, str, Path]]:
    """The newest run of each benchmark and label, on the benchmark's newest date; in READERS' order.

    Runs of one day and label (a benchmark re-run after a fix) are told apart by when git added
    them; a file git does not have yet is the newest."""
    runs = [(*_describe(path), path) for path in sorted(results.glob("*.json"))]
    added = _added_order(results)
    newest_date: dict[str, str] = {}
    for bench, date, _, _ in runs:
        newest_date[bench] = max(newest_date.get(bench, ""), date)
    newest: dict[tuple[str, str], tuple[str, str, str, Path]] = {}
    for run in runs:
        bench, date, rest, path = run
        if date != newest_date[bench]:
            continue
        key = (bench, _label(rest))
        order = (added.get(path.name, sys.maxsize), path.name)
        if key not in newest or order > (added.get(newest[key][3].name, sys.maxsize), newest[key][3].name):
            newest[key] = run
    order = {bench: k for k, bench in enumerate(READERS)}
    return sorted(newest.values(), key=lambda r: (order.get(r[0], len(order)), r[0], r[3].name))


def _figures(bench: str, path: Path) -> tuple[str, str]:
    what, read = READERS.get(bench, (bench, None))
    if read is None:
        return what, "see the file"
    try:
        return what, read(json.loads(path.read_text()))
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
        return what, f"see the file (not read: {type(error).__name__} {error})"


def table(results: Path = RESULTS) -> str:
    lines = ["| benchmark | run | date | figures |", "|---|---|---|---|"]
    for bench, date, rest, path in current_runs(results):
        what, figures = _figures(bench, path)
        run = rest or path.stem
        lines.append(f"| {what} | [{run}](results/{path.name}) | {date or '—'} | {figures.replace('|', '/')} |")
    return "\n".join(lines)


def block(results: Path = RESULTS) -> str:
    return f"{BEGIN}\n{table(results)}\n{END}"


def replace_block(text: str, new_block: str) -> str:
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + new_block + text[end:]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether bench/README.md's block is current")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    text = README.read_text()
    updated = replace_block(text, block())
    if args.check:
        if updated != text:
            print("bench/README.md: the results table is not the one bench/results/*.json make; "
                  "run python bench/results_table.py", file=sys.stderr)
            return 1
        return 0
    if updated != text:
        README.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
