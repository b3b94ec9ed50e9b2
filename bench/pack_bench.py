"""Pack benchmark: `tar -cf` against fastload pack to LMDB and HDF5, side by side on one folder.

Every method reads the same source folder from a warm page cache and writes into the same work
folder. tar is timed twice in each run: when tar exits (its data may still sit dirty in the page
cache) and after an fsync of the tar file, which is the fair comparison because fastload fsyncs
every shard and its manifest. Before each timed run the previous output is deleted and the
filesystem synced, so no run pays for another's writeback. Each repeat runs the methods in a
rotated order; the table shows medians.

Each pack runs in a fresh Python process, as tar does and as a user's `fastload pack` does, and
is timed around the `converters.pack(...)` call inside it (interpreter start and imports, about
0.2 s, are recorded apart as `process_s`). Packing in a process that has packed before is faster
(the allocator already holds the memory it needs), so an in-process loop would flatter it.

    python bench/pack_bench.py bench/data/photos --work bench/data/pack-work --repeats 3 \\
        --json bench/results/pack.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

METHODS = ("tar", "fastload-lmdb", "fastload-hdf5")  # "tar" also yields "tar+fsync"
ROWS = ("tar", "tar+fsync", "fastload-lmdb", "fastload-hdf5")
TARGET_TIME_RATIO = 1.25  # pack time / tar time
TARGET_SIZE_RATIO = 1.05  # output bytes on disk / source bytes
REPO = Path(__file__).resolve().parent.parent

# run in a fresh interpreter: one pack, then its report as one JSON line
PACK_CHILD = """
import json, sys, time
from fastload.converters import pack
src, out, storage, shard_size, workers = sys.argv[1:6]
start = time.perf_counter()
report = pack(src, out, format=storage, shard_size=shard_size,
              workers=None if workers == "auto" else int(workers), overwrite=True, progress=False)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "num_records": report.num_records,
                  "total_bytes": report.total_bytes, "num_shards": report.num_shards,
                  "skipped": report.skipped, "elapsed_s": report.elapsed_s}))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="source folder (an ImageFolder tree of JPEGs)")
    p.add_argument("--work", type=Path, default=Path("bench/data/pack-work"),
                   help="where outputs are written; same filesystem as SRC for a fair comparison")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per method (default 3)")
    p.add_argument("--warmup", type=int, default=1,
                   help="untimed runs per method first (default 1)")
    p.add_argument("--shard-size", default="256MB", help="fastload shard size (default 256MB)")
    p.add_argument("--workers", type=int, default=None,
                   help="fastload read workers (default: auto)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--no-cli-check", action="store_true",
                   help="skip the one `fastload pack` CLI run at the end")
    p.add_argument("--keep", action="store_true", help="leave the outputs in --work")
    args = p.parse_args(argv)
    if not args.src.is_dir():
        p.error(f"{args.src}: not a folder; make one with bench/make_photos.py")
    if args.repeats < 1 or args.warmup < 0:
        p.error(f"--repeats must be >= 1 and --warmup >= 0, got {args.repeats} and {args.warmup}")
    return args


# --- what is measured --------------------------------------------------------------------------

def read_all(src: Path) -> dict[str, int]:
    """Read every file once (fills the page cache); the folder's file count and sizes."""
    files = apparent = disk = 0
    for root, _, names in os.walk(src):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                while f.read(1 << 20):
                    pass
            st = os.stat(path)
            files, apparent, disk = files + 1, apparent + st.st_size, disk + st.st_blocks * 512
    return {"files": files, "bytes": apparent, "disk_bytes": disk}


def output_size(path: Path) -> dict[str, int]:
    """Apparent bytes and bytes allocated on disk (sparse files count what they use)."""
    paths = [path] if path.is_file() else [Path(r) / n for r, _, ns in os.walk(path) for n in ns]
    stats = [p.stat() for p in paths]
    return {"bytes": sum(s.st_size for s in stats),
            "disk_bytes": sum(s.st_blocks * 512 for s in stats)}


def clear(path: Path) -> None:
    """Remove an output and flush all dirty pages, so the next run starts clean."""
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    os.sync()


def run_tar(src: Path, out: Path) -> dict[str, float]:
    start = time.perf_counter()
    subprocess.run(["tar", "-cf", str(out), "-C", str(src), "."], check=True)
    written = time.perf_counter()
    fd = os.open(out, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"tar": written - start, "tar+fsync": time.perf_counter() - start}


def run_pack(src: Path, out: Path, storage: str, args: argparse.Namespace) -> dict:
    """One ``converters.packing.loop`` in a fresh process; its report, with ``seconds`` around the call."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
    workers = "auto" if args.workers is None else str(args.workers)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PACK_CHILD, str(src), str(out), storage,
                           str(args.shard_size), workers], capture_output=True, text=True, env=env)
    process_s = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"fastload pack --format {storage} failed (rc {done.returncode}):\n"
                         f"{done.stderr.strip()[-2000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process_s": process_s}


def run_once(method: str, src: Path, work: Path, args: argparse.Namespace) -> tuple[dict, dict]:
    """One run of one method: {row: seconds}, and what it produced."""
    out = work / ("x.tar" if method == "tar" else f"{method}.fl")
    clear(out)
    if method == "tar":
        return run_tar(src, out), {"out": out}
    report = run_pack(src, out, method.split("-")[1], args)
    return {method: report["seconds"]}, {"out": out, "report": report}


def cli_check(src: Path, work: Path, keep: bool) -> dict:
    """One `fastload pack` through the console script: it must succeed and write a manifest."""
    out = work / "cli.fl"
    clear(out)
    exe = shutil.which("fastload")
    cmd = [exe] if exe else [sys.executable, "-m", "fastload.cli"]
    cmd += ["pack", str(src), "-o", str(out), "--format", "lmdb", "--overwrite", "--quiet"]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    ok = done.returncode == 0 and (out / "manifest.json").is_file()
    result = {"command": " ".join(cmd), "rc": done.returncode, "ok": ok, "seconds": seconds,
              "stdout_tail": done.stdout.strip()[-300:], "stderr_tail": done.stderr.strip()[-600:]}
    if ok:
        result.update(output_size(out))
    if not keep:
        clear(out)
    return result


# --- the machine and the report ------------------------------------------------------------------

def machine(work: Path, src: Path) -> dict:
    def df_type(path: Path) -> str:
        done = subprocess.run(["df", "--output=fstype", str(path)], capture_output=True, text=True)
        return done.stdout.split()[-1] if done.returncode == 0 else "?"

    model = "?"
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True)
    for line in lscpu.stdout.splitlines():
        if line.startswith("Model name:"):
            model = line.split(":", 1)[1].strip()
    mem_kb = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    versions = {}
    for name in ("fastload", "lmdb", "h5py", "numpy", "PIL"):
        try:
            versions[name] = getattr(__import__(name), "__version__", "?")
        except ImportError:
            versions[name] = None
    return {"cpus": len(os.sched_getaffinity(0)), "cpu_model": model,
            "mem_gib": round(mem_kb / 2**20, 1), "fs_src": df_type(src), "fs_work": df_type(work),
            "kernel": platform.release(), "python": platform.python_version(),
            "tar": subprocess.run(["tar", "--version"], capture_output=True, text=True)
            .stdout.splitlines()[0], "versions": versions}


def summarise(times: dict[str, list[float]], sizes: dict[str, dict], reports: dict[str, list],
              source: dict[str, int]) -> dict[str, dict]:
    results = {}
    tar, tar_sync = statistics.median(times["tar"]), statistics.median(times["tar+fsync"])
    for row in ROWS:
        med = statistics.median(times[row])
        size = sizes["tar" if row.startswith("tar") else row]
        entry = {"times_s": times[row], "median_s": med, "mb_per_s": source["bytes"] / 1e6 / med,
                 "vs_tar": med / tar, "vs_tar_fsync": med / tar_sync, **size,
                 "size_ratio": size["disk_bytes"] / source["bytes"]}
        if row in reports:
            last = reports[row][-1]
            entry.update({k: last[k] for k in ("num_records", "num_shards", "skipped",
                                               "total_bytes")})
            entry["process_s"] = [r["process_s"] for r in reports[row]]
            entry["report_elapsed_s"] = [r["elapsed_s"] for r in reports[row]]
        results[row] = entry
    return results


def markdown(results: dict[str, dict]) -> str:
    lines = ["| method | median s | runs (s) | MB/s | × tar | × tar+fsync | on disk MB "
             "| size / source |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for row, r in results.items():
        runs = ", ".join(f"{t:.2f}" for t in r["times_s"])
        lines.append(f"| {row} | {r['median_s']:.2f} | {runs} | {r['mb_per_s']:.0f} | "
                     f"{r['vs_tar']:.2f} | {r['vs_tar_fsync']:.2f} | {r['disk_bytes'] / 1e6:.1f} | "
                     f"{r['size_ratio']:.3f} |")
    return "\n".join(lines)


def measure(src: Path, work: Path, args: argparse.Namespace) -> tuple[dict, dict, dict]:
    """Warm-up, then the timed repeats in rotated order: times per row, output sizes, reports."""
    for i in range(args.warmup):
        for method in METHODS:
            print(f"warm-up {i + 1}/{args.warmup}: {method}", file=sys.stderr)
            run_once(method, src, work, args)
    times: dict[str, list[float]] = {row: [] for row in ROWS}
    sizes: dict[str, dict] = {}
    reports: dict[str, list] = {}
    for rep in range(args.repeats):
        for method in METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]:
            read_all(src)  # a writer may have pushed source pages out of the cache
            seconds, made = run_once(method, src, work, args)
            for row, value in seconds.items():
                times[row].append(value)
            sizes[method] = output_size(made["out"])
            if "report" in made:
                reports.setdefault(method, []).append(made["report"])
            shown = ", ".join(f"{row} {value:.2f}s" for row, value in seconds.items())
            print(f"repeat {rep + 1}/{args.repeats}: {shown}", file=sys.stderr)
    return times, sizes, reports


def main(args: argparse.Namespace) -> int:
    src, work = args.src.resolve(), args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    source = read_all(src)
    print(f"source {src}: {source['files']} files, {source['bytes'] / 1e6:.1f} MB "
          f"(mean {source['bytes'] / max(source['files'], 1) / 1e3:.1f} KB), page cache warmed",
          file=sys.stderr)
    times, sizes, reports = measure(src, work, args)
    for method, runs in reports.items():
        if runs[-1]["num_records"] != source["files"] or runs[-1]["skipped"]:
            print(f"note: {method} packed {runs[-1]['num_records']} records and skipped "
                  f"{runs[-1]['skipped']} of {source['files']} files", file=sys.stderr)
    results = summarise(times, sizes, reports, source)
    cli = None if args.no_cli_check else cli_check(src, work, args.keep)
    if not args.keep:
        for method in METHODS:
            clear(work / ("x.tar" if method == "tar" else f"{method}.fl"))

    table = markdown(results)
    print(table)
    for row in ("fastload-lmdb", "fastload-hdf5"):
        r = results[row]
        print(f"{row}: {r['vs_tar_fsync']:.2f}× tar+fsync (target ≤ {TARGET_TIME_RATIO}), "
              f"{r['vs_tar']:.2f}× tar; "
              f"size {r['size_ratio']:.3f}× source (target ≤ {TARGET_SIZE_RATIO})")
    if cli is not None:
        state = "ok" if cli["ok"] else f"FAILED (rc {cli['rc']}): {cli['stderr_tail']}"
        print(f"CLI check `fastload pack ... --format lmdb`: {state}, {cli['seconds']:.2f}s")
    if args.json:
        doc = {"benchmark": "pack",
               "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "command": " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
               "machine": machine(work, src),
               "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
               "source": {"path": str(src), **source},
               "config": {"repeats": args.repeats, "warmup": args.warmup,
                          "shard_size": args.shard_size, "workers": args.workers,
                          "work": str(work), "page_cache": "warm"},
               "targets": {"time_vs_tar_fsync": TARGET_TIME_RATIO,
                           "size_vs_source": TARGET_SIZE_RATIO},
               "results": results, "cli_check": cli, "table": table}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0 if cli is None or cli["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(parse_args()))
