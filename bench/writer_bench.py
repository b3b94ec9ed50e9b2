"""Writing samples from Python, fastload against its peers (issue 27): the same photos written by
``fastload.Writer``, MosaicML Streaming's ``MDSWriter``, WebDataset's ``ShardWriter`` and LitData's
``optimize``, side by side in one run.

    python3.11 -m venv /tmp/peersvenv
    /tmp/peersvenv/bin/pip install torch==2.13.0     # first, the CPU build: unpinned pulls CUDA packages
    /tmp/peersvenv/bin/pip install --no-deps -r bench/writer_peers_requirements.txt
    /tmp/peersvenv/bin/pip install --no-deps litdata==0.2.76
    .venv/bin/python bench/writer_bench.py bench/data/photos --peers-python /tmp/peersvenv/bin/python \\
        --repeats 3 --json bench/results/writer-$(date +%F)-$(git rev-parse --short HEAD).json

The samples: every JPEG of the ImageFolder tree (classes sorted, files sorted in each) as
``{"image": <the file's bytes as they are, not re-encoded>, "label": <class index>}``. Every row
runs in a fresh Python process, as a user's script would: the writer's package is imported and the
file list loaded before the clock starts; the clock runs from opening the writer to its close (the
last sample written, its shards and index finished). Inside that region each row reads each file's
bytes (``Path.read_bytes``) right before handing the sample over, the same for all; the page cache
is warm (every photo is read once before the runs), and each run's output folder is deleted and
``os.sync()``-ed before the process starts. One shard/chunk size target for all (``--shard-size``,
default 256 MB, fastload's default; Streaming's default is 64 MiB, LitData's and WebDataset's
depend on the call), given to each as a plain byte count. Rows:

* ``fastload lmdb`` / ``fastload hdf5``: ``with fastload.Writer(out, format=..., shard_size=...,
  overwrite=True) as w: w.write(sample)``; its default encode/check threads (the CPUs, at most 8).
  It fsyncs every shard, each index column and the manifest (and their folders) before ``close``
  returns: the dataset is durable when the clock stops.
* ``streaming MDSWriter``: ``with MDSWriter(out=..., columns={"image": "bytes", "label": "int"},
  compression=None, size_limit=...) as w: w.write(sample)``, in the calling thread. It writes
  shards and ``index.json`` with plain ``open().write()``: no fsync, the data may still be in the
  page cache when it returns. ``import streaming`` imports torchvision (for its vision datasets,
  which writing never uses), and PyPI's torchvision does not load beside the CPU build of torch
  2.13.0 (``operator torchvision::nms does not exist``: it is a CUDA build): the row process puts an
  empty stand-in for the two names ``streaming.vision`` imports in ``sys.modules`` before the
  clock starts (``_torchvision_stand_in``); nothing on the writing path touches it.
* ``webdataset ShardWriter``: ``with ShardWriter(out/"shard-%06d.tar", maxsize=...,
  maxcount=10**9) as sink: sink.write({"__key__": ..., "jpg": bytes, "cls": label})``, in the
  calling thread; tar files through ``open()``, no fsync.
* ``litdata optimize``: ``optimize(fn=<reads one file, returns the sample>, inputs=<(path, label)
  list>, output_dir=..., chunk_bytes=..., num_workers=<the CPUs>, mode="overwrite")``: its worker
  processes (spawned, started inside the timed call) write chunks into a cache folder, an uploader
  copies each chunk into ``output_dir`` (``shutil.copy``) and a remover deletes the cached one; the
  index is merged last. No fsync. Its cache folders are put beside the output (same disk).

Each row also times an ``os.sync()`` right after its writer returns: ``written`` is the writer
alone, ``written+sync`` adds the sync, the fair column for the peers that leave dirty pages behind
(fastload's own sync has next to nothing left to flush; on a shared machine ``os.sync`` also
flushes other processes' dirty pages). After the clock, each row counts the records its output
holds (fastload's report, Streaming's and LitData's index.json, the tars' members) and the bytes
on disk. Reported per row: the median over ``--repeats`` runs (after ``--warmup`` untimed runs of
every row), records/s, MB/s of JPEG bytes written, and each row's rate over ``fastload lmdb``'s
(above 1: faster than fastload). The repeats run the rows in rotated order. Nothing asserts on
time; the exit status is 0 when every row wrote every record.
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROWS = ("fastload lmdb", "fastload hdf5", "streaming MDSWriter", "webdataset ShardWriter", "litdata optimize")
PEER_ROWS = ROWS[2:]
BASE = "fastload lmdb"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("src", type=Path, help="an ImageFolder tree of JPEGs (bench/make_photos.py makes one)")
    p.add_argument("--work", type=Path, default=Path("bench/data/writer-work"), help="where each row writes")
    p.add_argument("--peers-python", default="/tmp/peersvenv/bin/python",
                   help="the peers' virtualenv's python (the fastload rows run with this script's python)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of every row first (default 1)")
    p.add_argument("--shard-size", type=int, default=256_000_000, help="bytes per shard/chunk for all (256 MB)")
    p.add_argument("--rows", default=",".join(ROWS), help="which rows, comma-separated (default: all)")
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)  # one row, in its own process
    args = p.parse_args(argv)
    if args.child is None and not args.src.is_dir():
        p.error(f"{args.src}: not a folder; make one with bench/make_photos.py")
    return args


def listing(src: Path) -> list[tuple[str, int]]:
    """(file, label): classes sorted, files sorted in each, as a folder pack orders them."""
    classes = sorted(d.name for d in src.iterdir() if d.is_dir())
    return [(str(src / c / name), label) for label, c in enumerate(classes) for name in sorted(os.listdir(src / c))]


def photo_item(item: tuple[str, int]) -> dict:
    """LitData's fn: one sample, the file's bytes as they are and its label."""
    return {"image": Path(item[0]).read_bytes(), "label": item[1]}


def _torchvision_stand_in() -> None:
    """The two torchvision names ``import streaming`` needs (its vision datasets), empty: see the docstring."""
    import importlib.machinery
    import types

    for name in ("torchvision", "torchvision.datasets", "torchvision.transforms", "torchvision.transforms.functional"):
        sys.modules[name] = types.ModuleType(name)
        sys.modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules["torchvision.datasets"].VisionDataset = type("VisionDataset", (), {})
    sys.modules["torchvision.transforms.functional"].to_tensor = None


def write_fastload(items: list, out: Path, size: int, storage: str) -> tuple[float, int, str]:
    import fastload

    writer_class = fastload.Writer  # resolved before the clock
    start = time.perf_counter()
    with writer_class(out, format=storage, shard_size=size, overwrite=True) as w:
        for path, label in items:
            w.write({"image": Path(path).read_bytes(), "label": label})
    seconds = time.perf_counter() - start
    return seconds, w.report.num_records, f"fastload {fastload.__version__}"


def write_mds(items: list, out: Path, size: int) -> tuple[float, int, str]:
    _torchvision_stand_in()
    import streaming
    from streaming import MDSWriter

    start = time.perf_counter()
    with MDSWriter(out=str(out), columns={"image": "bytes", "label": "int"}, compression=None, size_limit=size) as w:
        for path, label in items:
            w.write({"image": Path(path).read_bytes(), "label": label})
    seconds = time.perf_counter() - start
    shards = json.loads((out / "index.json").read_text())["shards"]
    return seconds, sum(s["samples"] for s in shards), f"mosaicml-streaming {streaming.__version__}"


def write_wds(items: list, out: Path, size: int) -> tuple[float, int, str]:
    import tarfile

    import webdataset

    out.mkdir(parents=True)
    start = time.perf_counter()
    with webdataset.ShardWriter(str(out / "shard-%06d.tar"), maxsize=size, maxcount=10**9, verbose=0) as sink:
        for k, (path, label) in enumerate(items):
            sink.write({"__key__": f"{k:08d}", "jpg": Path(path).read_bytes(), "cls": label})
    seconds = time.perf_counter() - start
    keys = set()
    for tar in sorted(out.glob("*.tar")):
        with tarfile.open(tar) as archive:
            keys.update(m.name.split(".")[0] for m in archive.getmembers())
    return seconds, len(keys), f"webdataset {webdataset.__version__}"


def write_litdata(items: list, out: Path, size: int) -> tuple[float, int, str]:
    os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = str(out.parent / "litdata-chunks")
    os.environ["DATA_OPTIMIZER_DATA_CACHE_FOLDER"] = str(out.parent / "litdata-data")
    import logging

    import litdata

    logging.getLogger("litdata").setLevel(logging.ERROR)
    start = time.perf_counter()
    litdata.optimize(fn=photo_item, inputs=items, output_dir=str(out), chunk_bytes=size,
                     num_workers=os.cpu_count(), mode="overwrite", verbose=False)
    seconds = time.perf_counter() - start
    chunks = json.loads((out / "index.json").read_text())["chunks"]
    return seconds, sum(c["chunk_size"] for c in chunks), f"litdata {litdata.__version__}"


def run_child(spec: dict) -> dict:
    """One row in this process: write, sync, count; the result as a dict."""
    items = [tuple(i) for i in json.loads(Path(spec["listing"]).read_text())]
    out, size, row = Path(spec["out"]), spec["shard_size"], spec["row"]
    if row.startswith("fastload"):
        seconds, records, version = write_fastload(items, out, size, row.split()[1])
    else:
        seconds, records, version = {"streaming MDSWriter": write_mds, "webdataset ShardWriter": write_wds,
                                     "litdata optimize": write_litdata}[row](items, out, size)
    start = time.perf_counter()
    os.sync()
    sync = time.perf_counter() - start
    on_disk = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    return {"written_s": seconds, "sync_s": sync, "records": records, "bytes_on_disk": on_disk, "version": version}


def run_row(row: str, args: argparse.Namespace, listing_file: Path) -> dict:
    out = args.work / row.replace(" ", "-")
    for folder in (out, args.work / "litdata-chunks", args.work / "litdata-data"):
        shutil.rmtree(folder, ignore_errors=True)
    os.sync()
    python = sys.executable if row.startswith("fastload") else args.peers_python
    spec = {"row": row, "out": str(out.resolve()), "shard_size": args.shard_size, "listing": str(listing_file)}
    env = {**os.environ, "PYTHONPATH": str(REPO / "bench")}
    done = subprocess.run([python, str(Path(__file__).resolve()), "-", "--child", json.dumps(spec)],
                          check=False, capture_output=True, text=True, env=env, cwd=args.work)
    if done.returncode != 0:
        raise SystemExit(f"{row} failed (rc {done.returncode}):\n{done.stderr.strip()[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def warm(files: list[tuple[str, int]]) -> int:
    return sum(len(Path(f).read_bytes()) for f, _ in files)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def summarize(runs: dict[str, list[dict]], samples: int, source_bytes: int) -> dict[str, dict]:
    """Each row's medians, rates and ratio to ``fastload lmdb`` (above 1: faster than fastload)."""
    results: dict[str, dict] = {}
    for row, done in runs.items():
        written = statistics.median(r["written_s"] for r in done)
        synced = statistics.median(r["written_s"] + r["sync_s"] for r in done)
        results[row] = {"version": done[0]["version"], "records": done[0]["records"],
                        "bytes_on_disk": done[0]["bytes_on_disk"], "written_s": written, "written_sync_s": synced,
                        "records_per_s": samples / written, "records_per_s_sync": samples / synced,
                        "mb_per_s": source_bytes / 1e6 / written, "mb_per_s_sync": source_bytes / 1e6 / synced,
                        "all_written_s": [r["written_s"] for r in done], "all_sync_s": [r["sync_s"] for r in done],
                        "all_records": [r["records"] for r in done]}
    base = results.get(BASE)
    for r in results.values():
        if base:
            r["vs_fastload"] = r["records_per_s"] / base["records_per_s"]
            r["vs_fastload_sync"] = r["records_per_s_sync"] / base["records_per_s_sync"]
    return results


def print_table(results: dict[str, dict]) -> None:
    print("| row | version | written s | rec/s | MB/s | vs fastload | written+sync s | rec/s | MB/s | vs fastload |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row, r in results.items():
        print(f"| {row} | {r['version']} | {r['written_s']:.2f} | {r['records_per_s']:,.0f} | {r['mb_per_s']:,.0f} | "
              f"{r.get('vs_fastload', float('nan')):.2f}x | {r['written_sync_s']:.2f} | "
              f"{r['records_per_s_sync']:,.0f} | {r['mb_per_s_sync']:,.0f} | "
              f"{r.get('vs_fastload_sync', float('nan')):.2f}x |")


def main(args: argparse.Namespace) -> int:
    if args.child is not None:
        print(json.dumps(run_child(json.loads(args.child))))
        return 0
    rows = [r for r in ROWS if r in args.rows.split(",")]
    # the commit measured: HEAD when the run starts (others may commit while it runs)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    files = listing(args.src.resolve())
    listing_file = args.work / "listing.json"
    listing_file.write_text(json.dumps(files))
    source_bytes = warm(files)
    load_before = load()
    for _ in range(args.warmup):
        for row in rows:
            run_row(row, args, listing_file)
    runs: dict[str, list[dict]] = {row: [] for row in rows}
    for repeat in range(args.repeats):
        for row in rows[repeat % len(rows):] + rows[:repeat % len(rows)]:
            result = run_row(row, args, listing_file)
            runs[row].append(result)
            print(f"{row:24s} repeat {repeat}: {result['written_s']:6.2f} s written, "
                  f"+{result['sync_s']:.2f} s sync", file=sys.stderr)
    load_after = load()
    results = summarize(runs, len(files), source_bytes)
    print_table(results)
    complete = all(n == len(files) for r in results.values() for n in r["all_records"])
    if args.json:
        args.json.write_text(json.dumps({
            "schema": "fastload-writer-bench/1", "started": started,
            "created": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "commit": commit,
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                        "load_before": load_before, "load_after": load_after},
            "samples": len(files), "source_bytes": source_bytes, "shard_size": args.shard_size,
            "repeats": args.repeats, "warmup": args.warmup, "complete": complete, "results": results}, indent=1))
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main(parse_args()))
