"""Far storage, the competitor's row (issue 16): LitData reading the benchmark photos from the same
S3 server through the same 20 ms proxy as ``bench/remote_bench.py``.

    python3.11 -m venv /tmp/streamvenv
    /tmp/streamvenv/bin/pip install torch==2.13.0   # first, the CPU build: unpinned pulls CUDA packages
    /tmp/streamvenv/bin/pip install -r bench/streaming_requirements.txt
    /tmp/streamvenv/bin/pip install --no-deps litdata==0.2.76
    /tmp/streamvenv/bin/python bench/streaming_row.py bench/data/photos --json /tmp/litdata.json

LitData stays out of fastload's dependencies and environment: it runs from its own virtualenv.
``pip install litdata`` requires torchvision (which would also pull torch 2.14 and its CUDA
packages); LitData only imports torchvision to (de)serialize decoded images and video, which this
benchmark never does, so it is installed ``--no-deps`` with the modules it imports on this path
(``bench/streaming_requirements.txt``).

What it does, in order:

1. converts the photos with ``litdata.optimize`` into LitData's chunk format on the local disk:
   one item per photo, ``{"image": <the JPEG file's bytes, not re-encoded>, "label": <class
   index>}``, ``chunk_bytes="64MB"`` (LitData's default and the size its ImageNet benchmark uses),
   no compression (JPEG does not compress), 2 workers;
2. starts moto's S3 server with ``bench/ranged_moto.py`` and uploads the chunks and index.json
   straight to it (boto3), then puts the tests' FaultProxy in front with ``--latency`` (20 ms)
   added to every request, exactly as ``remote_bench.py`` does;
3. runs each row in a fresh process (its own peak memory), the cache folder empty at the start of
   epoch 1, reading ``s3://bench/litdata`` with ``storage_options={"endpoint_url": <proxy>, ...}``.

LitData's own settings for a shuffled read from S3, as its README and benchmark use them:
``StreamingDataset(url, shuffle=True, cache_dir=..., max_cache_size=..., storage_options=...)``
(chunks shuffled across workers, items shuffled inside each chunk in blocks of 256;
``max_pre_download=2``; index.json fetched by boto3, each chunk by obstore's ``get_ranges`` in 4
parts, which obstore coalesces into one ranged GET of the whole chunk), read through
``StreamingDataLoader`` with ``num_workers`` = the cores (2). Each row runs once per
``--batch-decode`` value (default ``auto,all``): ``auto`` is LitData's default; with it, a worker
reading a chunk it shares with another worker (not memory-mapped, for safety) reads the whole
64 MB chunk file again for every window of ~150 items it deserializes, and its shuffle blocks
(256) straddle those windows; ``all`` deserializes each chunk once per visit. Rows:

* ``raw, in process``: iterate the dataset in the row process (no loader), one epoch cold, one
  warm: the sample bytes, no decode (what remote_bench's ``packed, cache cold+warm`` row reads);
* ``raw, 2 workers``: the same through ``StreamingDataLoader(batch_size=64, num_workers=2)``,
  the bytes collated into lists;
* ``train, 2 workers``: decode + RandomResizedCrop 224 + flip (Pillow, full decode, torchvision's
  crop draw) to a uint8 3×224×224 tensor, ``StreamingDataLoader(batch_size=64, num_workers=2)``,
  cold then warm (remote_bench's ``train, store cold+warm``);
* ``transform ceiling``: that transform alone over the photos already in memory, in a plain torch
  DataLoader with the same workers (no LitData, no store): what the cores allow the train rows.

Reported per row as remote_bench reports them: records/s per epoch, the requests the proxy saw
(by method) and the bytes they asked for (a ranged GET's range, a whole GET's object size), the
store's and proxy's CPU, and memory: ``peak_mb`` is the row process's VmHWM (remote_bench's
quantity; fastload decodes in threads, so its VmHWM is all of it), ``tree_rss_mb`` /
``tree_pss_mb`` the highest sum over the row process and its worker processes, sampled every
0.25 s (RSS counts pages shared after fork once per process; PSS splits them); also the CPU the
reader used (row process and workers) and its minor page faults. Nothing asserts on time; each
row checks that it read every photo once per epoch and every byte of it.

One change to LitData, made in each row process (``_allow_http``): its obstore client is built
with fixed options that cannot allow plain HTTP, which the local proxy speaks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Self

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from remote_bench import _cpu_seconds, _range_length  # noqa: E402 - the same measures as fastload's rows

BUCKET, PREFIX = "bench", "litdata"
IMAGE_SIZE = 224


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos", help="the local photo folder (ImageFolder tree)")
    p.add_argument("--records", type=int, default=None,
                   help="convert only this many photos (a fixed, seeded subset; default: all)")
    p.add_argument("--latency", type=float, default=0.02, help="seconds added to every request (0.02)")
    p.add_argument("--chunk-bytes", default="64MB", help="optimize()'s chunk_bytes (64MB)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                   help="StreamingDataLoader workers (default: the cores)")
    p.add_argument("--batch-decode", default="auto,all",
                   help="StreamingDataset's batch_decode values to run each row with, separated by ',' "
                        "(auto,all): how many items LitData deserializes together")
    p.add_argument("--epochs", type=int, default=2, help="epochs per row: cold, then warm (2)")
    p.add_argument("--work", default=None,
                   help="folder for the converted chunks and the caches (default: a temp folder, "
                        "removed after)")
    p.add_argument("--rows", default=None, help="only these rows (names separated by ';')")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--row", default=None, help=argparse.SUPPRESS)  # internal: run one row, print JSON
    p.add_argument("--row-args", default="{}", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# --- conversion -------------------------------------------------------------------------------------

def list_photos(root: Path, records: int | None) -> list[tuple[str, int]]:
    """``(path, label)`` for each photo, labels the sorted class folders' indexes (ImageFolder's);
    ``records`` picks a fixed seeded subset, kept in folder order."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    items = [(str(path), label) for label, name in enumerate(classes)
             for path in sorted((root / name).rglob("*")) if path.is_file()]
    if records is not None and records < len(items):
        import numpy as np

        keep = np.sort(np.random.default_rng(0).permutation(len(items))[:records])
        items = [items[i] for i in keep]
    return items


def photo_item(item: tuple[str, int]) -> dict[str, Any]:
    """One LitData item: the file's JPEG bytes as they are (not re-encoded), and its label."""
    path, label = item
    return {"image": Path(path).read_bytes(), "label": label}


def convert(items: list[tuple[str, int]], out: Path, chunk_bytes: str, workers: int) -> float:
    """``litdata.optimize`` into ``out``; returns the seconds it took."""
    # optimize() stages in $TMPDIR/chunks and $TMPDIR/data and deletes both folders when done:
    # on a shared /tmp those names are anyone's, so they go under the work folder
    os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = str(out.parent / "optimize-chunks")
    os.environ["DATA_OPTIMIZER_DATA_CACHE_FOLDER"] = str(out.parent / "optimize-data")
    from litdata import optimize

    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    optimize(fn=photo_item, inputs=items, output_dir=str(out), chunk_bytes=chunk_bytes,
             num_workers=workers, mode="overwrite", verbose=False)
    return time.perf_counter() - start


def upload(out: Path, server: Any) -> dict[str, int]:
    """Every file of the converted dataset to ``s3://bench/litdata/``, straight to the server (no
    proxy); index.json last. Returns each object's key and size."""
    client = server.client()
    server.make_bucket(BUCKET)
    files = sorted((p for p in out.rglob("*") if p.is_file()), key=lambda p: p.name == "index.json")
    sizes = {}
    for path in files:
        key = f"{PREFIX}/{path.relative_to(out).as_posix()}"
        client.upload_file(str(path), BUCKET, key)
        sizes[key] = path.stat().st_size
    return sizes


# --- rows (each in its own process) ----------------------------------------------------------------

def _status_kb(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _pss_kb(pid: int | str) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


class TreeMemory:
    """Samples the summed RSS and PSS of this process and its descendants every ``every`` seconds
    and keeps the highest of each (worker processes are not in this process's VmHWM)."""

    def __init__(self, every: float = 0.25) -> None:
        self.every, self.rss_kb, self.pss_kb = every, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _tree(self) -> list[int]:
        pids, k = [os.getpid()], 0
        while k < len(pids):
            try:
                children = Path(f"/proc/{pids[k]}/task/{pids[k]}/children").read_text().split()
            except OSError:
                children = []
            pids += [int(c) for c in children]
            k += 1
        return pids

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            rss = pss = 0
            for pid in self._tree():
                try:
                    rss, pss = rss + _status_kb(pid, "VmRSS"), pss + _pss_kb(pid)
                except OSError:  # a worker that just exited
                    pass
            self.rss_kb, self.pss_kb = max(self.rss_kb, rss), max(self.pss_kb, pss)


def _allow_http() -> None:
    """Let LitData's obstore client speak plain HTTP to the proxy. LitData builds its obstore
    S3Store with fixed client options (a 200 s timeout, 32 idle connections) and no way to pass
    ``allow_http``, so without this every chunk GET to an ``http://`` endpoint fails with
    ``HTTP error: builder error ... BadScheme``; a real S3 endpoint is https and needs nothing."""
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": "true"}


def _dataset(a: dict[str, Any], **kw: Any) -> Any:
    from litdata import StreamingDataset

    _allow_http()
    decode = a["batch_decode"]
    return StreamingDataset(a["url"], cache_dir=a["cache_dir"], shuffle=True, seed=0,
                            max_cache_size=a["cache_limit"], storage_options=a["options"],
                            batch_decode=int(decode) if decode.isdigit() else decode, **kw)


def _collate_bytes(items: list[dict[str, Any]]) -> list[bytes]:
    """The batch's sample bytes. LitData hands out each image as a memoryview into its chunk,
    which cannot be pickled back from a worker (the worker's queue thread dies with ``TypeError:
    cannot pickle memoryview objects`` and the loader waits forever), so they are copied here."""
    return [bytes(item["image"]) for item in items]


_rng: tuple[int, Any] | None = None


def _process_rng() -> Any:
    """A generator of this process's own (forked workers must not draw the same crops)."""
    global _rng
    import numpy as np

    if _rng is None or _rng[0] != os.getpid():
        _rng = (os.getpid(), np.random.default_rng())
    return _rng[1]


def _crop_box(width: int, height: int, rng: Any) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` (scale 0.08-1, ratio 3/4-4/3)."""
    import math

    area = width * height
    for _ in range(10):
        target = area * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
            return left, top, w, h
    ratio = width / height
    w, h = ((width, round(width * 3 / 4)) if ratio < 3 / 4 else
            (round(height * 4 / 3), height) if ratio > 4 / 3 else (width, height))
    return (width - w) // 2, (height - h) // 2, w, h


def train_sample(item: dict[str, Any]) -> tuple[Any, int]:
    """Decode, RandomResizedCrop 224 + horizontal flip: a uint8 3×224×224 tensor and the label
    (``Compose([RandomResizedCrop(224), RandomHorizontalFlip(), PILToTensor()])``)."""
    import io

    import numpy as np
    import torch
    from PIL import Image

    rng = _process_rng()
    img = Image.open(io.BytesIO(item["image"])).convert("RGB")
    left, top, w, h = _crop_box(img.width, img.height, rng)
    img = img.resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.asarray(img).transpose(2, 0, 1).copy()), item["label"]


def row_raw(a: dict[str, Any]) -> dict[str, Any]:
    """Shuffled raw reads (the sample bytes, no decode): the dataset iterated in this process, or
    through StreamingDataLoader with ``workers`` processes when ``workers`` > 0."""
    from litdata import StreamingDataLoader

    ds = _dataset(a)
    source: Any = ds
    if a["workers"]:
        source = StreamingDataLoader(ds, batch_size=64, num_workers=a["workers"],
                                     collate_fn=_collate_bytes)
    epochs = []
    for _ in range(a["epochs"]):
        start, n, got = time.perf_counter(), 0, 0
        if a["workers"]:
            for batch in source:
                n, got = n + len(batch), got + sum(len(b) for b in batch)
        else:
            for item in source:
                n, got = n + 1, got + len(item["image"])
        epochs.append({"records": n, "seconds": time.perf_counter() - start, "bytes": got})
    return {**epochs[0], "epochs": epochs}


def row_train(a: dict[str, Any]) -> dict[str, Any]:
    """The train pipeline: ``train_sample`` in StreamingDataLoader's worker processes."""
    from litdata import StreamingDataLoader

    loader = StreamingDataLoader(_dataset(a, transform=train_sample), batch_size=64,
                                 num_workers=a["workers"])
    epochs, images = _timed_epochs(loader, a["epochs"])
    return {**epochs[0], "epochs": epochs, "batch_shape": list(images.shape), "dtype": str(images.dtype)}


def _timed_epochs(loader: Any, count: int) -> tuple[list[dict[str, Any]], Any]:
    """``count`` epochs of ``(images, labels)`` batches: records and seconds of each, and the last
    batch's images."""
    epochs, images = [], None
    for _ in range(count):
        start, n = time.perf_counter(), 0
        for images, _labels in loader:
            n += len(images)
        epochs.append({"records": n, "seconds": time.perf_counter() - start})
    return epochs, images


class _InMemory:
    """The photos' bytes already in memory, as LitData items (for the transform's own ceiling)."""

    def __init__(self, photos: list[tuple[str, int]]) -> None:
        self.items = [{"image": Path(p).read_bytes(), "label": label} for p, label in photos]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return train_sample(self.items[i])


def row_ceiling(a: dict[str, Any]) -> dict[str, Any]:
    """``train_sample`` alone: the photos in memory, a plain torch DataLoader with the same workers
    and batch size, shuffled; no LitData, no store. What this machine's cores allow the train rows."""
    import torch

    photos = _InMemory(list_photos(Path(a["photos"]), a["records"]))
    loader = torch.utils.data.DataLoader(photos, batch_size=64, shuffle=True, num_workers=a["workers"])
    epochs, _ = _timed_epochs(loader, a["epochs"])
    return {**epochs[0], "epochs": epochs}


ROWS = {"raw": row_raw, "train": row_train, "ceiling": row_ceiling}


# --- the run ----------------------------------------------------------------------------------------

def _asked_bytes(request: Any, sizes: dict[str, int]) -> int:
    """Bytes a request asked the store for: a GET's range, or the whole object without one."""
    if request.method != "GET":
        return 0
    if request.headers.get("range", "").startswith("bytes="):
        return _range_length(request)
    key = request.path.split("?", 1)[0].lstrip("/").partition("/")[2]
    return sizes.get(key, 0)


def _run_row(name: str, kind: str, args: dict[str, Any], proxy: Any, server_pid: int,
             sizes: dict[str, int], expect: tuple[int, int]) -> dict[str, Any]:
    shutil.rmtree(args["cache_dir"], ignore_errors=True)  # cold
    proxy.clear()
    server_cpu, proxy_cpu = _cpu_seconds(server_pid), _cpu_seconds(os.getpid())
    done = subprocess.run([sys.executable, __file__, "x", "--row", kind, "--row-args", json.dumps(args)],
                          capture_output=True, text=True, check=False)
    shutil.rmtree(args["cache_dir"], ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"row {name!r} failed:\n{done.stderr[-6000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["server_cpu_s"] = _cpu_seconds(server_pid) - server_cpu
    result["proxy_cpu_s"] = _cpu_seconds(os.getpid()) - proxy_cpu
    requests = proxy.requests
    result["requests"] = len(requests)
    methods = sorted({r.method for r in requests})
    result["requests_by_method"] = {m: sum(r.method == m for r in requests) for m in methods}
    result["range_gets"] = sum(r.method == "GET" and "range" in r.headers for r in requests)
    result["asked_bytes"] = sum(_asked_bytes(r, sizes) for r in requests)
    result["name"] = name
    for e in result["epochs"]:
        e["rate"] = e["records"] / e["seconds"]
        # every photo once per epoch (records), every byte of each (raw rows)
        e["complete"] = e["records"] == expect[0] and e.get("bytes", expect[1]) == expect[1]
    result["rate"] = result["epochs"][0]["rate"]
    total = sum(e["seconds"] for e in result["epochs"])
    rates = ", ".join(f"{e['rate']:,.0f}" for e in result["epochs"])
    print(f"{name:<26} {rates:>16} records/s  {result['records']:>6} records  {result['requests']:>5} requests  "
          f"{result['asked_bytes'] / 1e6:>6,.0f} MB  peak {result['peak_mb']:.0f} MB (tree RSS "
          f"{result['tree_rss_mb']:.0f}, PSS {result['tree_pss_mb']:.0f})  store+proxy CPU "
          f"{(result['server_cpu_s'] + result['proxy_cpu_s']) / total:.2f} cores"
          + ("" if all(e["complete"] for e in result["epochs"]) else "  INCOMPLETE"), flush=True)
    return result


def _one_row(args: argparse.Namespace) -> int:
    import logging
    import warnings

    logging.getLogger("litdata").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    with TreeMemory() as tree:
        result = ROWS[args.row](json.loads(args.row_args))
    result["peak_mb"] = _status_kb("self", "VmHWM") / 1024
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    result["reader_cpu_s"] = own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime
    result["reader_sys_s"] = own.ru_stime + workers.ru_stime
    result["minor_faults"] = own.ru_minflt + workers.ru_minflt
    result["tree_rss_mb"], result["tree_pss_mb"] = tree.rss_kb / 1024, tree.pss_kb / 1024
    print(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.row:
        return _one_row(args)
    import litdata

    from tests.remote.fault_proxy import FaultProxy
    from tests.remote.s3_server import KEY, REGION, SECRET, start_s3_server

    work = Path(args.work or tempfile.mkdtemp(prefix="litdata-bench-"))
    items = list_photos(Path(args.photos), args.records)
    expect = (len(items), sum(os.path.getsize(p) for p, _ in items))
    rows: list[dict[str, Any]] = []
    server = None
    try:
        out = work / "optimized"
        seconds = convert(items, out, args.chunk_bytes, args.workers)
        stored = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        print(f"litdata {litdata.__version__}: {len(items)} photos ({expect[1] / 1e6:,.0f} MB) converted in "
              f"{seconds:.1f} s to {len(list(out.glob('*.bin')))} chunks ({stored / 1e6:,.0f} MB)", flush=True)
        server = start_s3_server(preload=str(REPO / "bench" / "ranged_moto.py"))
        t = time.perf_counter()
        sizes = upload(out, server)
        print(f"uploaded in {time.perf_counter() - t:.0f} s", flush=True)
        with FaultProxy(server.host, server.port) as proxy:
            proxy.latency = args.latency
            common = {"url": f"s3://{BUCKET}/{PREFIX}", "epochs": args.epochs,
                      "cache_limit": f"{max(1, 4 * stored // 2**30)}GB",
                      "options": {"endpoint_url": proxy.url, "aws_access_key_id": KEY,
                                  "aws_secret_access_key": SECRET, "region_name": REGION}}

            def row(name: str, kind: str, **extra: Any) -> None:
                if args.rows is None or name in args.rows.split(";"):
                    cache = str(work / f"cache-{len(rows)}")
                    rows.append(_run_row(name, kind, {**common, "cache_dir": cache, **extra}, proxy,
                                         server.process.pid, sizes, expect))

            row(f"transform ceiling, {args.workers} workers", "ceiling", workers=args.workers,
                photos=args.photos, records=args.records, epochs=1)
            for decode in args.batch_decode.split(","):
                row(f"raw, in process, bd={decode}", "raw", workers=0, batch_decode=decode)
                row(f"raw, {args.workers} workers, bd={decode}", "raw", workers=args.workers,
                    batch_decode=decode)
                row(f"train, {args.workers} workers, bd={decode}", "train", workers=args.workers,
                    batch_decode=decode)
    finally:
        if server is not None:
            server.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps({
            "schema": "fastload-streaming-row/1", "competitor": f"litdata {litdata.__version__}",
            "latency_s": args.latency, "chunk_bytes": args.chunk_bytes, "workers": args.workers,
            "batch_decode": args.batch_decode,
            "photos": expect[0], "photo_bytes": expect[1], "converted_bytes": stored,
            "convert_seconds": seconds,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "platform": platform.platform()},
            "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
