"""A wheel without the parts a device check does not use, so that it fits what a device call carries.

Ray's wheel is 79 MB, over the 64 MiB a call to the lent GPU machine carries; 32 MB of it is
``ray/jars`` (Java workers) and a few MB the dashboard's JavaScript source maps. The slim wheel
keeps every Python module and native library, drops the members matching ``--drop`` and their
lines in the RECORD, and is installed there with pip as usual.

    python bench/slim_wheel.py .whl/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl \\
        --drop 'ray/jars/*' '*.js.map'
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import zipfile
from pathlib import Path


def slim(wheel: Path, drop: list[str]) -> tuple[int, int]:
    """Rewrite ``wheel`` in place without the members matching ``drop``: (members dropped, bytes now)."""
    kept = wheel.with_suffix(".slim")
    dropped = 0
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(kept, "w", zipfile.ZIP_DEFLATED) as dst:
        gone = {info.filename for info in src.infolist() if any(fnmatch.fnmatch(info.filename, p) for p in drop)}
        for info in src.infolist():
            if info.filename in gone:
                dropped += 1
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if line.split(",", 1)[0] not in gone).encode()
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    kept.replace(wheel)
    return dropped, wheel.stat().st_size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("wheel", type=Path)
    p.add_argument("--drop", nargs="+", required=True, help="member patterns (fnmatch) to leave out")
    args = p.parse_args(argv)
    if not zipfile.is_zipfile(args.wheel):
        raise SystemExit(f"{args.wheel}: not a wheel (a zip file); download it with pip download first")
    dropped, size = slim(args.wheel, args.drop)
    print(f"{args.wheel}: {dropped} members dropped, {size / 2**20:.1f} MiB now")
    return 0


if __name__ == "__main__":
    sys.exit(main())
