"""``fastload pack``: a folder, file list, tars, tables or a store prefix packed into a dataset, here or on Ray."""

from __future__ import annotations

import argparse
import sys

from fastload.cli.storage_options import storage_options
from fastload.errors import SourceError


def pack_command(args: argparse.Namespace) -> int:
    from fastload.converters import pack

    if args.ray:
        return _pack_on_ray(args)
    if args.ray_address is not None:
        raise SourceError(f"--ray-address {args.ray_address}: is the cluster --ray packs on; add --ray, or leave it out")
    if args.append and not args.quiet:  # what an append will add, said before it adds it
        _say_on_stderr("fastload.converters.destination.append")
    report = pack(args.src, args.out, format=args.format, shard_size=args.shard_size, workers=args.workers,
                  extensions=args.extensions, on_error=args.on_error, max_side=args.max_side,
                  quality=args.quality, overwrite=args.overwrite, append=args.append,
                  progress=False if args.quiet else None,
                  layout=args.layout, check=args.check, max_pixels=args.max_pixels,
                  restart_markers=args.restart_markers, max_file_size=args.max_file_size,
                  storage_options=storage_options(args), staging=args.staging, sidecars=args.sidecars,
                  file_columns=[c for c in (args.file_columns or "").split(",") if c], root=args.root,
                  allow_outside_root=args.allow_outside_root, sidecar_names=args.sidecar_names,
                  image_column=args.image_column, label_column=args.label_column,
                  columns=_names(args.columns), mask_storage=args.mask_storage,
                  allow_duplicates=args.allow_duplicates)
    print(report.summary())
    return 0


def _say_on_stderr(logger: str) -> None:
    """The library's INFO lines of ``logger`` written on stderr (whatever it is then), as they are logged."""
    import logging

    class Stderr(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            sys.stderr.write(record.getMessage() + "\n")

    log = logging.getLogger(logger)
    if not any(type(h).__name__ == "Stderr" for h in log.handlers):
        log.addHandler(Stderr())
    log.setLevel(logging.INFO)


def _pack_on_ray(args: argparse.Namespace) -> int:
    """``pack --ray``: the local pack's listing, packed by Ray tasks (converters.cluster.ray_source)."""
    from fastload.config import ray_address
    from fastload.converters.cluster.ray_source import pack_on_ray
    from fastload.optional import require

    require("ray", "fastload pack --ray (packing on a Ray cluster)")  # without Ray: an error naming the extra

    local_only = {"--max-side": args.max_side, "--quality": args.quality, "--restart-markers": args.restart_markers,
                  "--append": args.append, "--allow-duplicates": args.allow_duplicates,
                  "--sidecars": args.sidecars, "--sidecar-names": args.sidecar_names,
                  "--file-columns": args.file_columns, "--workers": args.workers, "--staging": args.staging}
    given = [flag for flag, value in local_only.items() if value]
    if given:
        raise SourceError(f"{args.src}: {given[0]} is not for --ray packs yet (its tasks copy each file's bytes "
                          "as they are, and Ray chooses the parallelism); pack without --ray, or leave it out")
    table = {"image_column": args.image_column, "label_column": args.label_column, "columns": _names(args.columns)}
    report = pack_on_ray(args.src, args.out, address=args.ray_address or ray_address(),
                         format=args.format or "lmdb", shard_size=args.shard_size, extensions=args.extensions,
                         on_error=args.on_error, overwrite=args.overwrite, layout=args.layout, check=args.check,
                         max_pixels=args.max_pixels, max_file_size=args.max_file_size,
                         mask_storage=args.mask_storage or "rows", progress=not args.quiet, root=args.root,
                         allow_outside_root=args.allow_outside_root, table=table,
                         storage_options=storage_options(args))
    print(report.summary())
    return 0


def _names(text: str | None) -> list[str] | None:
    """``a,b`` as ``["a", "b"]`` (--columns; ``""``: no columns)."""
    return None if text is None else [name for name in text.split(",") if name]
