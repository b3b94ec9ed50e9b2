"""The test bed's own cost: CPU-seconds per 1,000 requests and per GB of the S3 server (moto) and of
each latency proxy, each in a process of its own, for the same ranged GETs side by side.

    python bench/proxy_cost.py --json bench/results/proxy-cost.json

One object of ``--object-mb`` random bytes in moto (``bench/ranged_moto.py``: ranged GETs read the
range alone), read by fastload's client (``RemoteStore.read_ranges``, a batch in flight at once) by
three routes: straight to the server, through the fault tests' ``FaultProxy`` (asyncio streams,
run here in a process of its own) and through ``LatencyProxy`` (splice), both adding ``--latency``.
Two shapes: ``--small-n`` GETs of 4 KiB (64 in flight: the per-request cost) and ``--large-n`` of 4
MiB (8 in flight: the per-byte cost, once the per-request cost is taken off). CPU of each process
from ``/proc/PID/stat`` around each shape; the median of ``--repeats``. Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# FaultProxy in a process of its own, so that its CPU is not this process's
_FAULT_PROXY = """
import sys
from tests.remote.fault_proxy import FaultProxy
proxy = FaultProxy(sys.argv[1], int(sys.argv[2])).start()
proxy.latency = float(sys.argv[3])
print(proxy.port, flush=True)
sys.stdin.read()
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--latency", type=float, default=0.02, help="seconds each proxy adds to a request (0.02)")
    p.add_argument("--small-n", type=int, default=2000, help="GETs of 4 KiB per repeat (2000)")
    p.add_argument("--large-n", type=int, default=128, help="GETs of 4 MiB per repeat (128)")
    p.add_argument("--object-mb", type=int, default=128, help="size of the object read (128)")
    p.add_argument("--repeats", type=int, default=3, help="repeats of each route and shape; the median (3)")
    p.add_argument("--json", default=None, help="write the results here")
    return p.parse_args(argv)


def cpu_seconds(pid: int) -> float:
    """User + system CPU-seconds process ``pid`` has used (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _spread(count: int, size: int, object_bytes: int, seed: int) -> list[tuple[int, int]]:
    """``count`` ranges of ``size`` bytes, no two within 256 KB (so none are coalesced), shuffled."""
    import numpy as np

    slot = size + (512 << 10)
    slots = object_bytes // slot
    rng = np.random.default_rng(seed)
    return [(int(s) * slot, size) for s in rng.integers(0, slots, count)]


def _shape(store: Any, ranges: list[tuple[int, int]], batch: int, pids: dict[str, int]) -> dict[str, Any]:
    """Read ``ranges`` a batch at a time; the wall time and each process's CPU over it."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    start, got = time.perf_counter(), 0
    for k in range(0, len(ranges), batch):
        chunk = ranges[k:k + batch]
        # a batch's ranges are distinct slots, so each is its own GET
        chunk = sorted(set(chunk))
        got += sum(len(b) for b in store.read_ranges([("obj", o, n) for o, n in chunk]))
    out = {"seconds": time.perf_counter() - start, "bytes": got}
    out.update({f"{name}_cpu_s": cpu_seconds(pid) - before[name] for name, pid in pids.items()})
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from fastload.storage.remote import RemoteStore
    from tests.remote.latency_proxy import LatencyProxy
    from tests.remote.s3_server import start_s3_server

    server = start_s3_server(preload=str(REPO / "bench" / "ranged_moto.py"))
    fault = subprocess.Popen([sys.executable, "-c", _FAULT_PROXY, server.host, str(server.port), str(args.latency)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    latency = LatencyProxy(server.host, server.port, latency=args.latency).start()
    try:
        fault_port = int(fault.stdout.readline())  # type: ignore[union-attr]
        object_bytes = args.object_mb << 20
        server.make_bucket("cost")
        RemoteStore("s3://cost/x", server.storage_options()).put_bytes("obj", os.urandom(object_bytes))
        routes = {"direct": (None, None), "FaultProxy": (f"http://127.0.0.1:{fault_port}", fault.pid),
                  "LatencyProxy": (latency.url, latency.pid)}
        shapes = {"4 KiB x 64 in flight": (4096, args.small_n, 64),
                  "4 MiB x 8 in flight": (4 << 20, args.large_n, 8)}
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {r: {s: [] for s in shapes} for r in routes}
        for repeat in range(args.repeats + 1):  # repeat 0 warms up (connections, moto's caches)
            for route, (url, pid) in routes.items():  # side by side, in turn, each repeat
                store = RemoteStore("s3://cost/x", server.storage_options(url), max_in_flight=64)
                pids = {"server": server.process.pid, **({"proxy": pid} if pid else {})}  # type: ignore[union-attr]
                for shape, (size, count, batch) in shapes.items():
                    n = count if repeat else max(64, count // 10)
                    result = _shape(store, _spread(n, size, object_bytes, repeat), batch, pids)
                    result["requests"] = n
                    if repeat:
                        runs[route][shape].append(result)
        report = _report(runs, shapes)
    finally:
        latency.stop()
        fault.kill()
        fault.wait()
        server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps({"schema": "fastload-proxy-cost/1", "latency_s": args.latency,
                                               "cpus": os.cpu_count(), "report": report, "runs": runs}, indent=2) + "\n")
    return 0


def _report(runs: dict[str, dict[str, list[dict[str, Any]]]], shapes: dict[str, Any]) -> dict[str, Any]:
    """Per route and process: CPU-s per 1,000 small GETs, and per GB once that is taken off."""
    small, large = list(shapes)
    report: dict[str, Any] = {}
    print(f"{'route':<14} {'process':<8} {'CPU-s/1k req':>13} {'CPU-s/GB':>9} {'small s':>8} {'large s':>8}")
    for route, by_shape in runs.items():
        for proc in ("server", "proxy"):
            key = f"{proc}_cpu_s"
            if key not in by_shape[small][0]:
                continue
            per_req = statistics.median(r[key] / r["requests"] for r in by_shape[small])
            per_gb = statistics.median((r[key] - per_req * r["requests"]) / (r["bytes"] / 1e9)
                                       for r in by_shape[large])
            walls = [statistics.median(r["seconds"] for r in by_shape[s]) for s in shapes]
            report[f"{route} {proc}"] = {"cpu_s_per_1000_requests": per_req * 1000, "cpu_s_per_gb": per_gb,
                                         "wall_s": walls}
            print(f"{route:<14} {proc:<8} {per_req * 1000:>13.2f} {per_gb:>9.2f} {walls[0]:>8.2f} {walls[1]:>8.2f}")
    return report


if __name__ == "__main__":
    sys.exit(main())
