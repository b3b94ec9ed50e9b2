"""The ``fastload`` command: a thin argparse front over library calls, one function per subcommand."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from fastload.config import format_size
from fastload.errors import FastloadError
from fastload.format.layout import FILE_TYPES


def _count(n: int, noun: str) -> str:
    """``1 shard``, ``2 shards``, ``3 classes``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}{'es' if noun.endswith('s') else 's'}"


def _text(value: Any, default: str = "?") -> str:
    """A free-form manifest value as text: any JSON value prints, none crashes."""
    if value is None or value == "":
        return default
    return value if isinstance(value, str) else str(value)


def _copied(packed: dict) -> str:
    if packed.get("restart_markers"):
        return "none (JPEGs rewritten losslessly, see below; other files copied exactly)"
    return "none (bytes copied exactly)"


def _pack(args: argparse.Namespace) -> int:
    from fastload.converters import pack

    report = pack(args.src, args.out, format=args.format, shard_size=args.shard_size, workers=args.workers,
                  extensions=args.extensions, on_error=args.on_error, max_side=args.max_side,
                  quality=args.quality, overwrite=args.overwrite, progress=False if args.quiet else None,
                  layout=args.layout, check=args.check, max_pixels=args.max_pixels,
                  restart_markers=args.restart_markers, max_file_size=args.max_file_size,
                  storage_options=_storage_options(args), staging=args.staging, sidecars=args.sidecars,
                  file_columns=[c for c in (args.file_columns or "").split(",") if c], root=args.root,
                  allow_outside_root=args.allow_outside_root, sidecar_names=args.sidecar_names)
    print(report.summary())
    return 0


def _info(args: argparse.Namespace) -> int:
    from fastload.storage.location import is_remote
    from fastload.summary import describe

    info = describe(args.path, _storage_options(args))
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    # "packed" is free-form JSON: print what it holds, whatever the types
    packed = info["packed"] if isinstance(info["packed"], dict) else {}
    print(f"{info['path']}: {_count(info['records'], 'record')}, {format_size(info['payload_bytes'])} of "
          f"payload in {_count(len(info['shards']), info['storage'] + ' shard')} "
          f"({format_size(info['disk_bytes'])} {'in the store' if is_remote(info['path']) else 'on disk'})")
    print(f"  packed {_text(packed.get('created'))} by fastload {_text(packed.get('fastload_version'))} "
          f"from {_text(packed.get('source'))} ({_text(packed.get('layout'))} layout), "
          f"re-encode: {_text(packed.get('reencode'), '') or _copied(packed)}, "
          f"skipped: {_text(packed.get('skipped'), '0')}")
    markers = packed.get("restart_markers")
    if markers:
        kept = markers.get("kept_as_is", 0) if isinstance(markers, dict) else None
        print("  JPEGs rewritten losslessly with restart markers (fast crop decode)"
              + (f"; {_text(kept, '0')} kept as they were" if kept is not None else ""))
    if info["classes"]:
        print(f"  {_count(len(info['classes']), 'class')}:")
        for c in info["classes"]:
            print(f"    {c['label']:>5}  {c['name']}: {c['records']}")
    elif info["labels"]:
        print(f"  {_count(info['labels'], 'distinct label')} (no class names)")
    if info["unlabeled"]:
        print(f"  unlabeled records: {info['unlabeled']}")
    files = {k: v for k, v in info["fields"].items() if v in FILE_TYPES}
    values = {k: v for k, v in info["fields"].items() if k not in files}
    if values:
        print("  extra fields: " + ", ".join(f"{k} ({v})" for k, v in values.items()))
    if files:
        print("  file fields (a file per record, beside its own): "
              + ", ".join(f"{k} ({v})" for k, v in files.items()))
    for s in info["shards"]:
        print(f"  {s['file']}: {_count(s['records'], 'record')}, {format_size(s['bytes'])}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from fastload.verifier import verify

    report = verify(args.path, decode=args.decode, storage_options=_storage_options(args))
    for problem in report.problems:
        print(f"BAD {problem}", file=sys.stderr)
    for bad in report.bad:
        print(f"BAD {bad}", file=sys.stderr)
    status = "OK" if report.ok else "FAILED"
    fields = f" with their file fields ({', '.join(report.file_fields)})" if report.file_fields else ""
    print(f"{status}: {report.checked} of {_count(report.num_records, 'record')} checked{fields}"
          f"{' and decoded' if args.decode else ''}, {len(report.bad)} bad, "
          f"{_count(len(report.problems), 'dataset problem')}")
    return 0 if report.ok else 1


def _tune(args: argparse.Namespace) -> int:
    from fastload.dataset import PackedDataset
    from fastload.loading.tuner import tune

    dataset = PackedDataset(args.path, image_size=args.image_size, train=not args.eval,
                            storage_options=_storage_options(args))
    settings = tune(dataset, batch_size=args.batch_size, batches=args.batches)
    if args.json:
        print(json.dumps({"num_workers": settings.num_workers, "prefetch_factor": settings.prefetch_factor,
                          "pin_memory": settings.pin_memory, "mode": settings.mode,
                          "prefetch_batches": settings.prefetch_batches, "reasons": settings.reasons},
                         indent=2))
    else:
        print(settings)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from fastload.benchmark import bench

    _check_plot(args)
    from fastload.config import available_cpus

    # --prefetch-factor applies with or without --torch-workers (default: one worker per core)
    grid = [(w, args.prefetch_factor) for w in args.torch_workers or [available_cpus()]]
    report = bench(args.src, args.packed, batch_size=args.batch_size, image_size=args.image_size,
                   duration=args.duration, samples=args.samples, cold=args.cold, stages=args.stages,
                   model_step=_model_step(args), torch_grid=grid, dali=not args.no_dali,
                   temp_pack=args.temp_pack, work=args.work, repeats=args.repeats,
                   progress=False if args.quiet else None, storage_options=_storage_options(args))
    return _report(report, args)


def _doctor(args: argparse.Namespace) -> int:
    from fastload.benchmark import doctor

    _check_plot(args)
    report = doctor(args.src, batch_size=args.batch_size, image_size=args.image_size,
                    num_workers=args.num_workers, duration=args.duration, samples=args.samples,
                    cold=args.cold, model_step=_model_step(args), progress=False if args.quiet else None,
                    storage_options=_storage_options(args))
    return _report(report, args)


def _storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    from fastload.storage.location import parse_storage_options

    return parse_storage_options(args.storage_option) or None


def _renames(text: str) -> dict[str, str]:
    """``png=mask,npy=depth`` as ``{"png": "mask", "npy": "depth"}`` (--sidecar-names)."""
    pairs = [part.split("=") for part in text.split(",") if part]
    if not pairs or any(len(pair) != 2 or not all(pair) for pair in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: give EXT=NAME pairs, comma-separated: png=mask,npy=depth")
    return dict(pairs)


def _add_storage_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an fsspec option of the object store in a URL (repeat): endpoint_url=http://"
                        "host:9000, anon=true, key=..., secret=...; credentials otherwise come the "
                        "store's standard way (environment variables, config files)")


def _model_step(args: argparse.Namespace) -> float | None:
    return args.model_step_ms / 1000 if args.model_step_ms else None


def _check_plot(args: argparse.Namespace) -> None:
    if args.plot:  # before a minute of measuring, not after
        from fastload.optional import require

        require("matplotlib", "the benchmark chart (--plot)")


def _report(report: Any, args: argparse.Namespace) -> int:
    """Print the table; write JSON and PNG; 130 when Ctrl-C cut it short, 1 when a row failed."""
    print(report.table())
    if args.json:
        print(f"json: {report.write_json(args.json)}")
    if args.plot:
        from fastload.benchmark.plot import write_plot

        print(f"plot: {write_plot(report, args.plot)}")
    if report.interrupted:
        return 130
    return 1 if any(r.status == "failed" for r in report.runs) else 0


def _add_measure_options(p: argparse.ArgumentParser, duration: float) -> None:
    """Options bench and doctor share."""
    p.add_argument("--batch-size", type=int, default=64, help="samples per batch (default 64)")
    p.add_argument("--image-size", type=int, default=224, help="train crop side in pixels (default 224)")
    p.add_argument("--duration", type=float, default=duration,
                   help=f"timed seconds per loader run, after a 2-batch warm-up (default {duration:g})")
    p.add_argument("--samples", type=int, default=None, help="stop each run after N samples")
    p.add_argument("--cold", action="store_true",
                   help="drop the files from the page cache first (posix_fadvise); one pass per run")
    p.add_argument("--model-step-ms", type=float, default=None, metavar="MS",
                   help="stand in for a training step of MS ms per batch; shows the data-wait fraction")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON (schema fastload-bench/1)")
    p.add_argument("--plot", metavar="FILE.png", help="write a bar chart (needs matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress line")


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


def _whole_number(text: str) -> int | float:
    """``5e8`` as 500000000; anything else as written, for the library to judge."""
    value = float(text)
    return int(value) if value.is_integer() else value


def build_parser() -> argparse.ArgumentParser:
    from fastload import __version__
    from fastload.config import MAX_FILE_SIZE, MAX_PIXELS

    parser = argparse.ArgumentParser(prog="fastload", description="Pack small files into shards and load them fast.")
    parser.add_argument("--version", action="version", version=f"fastload {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pack", help="pack a folder or CSV/JSONL file list into LMDB/HDF5 shards")
    p.add_argument("src", help="ImageFolder tree, flat folder, .csv/.jsonl file list, or a store prefix "
                               "of small objects (s3://bucket/images/)")
    p.add_argument("-o", "--out", help="output dataset folder or store URL (s3://bucket/images.fl; "
                                       "default: SRC.fl next to SRC)")
    p.add_argument("--format", choices=["lmdb", "hdf5"], default="lmdb", help="shard storage (default lmdb)")
    p.add_argument("--shard-size", default="256MB", help="target shard size, e.g. 256MB, 1GiB (default 256MB)")
    p.add_argument("--workers", type=int, default=None, help="parallel reads: 8×N files read ahead, N decode threads (default 4 per core, 4..16)")
    p.add_argument("--extensions", nargs="+", default=None, metavar="EXT",
                   help="file extensions to pack (default: common image extensions)")
    p.add_argument("--on-error", choices=["fail", "skip"], default="fail",
                   help="fail on the first bad file (default) or skip it, counted and reported")
    p.add_argument("--max-side", type=int, default=None, help="re-encode: shrink the longer side to N px")
    p.add_argument("--quality", type=int, default=None, help="re-encode: JPEG quality (default 90 with --max-side)")
    p.add_argument("--layout", choices=["auto", "imagefolder", "flat", "list"], default="auto",
                   help="how to read SRC (default: auto-detect)")
    p.add_argument("--check", choices=["header", "decode"], default="header",
                   help="per-file check: header + end marker (fast, default) or full decode")
    p.add_argument("--sidecars", action="store_true",
                   help="files beside each image of its basename are its fields: 0001.json's keys, "
                        "0001.txt as field 'txt', 0001.png (a mask) or 0001.npy as file fields "
                        "'png', 'npy' (as WebDataset groups them)")
    p.add_argument("--sidecar-names", type=_renames, default=None, metavar="EXT=NAME,...",
                   help="with --sidecars, name a sidecar's field other than by its extension: "
                        "--sidecar-names png=mask,npy=depth,txt=caption")
    p.add_argument("--file-columns", default=None, metavar="NAMES",
                   help="a file list's columns (comma-separated) naming more files of each record, "
                        "packed beside its image: --file-columns mask,depth")
    p.add_argument("--root", metavar="DIR", default=None,
                   help="a file list's paths (and file columns) must lie inside DIR, symlinks resolved "
                        "(default: the list's folder)")
    p.add_argument("--allow-outside-root", action="store_true",
                   help="let a file list name files anywhere (absolute, ../); never /proc, /sys or /dev")
    p.add_argument("--restart-markers", action="store_true",
                   help="rewrite JPEGs losslessly (same pixels) with restart markers, so random crops "
                        "decode from the blocks under them alone: ~11%% less time per train crop, "
                        "slower pack")
    p.add_argument("--max-pixels", type=_whole_number, default=MAX_PIXELS,
                   help=f"refuse larger images as decompression bombs (default {MAX_PIXELS})")
    p.add_argument("--max-file-size", default=MAX_FILE_SIZE, metavar="SIZE",
                   help="skip (or, without --on-error skip, refuse) source files larger than this, "
                        f"before reading a byte (default {MAX_FILE_SIZE})")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a finished dataset at OUT once the new one is complete (only a "
                        "folder holding a fastload dataset alone; an identical re-run does nothing)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    _add_storage_option(p)
    p.add_argument("--staging", metavar="DIR", default=None,
                   help="with OUT in an object store: the local folder the shards are written in before "
                        "upload (default: in the cache folder, FASTLOAD_CACHE_DIR or ~/.cache/fastload)")
    p.set_defaults(run=_pack)

    p = sub.add_parser("info", help="show what a packed dataset holds")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_storage_option(p)
    p.set_defaults(run=_info)

    p = sub.add_parser("verify", help="recompute every record's checksum; exit 1 if anything is wrong")
    p.add_argument("path")
    p.add_argument("--decode", action="store_true", help="also decode every image")
    _add_storage_option(p)
    p.set_defaults(run=_verify)

    p = sub.add_parser("tune", help="measure a short grid of loader settings on a packed dataset")
    p.add_argument("path", help="packed dataset folder")
    p.add_argument("--batch-size", type=int, default=64, help="samples per batch (default 64)")
    p.add_argument("--image-size", type=int, default=224, help="crop side in pixels (default 224)")
    p.add_argument("--eval", action="store_true", help="tune the eval pipeline (default: train)")
    p.add_argument("--batches", type=int, default=6, help="timed batches per candidate (default 6)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_storage_option(p)
    p.set_defaults(run=_tune)

    p = sub.add_parser("bench", help="loaders side by side: torch ImageFolder vs fastload, same records")
    p.add_argument("src", help="image folder, packed dataset, or folder with --packed copies; or "
                               "their URLs in an object store (s3://bucket/images/: one GET per object)")
    p.add_argument("--packed", action="append", default=[], metavar="DATASET",
                   help="a packed dataset of SRC's files, a path or a URL (repeat for LMDB and HDF5)")
    _add_measure_options(p, duration=2.0)
    p.add_argument("--repeats", type=_at_least_one, default=3, metavar="N",
                   help="runs of each row, interleaved (A, B, C, A, B, C, ...); rows show the median "
                        "and the range, ratios are paired run by run (default 3)")
    p.add_argument("--stages", action="store_true",
                   help="also show each stage's timing behind the verdict (always given)")
    p.add_argument("--torch-workers", type=int, nargs="+", default=None, metavar="N",
                   help="num_workers of the tuned torch rows (default: one per core)")
    p.add_argument("--prefetch-factor", type=int, default=4, help="prefetch_factor of the tuned torch rows")
    p.add_argument("--no-dali", action="store_true", help="leave out the DALI backend row")
    p.add_argument("--temp-pack", type=int, default=2000, metavar="N",
                   help="with no packed copy of SRC, pack at most N of its files into a temporary dataset")
    p.add_argument("--work", default=None, help="where the temporary dataset goes, and the temporary "
                                                "node cache of datasets in a store (default: system temp)")
    _add_storage_option(p)
    p.set_defaults(run=_bench)

    p = sub.add_parser("doctor", help="time each loader stage alone and name the bottleneck")
    p.add_argument("src", help="image folder (ImageFolder + torch DataLoader) or packed dataset (fastload); "
                               "or its URL in an object store (s3://...)")
    _add_measure_options(p, duration=5.0)
    p.add_argument("--num-workers", type=int, default=None,
                   help="your loader's num_workers (folder default: one per core; packed: auto)")
    _add_storage_option(p)
    p.set_defaults(run=_doctor)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fastload`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # `fastload info ... | head`: the reader has what it wanted
        # Python would complain again while flushing stdout at exit: point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # what a shell reports for a process ended by SIGPIPE (128 + 13), as `cat | head`
    except KeyboardInterrupt:
        print("fastload: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except (FastloadError, ValueError, OSError) as exc:
        print(f"fastload: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
