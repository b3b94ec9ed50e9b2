"""The ``fastload`` command's arguments: every subcommand's options, their types and defaults."""

from __future__ import annotations

import argparse

from fastload.cli.info import info_command
from fastload.cli.measure import bench_command, doctor_command, tune_command
from fastload.cli.pack import pack_command
from fastload.cli.show import show_command
from fastload.cli.verify import verify_command

SOURCES = ("an image folder (ImageFolder or flat), a CSV/JSONL file list, WebDataset tars (a .tar, .tar.gz, "
           ".tar.xz or .tar.zst, a folder of them, or a quoted brace list 'data-{000..099}.tar'), tables "
           "(.parquet, .arrow, .feather, a folder of them, a Hugging Face save_to_disk folder), or a store "
           "URL of images, .tar or .parquet files (s3://bucket/images/)")


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


def _add_measure_options(p: argparse.ArgumentParser, duration: float) -> None:
    """Options bench and doctor share."""
    p.add_argument("--batch-size", type=int, default=64, help="samples per batch (default 64)")
    p.add_argument("--image-size", type=int, default=224, help="train crop side in pixels (default 224)")
    p.add_argument("--duration", type=float, default=duration,
                   help=f"timed seconds per loader run, after a 2-batch warm-up (default {duration:g})")
    p.add_argument("--samples", type=int, default=None, help="stop each run after N samples")
    p.add_argument("--cold", action="store_true",
                   help="drop the files from the page cache first (posix_fadvise); one pass per run")
    _add_step_options(p)
    p.add_argument("--json", metavar="FILE", help="write the report as JSON (schema fastload-bench/1)")
    p.add_argument("--plot", metavar="FILE.png", help="write a bar chart (needs matplotlib)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")


def _add_step_options(p: argparse.ArgumentParser) -> None:
    """The training step bench, doctor and tune weigh: a torchvision model, or a slept stand-in."""
    p.add_argument("--model", metavar="NAME", default=None,
                   help="train this torchvision model (resnet50, resnet18, ...) after each batch, bf16 "
                        "and channels-last on CUDA, float32 on the CPU: its headspace (the step alone on "
                        "a batch already on the device), then each loader under it (needs torchvision)")
    p.add_argument("--model-step-ms", type=float, default=None, metavar="MS",
                   help="stand in for a training step with a sleep of MS ms per batch (prefer --model)")


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be at least 1")
    return value


def _on_error(text: str) -> str:
    """``--on-error``: ``fail``, the spelling packs had first, is ``raise`` (the loader's)."""
    return "raise" if text == "fail" else text


def _whole_number(text: str) -> int | float:
    """``5e8`` as 500000000; anything else as written, for the library to judge."""
    value = float(text)
    return int(value) if value.is_integer() else value


def build_parser() -> argparse.ArgumentParser:
    from fastload import __version__
    from fastload.config import MAX_FILE_SIZE, MAX_PIXELS

    parser = argparse.ArgumentParser(
        prog="fastload", description=f"Pack small files into shards and load them fast. A source is {SOURCES}.")
    parser.add_argument("--version", action="version", version=f"fastload {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("pack", help="pack a folder, file list, WebDataset tars, tables or a store prefix into "
                                    "LMDB/HDF5 shards", description=f"Pack SRC: {SOURCES}.")
    p.add_argument("src", metavar="SRC", help=f"what to pack: {SOURCES}")
    p.add_argument("-o", "--out", help="output dataset folder or store URL (s3://bucket/images.fl; "
                                       "default: SRC.fl next to SRC)")
    p.add_argument("--format", choices=["lmdb", "hdf5"], default=None,
                   help="shard storage: lmdb or hdf5 (default lmdb; with --append the dataset's)")
    p.add_argument("--shard-size", default="256MB", help="target shard size, e.g. 256MB, 1GiB (default 256MB)")
    p.add_argument("--workers", type=int, default=None, help="parallel reads: 8×N files read ahead, N decode threads (default 4 per core, 4..16)")
    p.add_argument("--extensions", nargs="+", default=None, metavar="EXT",
                   help="file extensions to pack (default: common image extensions)")
    p.add_argument("--on-error", type=_on_error, choices=["raise", "skip"], default="raise",
                   help="raise on the first bad file (default; 'fail' is the old spelling) or skip it, "
                        "counted and reported")
    p.add_argument("--max-side", type=int, default=None, help="re-encode: shrink the longer side to N px")
    p.add_argument("--quality", type=int, default=None, help="re-encode: JPEG quality (default 90 with --max-side)")
    p.add_argument("--layout", choices=["auto", "imagefolder", "flat", "list", "webdataset", "table"],
                   default="auto",
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
    p.add_argument("--mask-storage", choices=("rows", "file"), default=None,
                   help="a one-channel mask file field stored as its values' rows, so a crop decodes its "
                        "rows alone (rows, the default), or as its file (file: a PNG inflated whole per crop); "
                        "--append stores them as the dataset does")
    p.add_argument("--image-column", default=None, metavar="NAME",
                   help="a table's column of image bytes (default: its one binary column, or HF Image column)")
    p.add_argument("--label-column", default=None, metavar="NAME",
                   help="a table's label column: whole numbers, class names or an HF ClassLabel "
                        "(default: 'label' when there is one)")
    p.add_argument("--columns", default=None, metavar="NAMES",
                   help="a table's columns (comma-separated) kept as fields (default: every other column)")
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
    p.add_argument("--append", action="store_true",
                   help="add SRC's records to the finished dataset at OUT as its next version: new shards and "
                        "index, its files never rewritten, readers opened before keep their version")
    p.add_argument("--allow-duplicates", action="store_true",
                   help="with --append: append SRC's records the dataset holds already (the same path and "
                        "content) too; by default they are left out, and counted")
    p.add_argument("--ray", action="store_true",
                   help="pack on a Ray cluster (the ray extra): the one at --ray-address or RAY_ADDRESS, "
                        "else a local Ray; the same records as a local pack (docs/ray.md)")
    p.add_argument("--ray-address", metavar="ADDRESS", default=None,
                   help="with --ray: the cluster's address (host:6379, or 'auto' for the one this machine "
                        "runs; default: RAY_ADDRESS, else a local Ray started for the pack)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _add_storage_option(p)
    p.add_argument("--staging", metavar="DIR", default=None,
                   help="with OUT in an object store: the local folder the shards are written in before "
                        "upload (default: in the cache folder, FASTLOAD_CACHE_DIR or ~/.cache/fastload)")
    p.set_defaults(run=pack_command)

    p = sub.add_parser("info", help="show what a packed dataset holds")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_storage_option(p)
    p.set_defaults(run=info_command)

    p = sub.add_parser("show", help="print one record's fields and write its image to a file")
    p.add_argument("path", metavar="DATASET", help="packed dataset folder or store URL")
    p.add_argument("index", metavar="INDEX", type=int, help="the record's number (0-based; -1: the last)")
    p.add_argument("-o", "--out", metavar="FILE", default=None,
                   help="where to write the record's image (default: record-INDEX.<ext> in this folder); "
                        "never over a file unless --overwrite, through a link, or inside a dataset")
    p.add_argument("--overwrite", action="store_true", help="replace a file already at that path")
    _add_storage_option(p)
    p.set_defaults(run=show_command)

    p = sub.add_parser("verify", help="recompute every record's checksum; exit 1 if anything is wrong")
    p.add_argument("path")
    p.add_argument("--decode", action="store_true", help="also decode every image")
    _add_storage_option(p)
    p.set_defaults(run=verify_command)

    p = sub.add_parser("tune", help="measure a short grid of loader settings on a packed dataset")
    p.add_argument("path", help="packed dataset folder")
    p.add_argument("--batch-size", type=int, default=64, help="samples per batch (default 64)")
    p.add_argument("--image-size", type=int, default=224, help="crop side in pixels (default 224)")
    p.add_argument("--eval", action="store_true", help="tune the eval pipeline (default: train)")
    p.add_argument("--batches", type=int, default=6,
                   help="timed batches per run of a candidate (default 6)")
    _add_repeats_option(p, "runs of each candidate, interleaved; a choice only where their ranges do not "
                           "overlap")
    _add_step_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")
    _add_storage_option(p)
    p.set_defaults(run=tune_command)

    p = sub.add_parser("bench", help="loaders side by side: torch ImageFolder vs fastload, same records")
    p.add_argument("src", help="image folder, packed dataset, or folder with --packed copies; or "
                               "their URLs in an object store (s3://bucket/images/: one GET per object)")
    p.add_argument("--packed", action="append", default=[], metavar="DATASET",
                   help="a packed dataset of SRC's files, a path or a URL (repeat for LMDB and HDF5)")
    _add_measure_options(p, duration=2.0)
    _add_repeats_option(p, "runs of each row, interleaved (A, B, C, A, B, C, ...); rows show the median "
                           "and the range, ratios are paired run by run")
    p.add_argument("--stages", action="store_true",
                   help="also print the stages section: each stage of the loader timed alone (the "
                        "verdict drawn from them is printed either way)")
    p.add_argument("--torch-workers", type=int, nargs="+", default=None, metavar="N",
                   help="num_workers of the tuned torch rows (default: one per core)")
    p.add_argument("--prefetch-factor", type=int, default=4, help="prefetch_factor of the tuned torch rows")
    p.add_argument("--no-dali", action="store_true", help="leave out the DALI backend row")
    p.add_argument("--temp-pack", type=int, default=2000, metavar="N",
                   help="with no packed copy of SRC, pack at most N of its files into a temporary dataset")
    p.add_argument("--work", default=None, help="where the temporary dataset goes, and the temporary "
                                                "node cache of datasets in a store (default: system temp)")
    _add_storage_option(p)
    p.set_defaults(run=bench_command)

    p = sub.add_parser("doctor", help="time each loader stage alone and name the bottleneck")
    p.add_argument("src", help="image folder (ImageFolder + torch DataLoader) or packed dataset (fastload); "
                               "or its URL in an object store (s3://...)")
    _add_measure_options(p, duration=2.0)
    p.add_argument("--num-workers", type=int, default=None,
                   help="your loader's num_workers (folder default: one per core; packed: auto)")
    _add_repeats_option(p, "runs of the loader under the step, interleaved; a bottleneck is named only "
                           "where the timings' ranges allow")
    _add_storage_option(p)
    p.set_defaults(run=doctor_command)
    return parser


def _add_repeats_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--repeats", type=_at_least_one, default=3, metavar="N", help=f"{what} (default 3)")
