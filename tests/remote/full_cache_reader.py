"""Read a dataset in an object store through a node cache on a nearly full file system, in a
process of its own (test_cache_fails_soft.py): a SIGBUS from a mapped cache page would kill
pytest, here it kills only this process and the test sees its exit status.

Argument: JSON ``{"url", "options", "disk", "leave": [blocks, ...], "records", "digest"}``. For
each ``leave`` the disk is emptied, a ballast leaves that many blocks free, and every record is
read twice (the cache filled ahead in between, as fastload.DataLoader does). Prints one JSON line
per ``leave``: whether the bytes matched ``digest`` (sha256 of the records, in order), the bytes
the cache kept and the warnings seen."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import warnings
from pathlib import Path

from fastload import PackedDataset
from tests.storage.small_disk import fill_up


def read_all(ds: PackedDataset, count: int) -> str:
    digest = hashlib.sha256()
    for record in ds.reader.read_many(list(range(count))):
        digest.update(record)
    return digest.hexdigest()


def one_disk(args: dict, leave: int) -> dict:
    disk = Path(args["disk"])
    for path in disk.iterdir():
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    (disk / "cache").mkdir()
    fill_up(disk, leave)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ds = PackedDataset(args["url"], storage_options=args["options"], cache_dir=disk / "cache")
        first = read_all(ds, args["records"])
        ds.fill_cache()
        ds.reader.remote._filler.join(timeout=60)
        second = read_all(ds, args["records"])
    return {"leave": leave, "ok": first == second == args["digest"], "cached": ds.cache.usage(),
            "warnings": [str(w.message) for w in seen]}


def main() -> None:
    args = json.loads(sys.argv[1])
    for leave in args["leave"]:
        print(json.dumps(one_disk(args, leave)), flush=True)


if __name__ == "__main__":
    main()
