"""The driver's finalize of a Ray pack alone (``converters.cluster.adopt``), at 10^6 records: time
and peak memory, to extrapolate to 10^8 (issue 28, item 6; docs/ray.md, "The finalize at scale").

The tasks' datasets are made once without Ray, as write tasks make them (``task_shards.write_rows``
with a ``fastload.Writer``): ``--tasks`` folders of ``--per-task`` records, each a 1x1 PNG (tiny:
the finalize never reads a payload) with a key, a label and a float field. Each repeat then runs
the finalize in a fresh process on a hard-linked copy of them (the finalize consumes its work
folder), timed around ``adopt(...)``; the process's peak RSS (``ru_maxrss``) before and after it.

    python bench/ray_finalize_bench.py --tasks 100 --per-task 10000 --repeats 3 \\
        --json bench/results/ray-finalize-$(date +%F)-$(git rev-parse --short HEAD).json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

CHILD = """
import json, resource, sys, time
from pathlib import Path
from fastload.converters.cluster.adopt import adopt
from fastload.converters.cluster.task_shards import SinkSettings, TaskPart
out, parts_file = Path(sys.argv[1]), Path(sys.argv[2])
saved = json.loads(parts_file.read_text())
settings = SinkSettings(**saved["settings"])
parts = [TaskPart(**p) for p in saved["parts"]]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
report = adopt(out, out / ".pack" / "ray", parts, settings)
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print("RESULT " + json.dumps({"seconds": seconds, "rss_before_mb": before / 1024, "peak_rss_mb": peak / 1024,
                              "num_records": report.num_records, "num_shards": report.num_shards}))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("bench/data/ray-finalize-work"),
                   help="where the tasks' datasets (kept between runs) and the finalized copies go")
    p.add_argument("--tasks", type=int, default=100)
    p.add_argument("--per-task", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--processes", type=int, default=2, help="processes making the tasks' datasets (default 2)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    return p.parse_args(argv)


def settings_dict(work: Path) -> dict:
    return {"work": str(work), "image": "image", "label": "label", "key": "path", "fields": ("score",),
            "types": None, "classes": None,
            "writer": {"format": "lmdb", "shard_size": 256 << 20, "quality": None, "on_error": "fail",
                       "check": "header", "max_pixels": 178956970, "max_file_size": 1 << 30, "mask_storage": "rows"}}


def tiny_png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (1, 1), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


def make_task(args: tuple[str, int, int]) -> dict:
    """One write task's dataset, as a task on the cluster writes it; its TaskPart as a dict."""
    from fastload.converters.cluster.task_shards import SinkSettings, write_rows

    work, task, per_task = args
    png = tiny_png()
    rows = ({"path": f"images/{task:05d}/{i:06d}.png", "image": png, "label": (task * per_task + i) % 1000,
             "score": i / 7} for i in range(per_task))
    part = write_rows(rows, SinkSettings(**settings_dict(Path(work))))
    assert part is not None
    return {"folder": part.folder, "first_key": part.first_key, "last_key": part.last_key,
            "records": part.records, "skipped": part.skipped}


def make_tasks(template: Path, tasks: int, per_task: int, processes: int) -> Path:
    """The tasks' datasets under ``template/.pack/ray`` and their parts in ``template.parts.json``."""
    parts_file = template.with_suffix(".parts.json")
    if parts_file.is_file():
        return parts_file
    shutil.rmtree(template, ignore_errors=True)
    work = template / ".pack" / "ray"
    work.mkdir(parents=True)
    started = time.perf_counter()
    with ProcessPoolExecutor(processes) as pool:
        parts = list(pool.map(make_task, [(str(work), t, per_task) for t in range(tasks)]))
    print(f"made {tasks} task datasets of {per_task} records in {time.perf_counter() - started:.0f} s",
          file=sys.stderr)
    parts_file.write_text(json.dumps({"settings": settings_dict(work), "parts": parts}))
    return parts_file


def run_once(template: Path, parts_file: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run(["cp", "-al", str(template), str(out)], check=True)  # hard links: the finalize consumes it
    saved = json.loads(parts_file.read_text())
    saved["settings"]["work"] = str(out / ".pack" / "ray")
    moved = out.with_suffix(".parts.json")
    moved.write_text(json.dumps(saved))
    done = subprocess.run([sys.executable, "-c", CHILD, str(out), str(moved)], capture_output=True, text=True,
                          check=False)
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"finalize exited {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return json.loads(line.removeprefix("RESULT "))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    template = args.work / f"tasks-{args.tasks}x{args.per_task}"
    args.work.mkdir(parents=True, exist_ok=True)
    parts_file = make_tasks(template, args.tasks, args.per_task, args.processes)
    runs = []
    for repeat in range(args.repeats):
        result = run_once(template, parts_file, args.work / "finalized.fl")
        runs.append(result)
        print(f"  repeat {repeat}: {result['seconds']:.2f} s, peak RSS {result['peak_rss_mb']:.0f} MB "
              f"(before the finalize {result['rss_before_mb']:.0f} MB)", file=sys.stderr)
    index_bytes = sum(f.stat().st_size for f in (args.work / "finalized.fl" / "index").glob("*.npy"))
    records = runs[0]["num_records"]
    seconds = statistics.median(r["seconds"] for r in runs)
    peak = statistics.median(r["peak_rss_mb"] for r in runs)
    before = statistics.median(r["rss_before_mb"] for r in runs)
    print("\n| records | tasks | finalize s | records/s | peak RSS MB | RSS before MB | index on disk MB |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {records} | {args.tasks} | {seconds:.2f} | {records / seconds:,.0f} | {peak:.0f} | {before:.0f} | "
          f"{index_bytes / 1e6:.0f} |")
    print(f"load average (1 min): {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=False).stdout.strip()
        args.json.write_text(json.dumps({
            "command": " ".join(["python", *sys.argv]), "commit": commit, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "tasks": args.tasks, "per_task": args.per_task, "records": records, "seconds": seconds,
            "peak_rss_mb": peak, "rss_before_mb": before, "index_bytes": index_bytes,
            "num_shards": runs[0]["num_shards"], "runs": runs, "load_average": os.getloadavg()[0]}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
