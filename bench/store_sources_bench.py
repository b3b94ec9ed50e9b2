"""Packing WebDataset tars and a Parquet table from an object store against packing the same files
from the local disk, side by side in one run.

    python bench/store_sources_bench.py --samples 2000 --latency 0.02 --json bench/results/store_sources.json

The store is moto's server (``moto[server]``) on 127.0.0.1 behind the tests' FaultProxy, which adds
``--latency`` seconds before each request (a far store's round trip) and counts the requests. Rows:
tars from disk, tars from the store (a brace list), a Parquet table from disk, the same table from
the store; each the median of ``--repeats`` packs, with the GETs and the bytes each store row
asked for (a tar's bytes twice by design: once to list, once to pack). Nothing asserts on time.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import make_jpeg
from tests.remote.fault_proxy import FaultProxy
from tests.remote.s3_server import start_s3_server


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--per-tar", type=int, default=200)
    parser.add_argument("--latency", type=float, default=0.02, help="seconds added before each request")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def _make(root: Path, samples: int, per_tar: int) -> tuple[list[Path], Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    photos = [make_jpeg(320 + i % 64, 240 + i % 32, seed=i) for i in range(samples)]
    (root / "shards").mkdir()
    tars = []
    for t in range(0, samples, per_tar):
        path = root / "shards" / f"data-{t // per_tar:06d}.tar"
        with tarfile.open(path, "w") as tar:
            for k in range(t, min(t + per_tar, samples)):
                for ext, data in (("jpg", photos[k]), ("cls", str(k % 10).encode())):
                    info = tarfile.TarInfo(f"{k:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        tars.append(path)
    pq.write_table(pa.table({"jpg": photos, "label": [k % 10 for k in range(samples)]}), root / "table.parquet",
                   row_group_size=per_tar)
    return tars, root / "table.parquet"


def _timed(fn: object, repeats: int) -> float:
    times = []
    for k in range(repeats):
        start = time.perf_counter()
        fn(k)  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    from fastload.converters import pack

    args = parse_args(argv)
    server = start_s3_server()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, FaultProxy(server.host, server.port) as proxy:
        root = Path(tmp)
        tars, table = _make(root, args.samples, args.per_tar)
        bucket = server.make_bucket("bench")
        for path in [*tars, table]:
            server.client().put_object(Bucket=bucket, Key=path.relative_to(root).as_posix(), Body=path.read_bytes())
        proxy.latency = args.latency
        opts = server.storage_options(proxy.url)
        braces = f"shards/data-{{000000..{len(tars) - 1:06d}}}.tar"
        source_bytes = {"tars": sum(p.stat().st_size for p in tars), "table": table.stat().st_size}
        cases = [("tars, local disk", root / braces, None, "tars"), ("tars, store", f"s3://{bucket}/{braces}", opts, "tars"),
                 ("parquet, local disk", table, None, "table"), ("parquet, store", f"s3://{bucket}/table.parquet", opts, "table")]
        for name, src, options, kind in cases:
            proxy.clear()
            seconds = _timed(lambda k, src=src, options=options, name=name: pack(
                src, root / f"{name}-{k}.fl", progress=False, storage_options=options), args.repeats)
            gets = [r for r in proxy.requests if r.method == "GET"]
            rows.append({"row": name, "seconds": round(seconds, 3), "records/s": round(args.samples / seconds),
                         "GETs per pack": len(gets) // args.repeats if options else None,
                         "source MB": round(source_bytes[kind] / 1e6, 1)})
    server.stop()
    for row in rows:
        print(row)
    by = {r["row"]: r["seconds"] for r in rows}
    print(f"store/local time: tars {by['tars, store'] / by['tars, local disk']:.2f}x, "
          f"parquet {by['parquet, store'] / by['parquet, local disk']:.2f}x (latency {args.latency * 1000:.0f} ms)")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
