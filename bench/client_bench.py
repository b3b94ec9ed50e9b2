"""The two object-store clients side by side: obstore (the default for s3://) and fsspec/s3fs, on the same rows.

    python bench/client_bench.py bench/data/photos.fl --json bench/results/clients.json

The packed dataset is uploaded to moto's S3 server (ranged GETs that read only the range:
bench/ranged_moto.py); with ``--latency`` > 0 (default 20 ms) the tests' LatencyProxy (its own
process, bodies spliced) sits in front. Every row runs in a fresh process with
``FASTLOAD_STORE_CLIENT`` naming the client, the clients alternating, ``--repeats`` times (medians):

* ``import + client``: the process's VmRSS after ``RemoteStore(url).stat("manifest.json")`` (the
  client imported, made, and one request answered), and that minus the VmRSS before the import;
* ``4 MiB ranges, in memory``: every aligned 4 MiB piece of every shard, shuffled, 8 at a time (as a
  cold epoch fetches them), through ``read_ranges``: client CPU-seconds per GB and MB/s;
* ``4 MiB pieces, into a file``: the same pieces through ``read_into``, each body written into a file
  as it arrives (the node cache's path);
* ``raw cold, no cache``: ``--records`` shuffled records of ``PackedDataset(url, cache_limit=0)``, a
  batch of 64 at a time: records/s and CPU-seconds per GB.

The client's CPU is the row process's own (all its threads: obstore's runtime runs in-process).
A row process that aborts as it exits, after printing its result, is counted (``aborted_at_exit``):
obstore's asyncio bindings did that now and then (fastload now uses its blocking calls). Nothing
asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CLIENTS = ("obstore", "fsspec")
ROWS = ("import + client", "4 MiB ranges, in memory", "4 MiB pieces, into a file", "raw cold, no cache")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("packed", nargs="?", help="a packed dataset folder (bench/data/photos.fl)")
    p.add_argument("--latency", type=float, default=0.02, help="seconds the proxy adds to each request (0: none)")
    p.add_argument("--records", type=int, default=2000, help="records of the raw cold row (2000)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each row and client (medians; 3)")
    p.add_argument("--in-flight", type=int, default=64, help="requests in flight (64)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--row", choices=ROWS, help=argparse.SUPPRESS)
    p.add_argument("--row-args", default="{}", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _pieces(a: dict[str, Any]) -> list[tuple[str, int, int]]:
    import numpy as np

    from fastload.format import read_manifest
    from fastload.storage.remote_reads import FILL_PIECE

    manifest = read_manifest(a["local"])
    pieces = [(s.file, start, min(FILL_PIECE, s.bytes - start))
              for s in manifest.shards for start in range(0, s.bytes, FILL_PIECE)]
    return [pieces[i] for i in np.random.default_rng(0).permutation(len(pieces))]


class _FileSink:
    """A span of a scratch file written as the body arrives (what a cache entry's span does)."""

    def __init__(self, fd: int, offset: int) -> None:
        self.fd, self.offset, self.position = fd, offset, offset

    def write(self, buffer: Any) -> None:
        view = memoryview(buffer).cast("B")
        while view:
            written = os.pwrite(self.fd, view, self.position)
            view, self.position = view[written:], self.position + written

    def restart(self) -> None:
        self.position = self.offset


def run_row(row: str, a: dict[str, Any]) -> dict[str, Any]:
    """One row in this process; the seconds, bytes and CPU-seconds of its timed part."""
    before = _rss_mb()
    from fastload.storage.remote import RemoteStore

    store = RemoteStore(a["url"], a["options"], max_in_flight=a["in_flight"])
    if row == "import + client":
        store.stat("manifest.json")
        return {"client": store.client.name, "rss_mb": _rss_mb(), "added_mb": _rss_mb() - before}
    if row == "raw cold, no cache":
        import numpy as np

        from fastload import PackedDataset

        ds = PackedDataset(a["url"], storage_options=a["options"], cache_limit=0)
        ds.reader.remote.store.max_in_flight = a["in_flight"]
        order = np.random.default_rng(0).permutation(len(ds))[:a["records"]].tolist()
        cpu, start, got = _cpu(), time.perf_counter(), 0
        for k in range(0, len(order), 64):
            got += sum(len(p) for p in ds.reader.read_many(order[k:k + 64]))
        out = {"records": len(order)}
    else:
        pieces = _pieces(a)
        fd = os.open(os.path.join(a["work"], f"sink-{os.getpid()}"), os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            cpu, start, got = _cpu(), time.perf_counter(), 0
            for k in range(0, len(pieces), 8):
                group = pieces[k:k + 8]
                if row == "4 MiB ranges, in memory":
                    got += sum(len(b) for b in store.read_ranges(group))
                else:
                    sinks = [_FileSink(fd, n * 4 * 2**20) for n in range(len(group))]
                    store.read_into(group, sinks)
                    got += sum(length for _, _, length in group)
            out = {"pieces": len(pieces)}
        finally:
            os.close(fd)
            os.unlink(os.path.join(a["work"], f"sink-{os.getpid()}"))
    seconds, cpu = time.perf_counter() - start, _cpu() - cpu
    return {**out, "client": store.client.name, "seconds": seconds, "bytes": got, "cpu_s": cpu,
            "cpu_s_per_gb": cpu / (got / 1e9), "mb_s": got / 1e6 / seconds}


def _in_fresh_process(row: str, client: str, a: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "FASTLOAD_STORE_CLIENT": client, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, __file__, "--row", row, "--row-args", json.dumps(a)], env=env,
                          capture_output=True, text=True, check=False)
    lines = done.stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("{"):
        raise RuntimeError(f"row {row!r} with {client} failed ({done.returncode}): {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    # obstore's asyncio bindings aborted a process now and then as it exits (a tokio thread waking an
    # asyncio loop during finalization): the row's work was done and printed; the exit is counted
    result["aborted_at_exit"] = int(done.returncode != 0)
    if result["client"] != client:
        raise RuntimeError(f"row {row!r} asked for {client} but ran with {result['client']}")
    return result


def _upload(packed: Path, server: Any) -> str:
    from fastload.storage.remote import RemoteStore

    store = RemoteStore(f"s3://{server.make_bucket('clients')}/photos.fl", server.storage_options())
    for path in sorted(p for p in packed.rglob("*") if p.is_file() and p.name != "manifest.json"):
        store.put_file(path, path.relative_to(packed).as_posix())
    store.put_file(packed / "manifest.json", "manifest.json")
    return store.url


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float)) and k != "aborted_at_exit"]
    return {**{k: statistics.median(r[k] for r in runs) for k in keys},
            "aborted_at_exit": sum(r["aborted_at_exit"] for r in runs), "runs": runs}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.row:
        print(json.dumps(run_row(args.row, json.loads(args.row_args))), flush=True)
        return 0
    if not args.packed:
        raise SystemExit("give a packed dataset folder (bench/data/photos.fl)")
    sys.path.insert(0, str(REPO))
    import tempfile

    from tests.remote.latency_proxy import LatencyProxy
    from tests.remote.s3_server import start_s3_server

    print(f"load average before: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    server = start_s3_server(preload=str(REPO / "bench" / "ranged_moto.py"))
    results: dict[str, dict[str, Any]] = {}
    try:
        url = _upload(Path(args.packed), server)
        with LatencyProxy(server.host, server.port, latency=args.latency) as proxy, \
                tempfile.TemporaryDirectory(prefix="fastload-client-bench-") as work:
            opts = server.storage_options(proxy.url if args.latency > 0 else None)
            a = {"url": url, "options": opts, "in_flight": args.in_flight, "local": str(args.packed),
                 "records": args.records, "work": work}
            for row in ROWS:
                runs: dict[str, list[dict[str, Any]]] = {client: [] for client in CLIENTS}
                for k in range(args.repeats):  # alternating, the first client changing each round
                    for client in CLIENTS[::1 if k % 2 == 0 else -1]:
                        runs[client].append(_in_fresh_process(row, client, a))
                results[row] = {client: _summary(runs[client]) for client in CLIENTS}
                _print(row, results[row])
    finally:
        server.stop()
    load_after = Path("/proc/loadavg").read_text().strip()
    print(f"load average after: {load_after}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"schema": "fastload-client-bench/1", "latency_s": args.latency,
                                               "records": args.records, "repeats": args.repeats,
                                               "load_after": load_after, "rows": results}, indent=1))
    return 0


def _print(row: str, by: dict[str, dict[str, Any]]) -> None:
    for client, got in by.items():
        if "rss_mb" in got:
            text = f"VmRSS {got['rss_mb']:.0f} MB ({got['added_mb']:+.0f} MB for import + client + one request)"
        else:
            rate = f"{got['records'] / got['seconds']:.0f} records/s, " if "records" in got else ""
            text = f"{rate}{got['mb_s']:.0f} MB/s, {got['cpu_s_per_gb']:.2f} CPU-s/GB"
        aborted = f" ({got['aborted_at_exit']} of the runs aborted at exit)" if got["aborted_at_exit"] else ""
        print(f"{row:28s} {client:8s} {text}{aborted}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
