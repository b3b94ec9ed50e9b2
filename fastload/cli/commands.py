"""The ``fastload`` subcommands: one function each, parsed arguments in, a library call, its output printed."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fastload.config import format_size
from fastload.errors import SourceError
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
    """What became of the images' bytes when no re-encode was asked for."""
    if packed.get("restart_markers"):
        return "none (JPEGs rewritten losslessly, see below; other files copied exactly)"
    encoded = packed.get("encoded")  # the Python writer's and a dataset pack's: pixels given, encoded here
    if isinstance(encoded, dict) and encoded.get("images"):
        how = (f"JPEG quality {_text(encoded.get('quality'))}" if encoded.get("format") == "JPEG"
               else f"{_text(encoded.get('format'))}, lossless")
        return (f"none ({_count(encoded['images'], 'image')} given as pixels encoded to {how}; "
                "bytes given stored exactly)")
    return "none (bytes copied exactly)"


def _origin(packed: dict) -> str:
    """``from SRC (imagefolder layout)``, and ``on Ray (N tasks)`` for a cluster pack."""
    text = f"from {_text(packed.get('source'))} ({_text(packed.get('layout'))} layout)"
    if packed.get("cluster") == "ray":
        text += f" on Ray ({_count(packed['tasks'], 'task')})" if isinstance(packed.get("tasks"), int) else " on Ray"
    return text


def _versions(packed: dict) -> list[dict]:
    """What each version added, oldest first (after an append; a dataset never appended to has none)."""
    found = packed.get("versions")
    return [v for v in found if isinstance(v, dict)] if isinstance(found, list) else []


def _names(text: str | None) -> list[str] | None:
    """``a,b`` as ``["a", "b"]`` (--columns; ``""``: no columns)."""
    return None if text is None else [name for name in text.split(",") if name]


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
                  storage_options=_storage_options(args), staging=args.staging, sidecars=args.sidecars,
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
                         storage_options=_storage_options(args))
    print(report.summary())
    return 0


def info_command(args: argparse.Namespace) -> int:
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
    how = (f"re-encode: {_text(packed.get('reencode'), '') or _copied(packed)}, "
           f"skipped: {_text(packed.get('skipped'), '0')}")
    versions = _versions(packed)
    if not versions:
        print(f"  packed {_text(packed.get('created'))} by fastload {_text(packed.get('fastload_version'))} "
              f"{_origin(packed)}, {how}")
    else:  # "packed" holds the last append's facts: each version's own are in "versions"
        print(f"  version {info['version']}, last written by fastload {_text(packed.get('fastload_version'))} "
              f"({_text(packed.get('layout'))} layout), {how} in all")
        for v in versions:
            skipped = f", {_text(v.get('skipped'), '0')} skipped" if v.get("skipped") else ""
            print(f"    v{_text(v.get('version'))} {_text(v.get('created'))}: "
                  f"{_count(v['records'], 'record') if isinstance(v.get('records'), int) else '? records'} "
                  f"from {_text(v.get('source'))}{skipped}")
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
    if pixels := info["pixel_cache"]:
        print(f"  pixel cache (pixel_cache=True, {pixels['image_size']} px crops): {format_size(pixels['bytes_per_image'])} "
              f"an image at {pixels['side']} px, {format_size(pixels['bytes'])} in all (estimated from the image sizes)")
    for s in info["shards"]:
        print(f"  {s['file']}: {_count(s['records'], 'record')}, {format_size(s['bytes'])}")
    return 0


def show_command(args: argparse.Namespace) -> int:
    """One record: its fields printed, its image (or file) written to ``-o`` or ``record-INDEX.<ext>``."""
    from fastload.dataset import PackedDataset

    dataset = PackedDataset(args.path, storage_options=_storage_options(args))
    count = len(dataset)
    index = args.index + count if args.index < 0 else args.index
    if not 0 <= index < count:
        raise ValueError(f"{args.path}: record {args.index} is out of range: the dataset holds "
                         f"{_count(count, 'record')} (0..{count - 1}, or -1 for the last)")
    record = dataset.record(index)
    data = record.pop("data")
    label, classes = record.pop("label"), dataset.classes
    name = f" ({classes[label]})" if 0 <= label < len(classes) else " (no label)" if label < 0 else ""
    what = "image" if dataset.manifest.kind == "images" else "file"
    print(f"{dataset.root} record {index} of {count}:")
    print(f"  path: {record.pop('path')}")
    print(f"  label: {label}{name}")
    print(f"  {what}: {record.pop('width')}x{record.pop('height')}, {format_size(len(data))}")
    for field, value in record.items():
        print(f"  {field} ({dataset.manifest.fields.get(field, '?')}): {_value(value)}")
    out = args.out or f"record-{index}.{_extension(data)}"
    with open(out, "wb") as f:
        f.write(data)
    print(f"{what} written to {out}")
    return 0


_MAGIC = ((b"\xff\xd8\xff", "jpg"), (b"\x89PNG\r\n\x1a\n", "png"), (b"GIF8", "gif"), (b"BM", "bmp"),
          (b"II*\0", "tif"), (b"MM\0*", "tif"), (b"P5", "pgm"), (b"P6", "ppm"), (b"\x93NUMPY", "npy"))


def _extension(data: bytes) -> str:
    """The file type ``data`` starts like (``jpg``, ``png``, ...), else ``bin``."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return next((ext for magic, ext in _MAGIC if data.startswith(magic)), "bin")


def _value(value: Any) -> str:
    """A field's value on one line: a file field by its size, long text and arrays cut short."""
    import numpy as np

    if isinstance(value, (bytes, bytearray)):
        return f"{format_size(len(value))} ({_extension(bytes(value))} file)"
    if isinstance(value, np.ndarray):
        text = np.array2string(value, threshold=24, separator=", ").replace("\n", "")
        return f"{text} ({value.dtype}, shape {tuple(value.shape)})"
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def verify_command(args: argparse.Namespace) -> int:
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


def tune_command(args: argparse.Namespace) -> int:
    from fastload.dataset import PackedDataset
    from fastload.loading.tuner import tune

    dataset = PackedDataset(args.path, image_size=args.image_size, train=not args.eval,
                            storage_options=_storage_options(args))
    settings = tune(dataset, batch_size=args.batch_size, batches=args.batches, step=_tune_step(args))
    if args.json:
        print(json.dumps({"num_workers": settings.num_workers, "prefetch_factor": settings.prefetch_factor,
                          "pin_memory": settings.pin_memory, "mode": settings.mode,
                          "prefetch_batches": settings.prefetch_batches, "reasons": settings.reasons},
                         indent=2))
    else:
        print(settings)
    return 0


def bench_command(args: argparse.Namespace) -> int:
    from fastload.benchmark import bench

    _check_plot(args)
    from fastload.config import available_cpus

    # --prefetch-factor applies with or without --torch-workers (default: one worker per core)
    grid = [(w, args.prefetch_factor) for w in args.torch_workers or [available_cpus()]]
    report = bench(args.src, args.packed, batch_size=args.batch_size, image_size=args.image_size,
                   duration=args.duration, samples=args.samples, cold=args.cold, stages=args.stages,
                   model_step=_model_step(args), model=args.model, torch_grid=grid, dali=not args.no_dali,
                   temp_pack=args.temp_pack, work=args.work, repeats=args.repeats,
                   progress=False if args.quiet else None, storage_options=_storage_options(args))
    return _report(report, args)


def doctor_command(args: argparse.Namespace) -> int:
    from fastload.benchmark import doctor

    _check_plot(args)
    report = doctor(args.src, batch_size=args.batch_size, image_size=args.image_size,
                    num_workers=args.num_workers, duration=args.duration, samples=args.samples,
                    cold=args.cold, model_step=_model_step(args), model=args.model,
                    progress=False if args.quiet else None, storage_options=_storage_options(args))
    return _report(report, args)


def _storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    from fastload.storage.location import parse_storage_options

    return parse_storage_options(args.storage_option) or None


def _model_step(args: argparse.Namespace) -> float | None:
    return args.model_step_ms / 1000 if args.model_step_ms else None


def _tune_step(args: argparse.Namespace) -> Any:
    """tune's training step: --model's (fn(images, labels)), or --model-step-ms slept."""
    if args.model and args.model_step_ms:
        raise ValueError(f"--model {args.model} and --model-step-ms {args.model_step_ms:g}: pass one training step")
    if not args.model:
        return _model_step(args)
    from fastload.benchmark.training import named_step

    train = named_step(args.model)
    return lambda images, labels: train((images, labels))


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
