"""Samples with fields: COCO-like detection samples (photo + 1–20 boxes with labels + a caption)
and segmentation samples (photo + a class-id mask PNG of its size) through the train pipeline,
against the same photos as image-only samples, side by side.

    python bench/fields_bench.py bench/data/photos --records 4000 --duration 6 --repeats 3 \\
        --json bench/results/fields.json

Issue 17: "COCO-like synthetic detection samples (photo + 1–20 boxes + caption) through the train
pipeline ≥ 90% of the image-only rate on the same photos". A JSONL list of ``--records`` photos of
the folder (in the folder's order) with, per photo, 1–20 random boxes inside it, a label per box,
a caption and a mask (a one-channel PNG of the photo's size: a few shapes of class ids 1–20 on 0,
as segmentation masks look) is packed into a temporary LMDB dataset (deleted after), the masks as
a file field kept as their PNG files (``file_columns=("mask",), mask_storage="file"``), and again
with the masks stored as rows (``mask_storage="rows"``, the default: a crop decodes only its
rows); the masks' stored bytes, and the mask stage alone (one thread decoding and cutting 512
masks with their train crops), both ways, are printed beside the rates. Rows, interleaved
``--repeats`` times (``fastload.benchmark.runs.run_all``), each
``fastload.DataLoader(..., batch_size=64, shuffle=True)`` with auto settings:

* ``image only``: ``PackedDataset(d, image_size=224, train=True)``: ``(images, labels)``;
* ``detection``: ``fields=("image", "label", "boxes", "box_labels", "caption")``,
  ``boxes="boxes", box_fields=("box_labels",)``: the boxes follow each crop and flip;
* ``detection, padded``: the same with ``pad_fields={"boxes": -1, "box_labels": -1}``;
* ``segmentation``: ``fields=("image", "label", "mask")``: each mask PNG inflated whole and cut with
  its photo's crop and flip (nearest neighbour);
* ``segmentation, mask rows``: the same on the dataset of masks stored as rows (equal batches).

``--rows`` picks some of them (``--rows segmentation-rows``: image only always runs). Nothing
asserts on time; the ratios are printed and written to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


# --rows names: the rows of the docstring
ROWS = {"image": "image only", "detection": "detection", "detection-padded": "detection, padded",
        "segmentation": "segmentation", "segmentation-rows": "segmentation, mask rows"}


def write_mask(path: Path, width: int, height: int, rng: Any) -> None:
    """A segmentation-like mask: a few filled shapes of class ids on background 0."""
    from PIL import Image, ImageDraw

    mask = Image.new("L", (width, height))
    draw = ImageDraw.Draw(mask)
    for _ in range(int(rng.integers(1, 6))):
        x0, y0 = rng.uniform(0, width * 0.8), rng.uniform(0, height * 0.8)
        box = [x0, y0, x0 + rng.uniform(8, width / 2), y0 + rng.uniform(8, height / 2)]
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=int(rng.integers(1, 21)))
    mask.save(path, format="PNG")


def write_list(photos: Path, records: int, out: Path) -> None:
    """A JSONL list of the first ``records`` photos with random boxes, box labels, a caption and a mask."""
    import numpy as np

    from fastload.converters.sources.folders import list_source
    from fastload.decode.images import image_size

    rng = np.random.default_rng(0)
    lines = []
    (out.parent / "masks").mkdir()
    for item in list_source(photos).items[:records]:
        width, height = image_size(item.path.read_bytes()[:65536], where=str(item.path))
        mask = out.parent / "masks" / f"{len(lines)}.png"
        write_mask(mask, width, height, rng)
        count = int(rng.integers(1, 21))
        x0, y0 = rng.uniform(0, width * 0.9, count), rng.uniform(0, height * 0.9, count)
        x1 = np.minimum(x0 + rng.uniform(4, width / 2, count), width)
        y1 = np.minimum(y0 + rng.uniform(4, height / 2, count), height)
        lines.append(json.dumps({
            "path": str(Path(item.path).resolve()), "label": item.label,
            "boxes": np.round(np.stack([x0, y0, x1, y1], 1), 2).tolist(),
            "box_labels": rng.integers(0, 80, count).tolist(),
            "caption": f"a photo with {count} things in it, number {len(lines)}", "mask": str(mask)}))
    out.write_text("\n".join(lines) + "\n")


def mask_decode_ms(path: Path, count: int = 512, repeats: int = 3) -> float:
    """The mask stage alone, one thread: milliseconds to decode and cut one mask with its photo's
    train crop (the median of ``repeats`` passes over the first ``count`` records' masks, read first)."""
    import time

    import fastload
    from fastload.samples.file_fields import decode_file_field

    ds = fastload.PackedDataset(path, image_size=224, train=True, fields=("mask",))
    kind, files = ds.manifest.fields["mask"], ds.index.files["mask"]
    jobs = [(ds.reader.read(i, "mask"), ds.pipeline.plan(i, 0, 0, int(files.width[i]), int(files.height[i])))
            for i in range(min(count, len(ds)))]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for data, plan in jobs:
            decode_file_field(kind, data, plan, where="", max_pixels=ds.max_pixels)
        times.append((time.perf_counter() - start) / len(jobs) * 1e3)
    return sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("photos", help="the photo folder (ImageFolder tree)")
    p.add_argument("--records", type=int, default=4000)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--work", default=None, help="where the temporary dataset goes")
    p.add_argument("--json", default=None)
    p.add_argument("--rows", nargs="+", choices=tuple(ROWS), default=tuple(ROWS),
                   help="the rows to run (image only always runs: the others' ratios are to it)")
    args = p.parse_args(argv)

    import fastload
    from fastload.converters import pack
    from fastload.benchmark.repeats import paired_ratio
    from fastload.benchmark.runs import Limits, RunSpec, run_all

    work = Path(tempfile.mkdtemp(prefix="fastload-fields-", dir=args.work))
    try:
        write_list(Path(args.photos), args.records, work / "list.jsonl")
        for name, storage in (("d.fl", "file"), ("rows.fl", "rows")):
            pack(work / "list.jsonl", work / name, file_columns=("mask",), progress=False, allow_outside_root=True,
                 mask_storage=storage)
        sizes = {name: int(fastload.PackedDataset(work / name).index.files["mask"].size.sum())
                 for name in ("d.fl", "rows.fl")}
        decode_ms = {name: mask_decode_ms(work / name) for name in ("d.fl", "rows.fl")}
        path = work / "d.fl"
        detection: dict[str, Any] = {"fields": ("image", "label", "boxes", "box_labels", "caption"),
                                     "boxes": "boxes", "box_fields": ("box_labels",)}

        def loader(where: Path = path, **kw: Any) -> Any:
            ds = fastload.PackedDataset(where, image_size=224, train=True, **kw)
            return fastload.DataLoader(ds, batch_size=64, shuffle=True)

        specs = [
            RunSpec("image only", "fastload", "lmdb", loader, lambda ld: str(ld.settings.mode)),
            RunSpec("detection", "fastload", "lmdb", lambda: loader(**detection), lambda ld: str(ld.settings.mode)),
            RunSpec("detection, padded", "fastload", "lmdb",
                    lambda: loader(**detection, pad_fields={"boxes": -1.0, "box_labels": -1}),
                    lambda ld: str(ld.settings.mode)),
            RunSpec("segmentation", "fastload", "lmdb", lambda: loader(fields=("image", "label", "mask")),
                    lambda ld: str(ld.settings.mode)),
            RunSpec("segmentation, mask rows", "fastload", "lmdb",
                    lambda: loader(work / "rows.fl", fields=("image", "label", "mask")),
                    lambda ld: str(ld.settings.mode)),
        ]
        chosen = {ROWS[row] for row in args.rows} | {"image only"}
        runs, _ = run_all([spec for spec in specs if spec.name in chosen], Limits(args.duration),
                          repeats=args.repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    by = {r.name: r for r in runs}
    for r in runs:
        print(f"{r.name:<20} {r.samples_per_s:8.0f} samples/s  (min {r.min or 0:.0f}, max {r.max or 0:.0f})")
    ratios = {name: paired_ratio(by[name], by["image only"], "samples_per_s")
              for name in ROWS.values() if name in by and name != "image only"}
    for name, ratio in ratios.items():
        print(f"{name} / image only: {ratio:.2f}x")
    masks = {"png": sizes["d.fl"], "rows": sizes["rows.fl"]}
    print(f"masks stored: PNG files {masks['png'] / 2**20:.2f} MiB, rows {masks['rows'] / 2**20:.2f} MiB "
          f"({masks['rows'] / masks['png']:.2f}x; {masks['png'] / args.records:.0f} and "
          f"{masks['rows'] / args.records:.0f} bytes a mask)")
    print(f"one mask decoded and cut (one thread): PNG {decode_ms['d.fl']:.3f} ms, rows {decode_ms['rows.fl']:.3f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "schema": "fastload-fields-bench/1", "records": args.records,
            "machine": {"python": platform.python_version(), "platform": platform.platform()},
            "runs": [r.as_dict() for r in runs], "ratios": ratios, "mask_bytes": masks,
            "mask_decode_ms": {"png": decode_ms["d.fl"], "rows": decode_ms["rows.fl"]}}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
