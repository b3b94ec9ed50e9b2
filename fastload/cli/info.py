"""``fastload info``: what a packed dataset holds and how it was packed, every manifest string escaped."""

from __future__ import annotations

import argparse
import json

from fastload.cli.storage_options import storage_options
from fastload.cli.terminal import free_text, plural, shown
from fastload.config import format_size
from fastload.format.layout import FILE_TYPES


def info_command(args: argparse.Namespace) -> int:
    from fastload.storage.location import is_remote
    from fastload.summary import describe

    info = describe(args.path, storage_options(args))
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    # "packed" is free-form JSON: print what it holds, whatever the types; every string the dataset
    # holds (names, keys, recorded arguments) is printed through shown(), never raw
    packed = info["packed"] if isinstance(info["packed"], dict) else {}
    print(f"{shown(info['path'])}: {plural(info['records'], 'record')}, {format_size(info['payload_bytes'])} of "
          f"payload in {plural(len(info['shards']), shown(info['storage']) + ' shard')} "
          f"({format_size(info['disk_bytes'])} {'in the store' if is_remote(info['path']) else 'on disk'})")
    how = (f"re-encode: {free_text(packed.get('reencode'), '') or _copied(packed)}, "
           f"skipped: {free_text(packed.get('skipped'), '0')}")
    versions = _versions(packed)
    if not versions:
        print(f"  packed {free_text(packed.get('created'))} by fastload {free_text(packed.get('fastload_version'))} "
              f"{_origin(packed)}, {how}")
    else:  # "packed" holds the last append's facts: each version's own are in "versions"
        print(f"  version {info['version']}, last written by fastload {free_text(packed.get('fastload_version'))} "
              f"({free_text(packed.get('layout'))} layout), {how} in all")
        for v in versions:
            skipped = f", {free_text(v.get('skipped'), '0')} skipped" if v.get("skipped") else ""
            print(f"    v{free_text(v.get('version'))} {free_text(v.get('created'))}: "
                  f"{plural(v['records'], 'record') if isinstance(v.get('records'), int) else '? records'} "
                  f"from {free_text(v.get('source'))}{skipped}")
    markers = packed.get("restart_markers")
    if markers:
        kept = markers.get("kept_as_is", 0) if isinstance(markers, dict) else None
        print("  JPEGs rewritten losslessly with restart markers (fast crop decode)"
              + (f"; {free_text(kept, '0')} kept as they were" if kept is not None else ""))
    if info["classes"]:
        print(f"  {plural(len(info['classes']), 'class')}:")
        for c in info["classes"]:
            print(f"    {c['label']:>5}  {shown(c['name'])}: {c['records']}")
    elif info["labels"]:
        print(f"  {plural(info['labels'], 'distinct label')} (no class names)")
    if info["unlabeled"]:
        print(f"  unlabeled records: {info['unlabeled']}")
    files = {k: v for k, v in info["fields"].items() if v in FILE_TYPES}
    values = {k: v for k, v in info["fields"].items() if k not in files}
    if values:
        print("  extra fields: " + ", ".join(f"{shown(k)} ({shown(v)})" for k, v in values.items()))
    if files:
        print("  file fields (a file per record, beside its own): "
              + ", ".join(f"{shown(k)} ({shown(v)})" for k, v in files.items()))
    if pixels := info["pixel_cache"]:
        print(f"  pixel cache (pixel_cache=True, {pixels['image_size']} px crops): {format_size(pixels['bytes_per_image'])} "
              f"an image at {pixels['side']} px, {format_size(pixels['bytes'])} in all (estimated from the image sizes)")
    for s in info["shards"]:
        print(f"  {shown(s['file'])}: {plural(s['records'], 'record')}, {format_size(s['bytes'])}")
    return 0


def _copied(packed: dict) -> str:
    """What became of the images' bytes when no re-encode was asked for."""
    if packed.get("restart_markers"):
        return "none (JPEGs rewritten losslessly, see below; other files copied exactly)"
    encoded = packed.get("encoded")  # the Python writer's and a dataset pack's: pixels given, encoded here
    if isinstance(encoded, dict) and isinstance(encoded.get("images"), int) and encoded["images"]:
        how = (f"JPEG quality {free_text(encoded.get('quality'))}" if encoded.get("format") == "JPEG"
               else f"{free_text(encoded.get('format'))}, lossless")
        return (f"none ({plural(encoded['images'], 'image')} given as pixels encoded to {how}; "
                "bytes given stored exactly)")
    return "none (bytes copied exactly)"


def _origin(packed: dict) -> str:
    """``from SRC (imagefolder layout)``, and ``on Ray (N tasks)`` for a cluster pack."""
    text = f"from {free_text(packed.get('source'))} ({free_text(packed.get('layout'))} layout)"
    if packed.get("cluster") == "ray":
        text += f" on Ray ({plural(packed['tasks'], 'task')})" if isinstance(packed.get("tasks"), int) else " on Ray"
    return text


def _versions(packed: dict) -> list[dict]:
    """What each version added, oldest first (after an append; a dataset never appended to has none)."""
    found = packed.get("versions")
    return [v for v in found if isinstance(v, dict)] if isinstance(found, list) else []
