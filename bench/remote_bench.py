"""Far storage benchmark: the benchmark photos in a real S3-compatible server behind a proxy that adds
a round trip to every request, read as small objects and as a packed dataset, side by side.

    python bench/remote_bench.py bench/data/photos bench/data/photos.rm.fl \\
        --json bench/results/remote.json

The server is moto's (``moto[server]``, a dev dependency) on 127.0.0.1; in front of it the tests'
latency proxy (tests/remote/latency_proxy.py, in a process of its own, bodies spliced; ``--proxy
fault``: the fault tests' FaultProxy, in this process) adds ``--latency`` seconds (default 20 ms)
before each request is forwarded. Every contender keeps ``--in-flight`` (64) requests in flight.
Each row runs in a fresh process (its peak RSS is its own); the proxy counts the requests and bytes
each row asked the store for. Each row also reports the CPU-seconds of the client (the row's
process and its children), the server and the proxy over the row, so that it says how much of the
machine the test bed itself took. Rows:

* ``small objects``: the photos as one object each, shuffled, one GET per photo (the baseline);
* ``s3torchconnector, one GET per object``: AWS's S3 Connector for PyTorch (CRT-based) on the same
  objects in the same order: its ``S3MapDataset`` with the sequential reader, ``--in-flight``
  objects read at once on threads (the CRT does each GET off the GIL); ``s3torchconnector ranged,
  one GET per record``: its ranged reader (unbuffered) over the packed shards, each record's byte
  range fetched alone (where it lies is taken from the local copy's index). Left out, with a note,
  when ``s3torchconnector`` is not installed (``pip install s3torchconnector``; a dev dependency);
* ``packed, no cache``: ``PackedDataset(url, cache_limit=0)``: each record's exact byte range,
  neighbours coalesced; ``shards opened in turn``: the same with each shard's open (its tree
  walked) one after another, as before the opens went side by side (a pack of many shards shows it);
* ``packed, cache cold`` / ``warm``: with the node cache (epoch 1 fetches aligned 4 MiB pieces and
  keeps them; epoch 2 reads the cache); ``fill ahead``: the cold epoch with the background fill
  that fastload.DataLoader starts as an epoch begins (what the loader's reads see); ``fill ahead,
  1 stream`` / ``2 streams``: the same with fewer fill streams than the default 3;
* ``local disk``: the same raw reads of the same packed dataset on the local disk (warm page cache);
* ``train ...``: ``fastload.DataLoader(PackedDataset(..., image_size=224, train=True),
  batch_size=64, shuffle=True)`` (RandomResizedCrop 224 + flip) for one epoch, from the local disk
  and from the store (cold cache, then warm); each epoch's CPU-seconds of the training process (and
  its workers) and of the test bed are reported, and "the most these cores allow": the local epoch's
  wall time over the store epoch's CPU-seconds (client and bed together) spread over every core, the
  best epoch-1 ratio this machine could show with the bed on the same cores;
* ``policy keep`` / ``policy lru``: a cache of half the dataset, three epochs of shuffled raw reads:
  what each epoch fetched from the store.

Nothing asserts on time; the ratios are printed and written to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from remote_rows import ROWS, peak_mb, process_cpu  # bench/ is the script folder, so on sys.path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos", help="the local photo folder (ImageFolder tree)")
    p.add_argument("packed", help="a local packed dataset of the same photos")
    p.add_argument("--latency", type=float, default=0.02, help="seconds added to every request (0.02)")
    p.add_argument("--proxy", choices=("latency", "fault"), default="latency",
                   help="latency: the splicing LatencyProxy in its own process (default); fault: FaultProxy")
    p.add_argument("--in-flight", type=int, default=64, help="requests in flight per contender (64)")
    p.add_argument("--small-records", type=int, default=3000,
                   help="photos read by the small-objects row (its rate is per request: steady early)")
    p.add_argument("--work", default=None,
                   help="folder for the caches, kept (default: a temp folder, deleted after the run)")
    p.add_argument("--skip-train", action="store_true", help="leave out the train pipeline rows")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--cli-json", default=None, metavar="FILE",
                   help="also run `fastload bench PHOTOS_URL --packed PACKED_URL` through the proxy "
                        "and write its report here (its table is printed)")
    p.add_argument("--cold-rounds", type=int, default=5,
                   help="rounds of the local cold rows, each pair in turn (5): the ratio is their median")
    p.add_argument("--rows", default=None, help="only these rows (names separated by ';')")
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # internal: run one row, print JSON
    p.add_argument("--row-args", default="{}", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# --- the run ----------------------------------------------------------------------------------------

def _children_cpu() -> float:
    """CPU-seconds of this process's waited-for children (each row's process and its workers)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _proxy_counts(proxy: Any) -> tuple[int, int, int]:
    """The proxy's requests and ranged bytes since ``clear()``, and its process id."""
    if hasattr(proxy, "stats"):  # LatencyProxy, in a process of its own
        stats = proxy.stats()
        return stats["requests"], stats["range_bytes"], proxy.pid
    requests = proxy.requests  # FaultProxy, a thread of this process
    return len(requests), sum(_range_length(r) for r in requests), os.getpid()


def _run_row(name: str, kind: str, args: dict[str, Any], proxy: Any, server_pid: int) -> dict[str, Any]:
    proxy.clear()
    proxy_pid = _proxy_counts(proxy)[2]
    server_cpu, proxy_cpu, client_cpu = process_cpu(server_pid), process_cpu(proxy_pid), _children_cpu()
    done = subprocess.run([sys.executable, __file__, "x", "x", "--row", kind, "--row-args", json.dumps(args)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"row {name!r} failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    warned = [line for line in done.stderr.splitlines() if "Warning:" in line]
    for line in warned:  # what the row's reader said (a full cache disk would otherwise pass unseen)
        print(f"  {name}: {line.strip()}", flush=True)
    result["warnings"] = warned
    # the store and the proxy run on the same cores as the reader: what they took is not the reader's
    result["client_cpu_s"] = _children_cpu() - client_cpu
    result["server_cpu_s"] = process_cpu(server_pid) - server_cpu
    result["proxy_cpu_s"] = process_cpu(proxy_pid) - proxy_cpu
    result["requests"], result["range_bytes"], _ = _proxy_counts(proxy)
    result["name"] = name
    for e in result.get("epochs", []):
        e["rate"] = e["records"] / e["seconds"]
    result["rate"] = result["records"] / result["seconds"]
    total = sum(e["seconds"] for e in result.get("epochs", [result]))
    print(f"{name:<44} {result['rate']:>9,.0f} records/s  {result['records']:>6} records  "
          f"{result['requests']:>6} requests  peak {result['peak_mb']:.0f} MB  CPU-s client "
          f"{result['client_cpu_s']:.1f} server {result['server_cpu_s']:.1f} proxy {result['proxy_cpu_s']:.1f}"
          f" (bed {(result['server_cpu_s'] + result['proxy_cpu_s']) / total:.2f} cores)", flush=True)
    for k, e in enumerate(result.get("epochs", [])):
        if "client_cpu_s" in e:
            print(f"  epoch {k + 1}: {e['seconds']:.2f} s (first batch {e['first_batch_s']:.2f} s), CPU-s "
                  f"client {e['client_cpu_s']:.2f} (training process and its workers), test bed "
                  f"{e.get('bed_cpu_s', 0):.2f}, resident after it {e.get('resident_mb', 0):.0f} MB", flush=True)
    return result


def _range_length(request: Any) -> int:
    spec = request.headers.get("range", "")
    if not spec.startswith("bytes="):
        return 0
    lo, _, hi = spec[6:].partition("-")
    return int(hi) - int(lo) + 1 if lo and hi else 0


CONNECTOR_MAP = "s3torchconnector, one GET per object"
CONNECTOR_RANGED = "s3torchconnector ranged, one GET per record"


def _ratios(by: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The issue's ratios, of the rows that ran (``--rows`` may leave some out)."""
    def rate(name: str, epoch: int | None = None) -> float:
        row = by[name]
        return row["rate"] if epoch is None else row["epochs"][epoch]["rate"]

    def paired(a: str, b: str) -> float:
        """The median over rounds of row ``a``'s rate / row ``b``'s in the same round."""
        rounds = sorted({n.split(" #")[1] for n in by if n.startswith(f"{a} #")})
        if not rounds:
            raise KeyError(a)  # the rows did not run
        return statistics.median(rate(f"{a} #{k}") / rate(f"{b} #{k}") for k in rounds)

    wanted: dict[str, Any] = {
        "packed no cache / small objects": lambda: rate("packed, no cache") / rate("small objects"),
        "s3torchconnector one GET per object / small objects":
            lambda: rate(CONNECTOR_MAP) / rate("small objects"),
        "packed cold, fill ahead / s3torchconnector one GET per object":
            lambda: rate("packed, cache cold, fill ahead") / rate(CONNECTOR_MAP),
        "packed cold (epoch 1) / s3torchconnector one GET per object":
            lambda: rate("packed, cache cold+warm", 0) / rate(CONNECTOR_MAP),
        "packed no cache / s3torchconnector ranged": lambda: rate("packed, no cache") / rate(CONNECTOR_RANGED),
        "packed cold (epoch 1) / small objects":
            lambda: rate("packed, cache cold+warm", 0) / rate("small objects"),
        "packed cold, fill ahead / small objects":
            lambda: rate("packed, cache cold, fill ahead") / rate("small objects"),
        "packed cold (epoch 1) / store ceiling":
            lambda: rate("packed, cache cold+warm", 0) / rate("store ceiling, 4 MiB pieces"),
        "packed warm (epoch 2) / local disk": lambda: rate("packed, cache cold+warm", 1) / rate("local disk"),
        "local cold: fastload / threaded pread (median of rounds)":
            lambda: paired("local disk cold, fastload", "local disk cold, pread x64"),
        "local cold: a batch at a time / threaded pread (median of rounds)":
            lambda: paired("local disk cold, a batch at a time", "local disk cold, pread x64"),
        "packed no cache / the same, shards opened in turn":
            lambda: rate("packed, no cache") / rate("packed, no cache, shards opened in turn"),
        "train store, epoch 1 / the same, shards opened in turn":
            lambda: rate("train, store cold+warm", 0) / rate("train, store cold+warm, shards opened in turn", 0),
        "train store, epoch 1 / the same, fill 4 pieces a group":
            lambda: rate("train, store cold+warm", 0) / rate("train, store cold+warm, fill 4 pieces a group", 0),
        "train peak RSS store / the same, fill 4 pieces a group":
            lambda: (by["train, store cold+warm"]["peak_mb"]
                     / by["train, store cold+warm, fill 4 pieces a group"]["peak_mb"]),
        "train store / local, epoch 1": lambda: rate("train, store cold+warm", 0) / rate("train, local disk", 0),
        "train store / local, epoch 2": lambda: rate("train, store cold+warm", 1) / rate("train, local disk", 1),
        "train store / local, epoch 1: the most these cores allow": lambda: _wall_bound(by),
        "train peak RSS store / local":
            lambda: by["train, store cold+warm"]["peak_mb"] / by["train, local disk"]["peak_mb"],
        "train RSS after epoch 1 store / local": lambda: (by["train, store cold+warm"]["epochs"][0]["resident_mb"]
                                                          / by["train, local disk"]["epochs"][0]["resident_mb"]),
    }
    for policy in ("keep", "lru"):
        wanted[f"policy {policy}: epoch 3 rate / epoch 1 rate"] = (
            lambda p=policy: rate(f"policy {p}, cache 1/2", 2) / rate(f"policy {p}, cache 1/2", 0))
    ratios = {}
    for name, ratio in wanted.items():
        try:
            ratios[name] = ratio()
        except KeyError:  # a row it needs did not run
            pass
    return ratios


def _wall_bound(by: dict[str, dict[str, Any]]) -> float:
    """The highest epoch-1 rate ratio, store / local, that this machine's cores allow: the store
    epoch cannot take less wall time than its CPU-seconds (the training process's, the server's
    and the proxy's, all on the same cores) spread over every core, busy all the time."""
    local, store = by["train, local disk"]["epochs"][0], by["train, store cold+warm"]["epochs"][0]
    if "bed_cpu_s" not in store:
        raise KeyError("bed_cpu_s")
    fastest = (store["client_cpu_s"] + store["bed_cpu_s"]) / (os.cpu_count() or 1)
    return local["seconds"] / max(fastest, 1e-9)


def _run_cli(photos_url: str, packed_url: str, options: dict[str, Any], out: str, work: Path) -> None:
    """``fastload bench`` on the store URLs, as a user runs it, through the same proxy."""
    given = []
    for key, value in options.items():
        given += ["--storage-option", f"{key}={value if isinstance(value, str) else json.dumps(value)}"]
    subprocess.run([sys.executable, "-m", "fastload.cli", "bench", photos_url, "--packed", packed_url,
                    "--duration", "5", "--repeats", "1", "--no-dali", "--stages", "--quiet",
                    "--work", str(work), "--json", out, *given], check=True)


def _upload(photos: Path, packed: Path, server: Any) -> tuple[str, str]:
    from fastload.storage.remote import RemoteStore

    bucket = server.make_bucket("bench")
    photos_store = RemoteStore(f"s3://{bucket}/photos", server.storage_options())
    for path in sorted(p for p in photos.rglob("*") if p.is_file()):
        photos_store.put_file(path, path.relative_to(photos).as_posix())
    packed_store = RemoteStore(f"s3://{bucket}/photos.fl", server.storage_options())
    for path in sorted(p for p in packed.rglob("*") if p.is_file() and p.name != "manifest.json"):
        packed_store.put_file(path, path.relative_to(packed).as_posix())
    packed_store.put_file(packed / "manifest.json", "manifest.json")  # last, as a pack does
    return photos_store.url, packed_store.url


def _connector_version() -> str | None:
    """The s3torchconnector version the connector rows ran with (None: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("s3torchconnector")
    except PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.row:
        result = ROWS[args.row](json.loads(args.row_args))
        result["peak_mb"] = peak_mb()
        print(json.dumps(result))
        return 0
    from fastload.benchmark.connector import NOT_INSTALLED as CONNECTOR_MISSING
    from fastload.benchmark.connector import installed as connector_installed
    from fastload.format import read_manifest
    from tests.remote.fault_proxy import FaultProxy
    from tests.remote.latency_proxy import LatencyProxy
    from tests.remote.s3_server import start_s3_server

    work = Path(args.work or tempfile.mkdtemp(prefix="fastload-remote-bench-"))
    server = start_s3_server(preload=str(REPO / "bench" / "ranged_moto.py"))
    try:
        t = time.perf_counter()
        photos_url, packed_url = _upload(Path(args.photos), Path(args.packed), server)
        print(f"uploaded in {time.perf_counter() - t:.0f} s", flush=True)
        if args.proxy == "latency":
            bed: Any = LatencyProxy(server.host, server.port, latency=args.latency)
        else:
            bed = FaultProxy(server.host, server.port)
            bed.latency = args.latency
        with bed as proxy:
            opts = server.storage_options(proxy.url)
            common = {"options": opts, "in_flight": args.in_flight}
            total = read_manifest(args.packed).total_bytes
            rows = []

            def cache(name: str) -> str:
                path = work / name
                shutil.rmtree(path, ignore_errors=True)
                return str(path)

            def row(name: str, kind: str, **extra: Any) -> None:
                if args.rows is None or name.split(" #")[0] in args.rows.split(";"):
                    rows.append(_run_row(name, kind, {**common, **extra}, proxy, server.process.pid))

            if args.cli_json:
                _run_cli(photos_url, packed_url, opts, args.cli_json, work)

            row("small objects", "small", photos_url=photos_url, records=args.small_records)
            connector = connector_installed()
            if connector:  # AWS's connector on the same objects and shards, through the same proxy
                row(CONNECTOR_MAP, "connector", photos_url=photos_url, records=args.small_records)
            else:
                print(f"no s3torchconnector rows: {CONNECTOR_MISSING}", flush=True)
            row("packed, no cache", "raw", url=packed_url)
            row("packed, no cache, shards opened in turn", "raw", url=packed_url, opens_in_turn=True)
            if connector:
                row(CONNECTOR_RANGED, "connector", url=packed_url, local=args.packed, ranged=True,
                    records=args.small_records)
            row("store ceiling, 4 MiB pieces", "pieces", url=packed_url, local=args.packed)
            row("packed, cache cold+warm", "raw", url=packed_url, epochs=2, cache_dir=cache("c1"),
                cache_limit=4 * total)
            row("packed, cache cold, fill ahead", "raw", url=packed_url, cache_dir=cache("c2"),
                cache_limit=4 * total, fill=True)
            for streams in (1, 2):  # the fill's streams (FILL_STREAMS is 3), side by side
                row(f"packed, cache cold, fill ahead, {streams} stream{'s' * (streams > 1)}", "raw", url=packed_url,
                    cache_dir=cache(f"s{streams}"), cache_limit=4 * total, fill=True, fill_streams=streams)
            row("local disk", "raw", local=args.packed)
            for k in range(1, args.cold_rounds + 1):  # rows of ~1 s on a shared disk: paired, alternating
                row(f"local disk cold, fastload #{k}", "raw-cold", local=args.packed)
                row(f"local disk cold, a batch at a time #{k}", "raw-cold", local=args.packed, ahead=False)
                row(f"local disk cold, pread x64 #{k}", "pread", local=args.packed)
            for policy in ("keep", "lru"):
                row(f"policy {policy}, cache 1/2", "raw", url=packed_url, epochs=3,
                    cache_dir=cache(f"p-{policy}"), cache_limit=total // 2, policy=policy)
            if not args.skip_train:
                bed_pids = [server.process.pid, _proxy_counts(proxy)[2]]
                row("train, local disk", "train", local=args.packed, epochs=2)
                row("train, store cold+warm", "train", url=packed_url, epochs=2, cache_dir=cache("t"),
                    bed_pids=bed_pids, cache_limit=4 * total)
                row("train, store cold+warm, shards opened in turn", "train", url=packed_url, epochs=2,
                    cache_dir=cache("t2"), bed_pids=bed_pids, cache_limit=4 * total, opens_in_turn=True)
                row("train, store cold+warm, fill 4 pieces a group", "train", url=packed_url, epochs=2,
                    cache_dir=cache("t3"), bed_pids=bed_pids, cache_limit=4 * total, fill_group=4)
    finally:
        server.stop()
        if args.work is None:  # the caches it made: GBs a run
            shutil.rmtree(work, ignore_errors=True)
    ratios = _ratios({r["name"]: r for r in rows})
    for name, value in ratios.items():
        print(f"{name:<62} {value:6.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "schema": "fastload-remote-bench/1", "latency_s": args.latency, "proxy": args.proxy, "in_flight": args.in_flight,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
            "dataset_bytes": total, "rows": rows, "ratios": ratios,
            "s3torchconnector": _connector_version()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
