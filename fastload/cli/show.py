"""``fastload show``: one record's fields printed, escaped, and its image (or file) written to a new
file (cli.output_file: never over a user's file without --overwrite, through a link, or into a dataset)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fastload.cli.output_file import write_output
from fastload.cli.storage_options import storage_options
from fastload.cli.terminal import plural, shown
from fastload.config import format_size


def show_command(args: argparse.Namespace) -> int:
    """One record: its fields printed, its image (or file) written to ``-o`` or ``record-INDEX.<ext>``."""
    from fastload.dataset import PackedDataset

    dataset = PackedDataset(args.path, storage_options=storage_options(args))
    count = len(dataset)
    index = args.index + count if args.index < 0 else args.index
    if not 0 <= index < count:
        raise ValueError(f"{shown(args.path)}: record {args.index} is out of range: the dataset holds "
                         f"{plural(count, 'record')} (0..{count - 1}, or -1 for the last)")
    record = dataset.record(index)
    data = record.pop("data")
    label, classes = record.pop("label"), dataset.classes
    name = f" ({shown(classes[label])})" if 0 <= label < len(classes) else " (no label)" if label < 0 else ""
    what = "image" if dataset.manifest.kind == "images" else "file"
    # the dataset's own strings (its key, class and field names, text values) printed escaped
    print(f"{shown(dataset.root)} record {index} of {count}:")
    print(f"  path: {shown(record.pop('path'))}")
    print(f"  label: {label}{name}")
    print(f"  {what}: {record.pop('width')}x{record.pop('height')}, {format_size(len(data))}")
    for field, value in record.items():
        print(f"  {shown(field)} ({shown(dataset.manifest.fields.get(field, '?'))}): {_value(value)}")
    out = Path(args.out or f"record-{index}.{_extension(data)}")
    local = dataset.root if isinstance(dataset.root, Path) else None
    write_output(out, data, overwrite=args.overwrite, dataset=local)  # new, or --overwrite; never in a dataset
    print(f"{what} written to {shown(out)}")
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
    text = shown(repr(value))
    return text if len(text) <= 200 else text[:197] + "..."


