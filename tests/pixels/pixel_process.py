"""Processes that share a pixel cache, for tests/pixels/test_pixel_processes.py.

``python -m tests.pixels.pixel_process fill DATASET CACHE``: read epochs of a cached dataset
through a DataLoader, printing ``batch N`` after each batch and going on to the next one when a
line comes on stdin (the test kills it with SIGKILL while it reads, decodes and stores one).

``python -m tests.pixels.pixel_process rank RANK WORLD INIT DATASET CACHE OUT``: join a gloo group
as one of WORLD ranks, read two epochs with two worker processes, and write what was delivered
(per epoch: record → digest of its image) and the pixel cache's stats of each epoch to OUT.
"""

from __future__ import annotations

import json
import sys

import xxhash

BATCH, SEED, SIZE = 4, 3, 64


def digests(loader) -> dict[str, str]:
    """One epoch: record number (the dataset's labels are record numbers) → digest of its image."""
    out = {}
    for images, labels in loader:
        for image, label in zip(images, labels.tolist()):
            out[str(label)] = xxhash.xxh64_hexdigest(image.contiguous().numpy())
    return out


def fill(dataset: str, cache: str) -> None:
    import fastload

    ds = fastload.PackedDataset(dataset, image_size=SIZE, train=True, pixel_cache=cache, decode_threads=2)
    loader = fastload.DataLoader(ds, batch_size=BATCH, seed=SEED, num_workers=0)
    for _ in range(2):
        for n, _batch in enumerate(loader):
            print(f"batch {n}", flush=True)
            if not sys.stdin.readline():
                return


def rank(rank: int, world: int, init: str, dataset: str, cache: str, out: str) -> None:
    import torch.distributed as dist

    import fastload

    result: dict[str, object] = {}
    try:
        dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
        ds = fastload.PackedDataset(dataset, image_size=SIZE, train=True, pixel_cache=cache)
        loader = fastload.DataLoader(ds, batch_size=BATCH, seed=SEED, num_workers=2)
        result["epochs"], result["stats"] = [], []
        for _ in range(2):
            result["epochs"].append(digests(loader))
            result["stats"].append(loader.stats(reset=True)["pixel_cache"])
            dist.barrier()  # epoch 2 starts once every rank has filled its share
        dist.destroy_process_group()
    except BaseException:
        import traceback

        result["error"] = traceback.format_exc()
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "fill":
        fill(*args)
    else:
        rank(int(args[0]), int(args[1]), *args[2:])
