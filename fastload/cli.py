"""The ``fastload`` command: a thin argparse front over library calls, one function per subcommand."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from fastload.config import format_size
from fastload.errors import FastloadError


def _pack(args: argparse.Namespace) -> int:
    from converters import pack

    report = pack(args.src, args.out, format=args.format, shard_size=args.shard_size, workers=args.workers,
                  extensions=args.extensions, on_error=args.on_error, max_side=args.max_side,
                  quality=args.quality, overwrite=args.overwrite, progress=False if args.quiet else None,
                  layout=args.layout, check=args.check, max_pixels=args.max_pixels)
    print(report.summary())
    return 0


def _info(args: argparse.Namespace) -> int:
    from fastload.summary import describe

    info = describe(args.path)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    packed = info["packed"]
    print(f"{info['path']}: {info['records']} records, {format_size(info['payload_bytes'])} of payload "
          f"in {len(info['shards'])} {info['storage']} shards ({format_size(info['disk_bytes'])} on disk)")
    print(f"  packed {packed.get('created', '?')} by fastload {packed.get('fastload_version', '?')} "
          f"from {packed.get('source', '?')} ({packed.get('layout', '?')} layout), "
          f"re-encode: {packed.get('reencode') or 'none (bytes copied exactly)'}, skipped: {packed.get('skipped', 0)}")
    if info["classes"]:
        print(f"  {len(info['classes'])} classes:")
        for c in info["classes"]:
            print(f"    {c['label']:>5}  {c['name']}: {c['records']}")
    if info["unlabeled"]:
        print(f"  unlabeled records: {info['unlabeled']}")
    if info["fields"]:
        print("  extra fields: " + ", ".join(f"{k} ({v})" for k, v in info["fields"].items()))
    for s in info["shards"]:
        print(f"  {s['file']}: {s['records']} records, {format_size(s['bytes'])}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from fastload.verifier import verify

    report = verify(args.path, decode=args.decode)
    for problem in report.problems:
        print(f"BAD {problem}", file=sys.stderr)
    for bad in report.bad:
        print(f"BAD {bad}", file=sys.stderr)
    status = "OK" if report.ok else "FAILED"
    print(f"{status}: {report.checked} of {report.num_records} records checked"
          f"{' and decoded' if args.decode else ''}, {len(report.bad)} bad, "
          f"{len(report.problems)} dataset problems")
    return 0 if report.ok else 1


def build_parser() -> argparse.ArgumentParser:
    from converters.checks import DEFAULT_MAX_PIXELS

    parser = argparse.ArgumentParser(prog="fastload", description="Pack small files into shards and load them fast.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pack", help="pack a folder or CSV/JSONL file list into LMDB/HDF5 shards")
    p.add_argument("src", help="ImageFolder tree, flat folder, or .csv/.jsonl file list")
    p.add_argument("-o", "--out", help="output dataset folder (default: SRC.fl next to SRC)")
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
    p.add_argument("--max-pixels", type=int, default=DEFAULT_MAX_PIXELS,
                   help=f"refuse larger images as decompression bombs (default {DEFAULT_MAX_PIXELS})")
    p.add_argument("--overwrite", action="store_true", help="replace a finished dataset at OUT")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_pack)

    p = sub.add_parser("info", help="show what a packed dataset holds")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(run=_info)

    p = sub.add_parser("verify", help="recompute every record's checksum; exit 1 if anything is wrong")
    p.add_argument("path")
    p.add_argument("--decode", action="store_true", help="also decode every image")
    p.set_defaults(run=_verify)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fastload`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print("fastload: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    except (FastloadError, ValueError, OSError) as exc:
        print(f"fastload: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
