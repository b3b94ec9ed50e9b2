"""Loader test data: plain map-style Datasets (importable, so spawned workers can unpickle them) and
packed image datasets whose labels are record numbers, so a batch says which records it holds."""

from __future__ import annotations

import io
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageFilter

# --- plain map-style Datasets ---------------------------------------------------------------------


class Numbers(torch.utils.data.Dataset):
    """Sample ``i`` is ``(tensor([i, 2i]) float, i)``: batches show exactly which indices they hold."""

    def __init__(self, n: int = 23) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return torch.tensor([i, 2 * i], dtype=torch.float32), int(i)


class RandomNumbers(Numbers):
    """Sample ``i`` also carries a draw from torch's RNG: it shows which process and seed made it."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, torch.Tensor]:
        x, y = super().__getitem__(i)
        return x, y, torch.rand(1)


class WorkerTagged(Numbers):
    """Sample ``i`` carries the id of the worker that read it and that worker's ``tag``."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int, int]:
        x, y = super().__getitem__(i)
        info = torch.utils.data.get_worker_info()
        if info is None:
            return x, y, -1, -1
        return x, y, info.id, getattr(info.dataset, "tag", -1)


def tag_worker(worker_id: int) -> None:
    """A worker_init_fn: marks the worker's copy of the dataset."""
    info = torch.utils.data.get_worker_info()
    info.dataset.tag = 100 + worker_id + 10 * info.num_workers


class Failing(Numbers):
    """Raises a KeyError naming the sample for index ``bad``."""

    def __init__(self, n: int = 23, bad: int = 9) -> None:
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if i == self.bad:
            raise KeyError(f"sample {i} is broken")
        return super().__getitem__(i)


class Slow(Numbers):
    """Every sample takes ``delay`` seconds: longer than a loader's timeout."""

    def __init__(self, n: int = 8, delay: float = 3.0) -> None:
        super().__init__(n)
        self.delay = delay

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.delay)
        return super().__getitem__(i)


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(10))


def pairs_collate(batch: list) -> dict:
    """A custom collate: a dict of plain lists, nothing stacked."""
    return {"x": [tuple(s[0].tolist()) for s in batch], "y": [s[1] for s in batch]}


class EveryThird(torch.utils.data.Sampler):
    """A custom sampler: ``n-1, n-4, …`` then ``0, 3, 6, …``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __repr__(self) -> str:  # stable test ids: pytest-xdist's workers must collect the same names
        return f"EveryThird({self.n})"

    def __iter__(self):
        return iter(list(range(self.n - 1, -1, -3)) + list(range(0, self.n, 3)))

    def __len__(self) -> int:
        return len(range(self.n - 1, -1, -3)) + len(range(0, self.n, 3))


class UnevenBatches(torch.utils.data.Sampler):
    """A custom batch_sampler: batches of 1, 2, 3, … indices, from the end backwards."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __repr__(self) -> str:  # stable test ids: pytest-xdist's workers must collect the same names
        return f"UnevenBatches({self.n})"

    def _batches(self) -> list[list[int]]:
        order, out, size = list(range(self.n))[::-1], [], 1
        while order:
            out.append(order[:size])
            order, size = order[size:], size + 1
        return out

    def __iter__(self):
        return iter(self._batches())

    def __len__(self) -> int:
        return len(self._batches())


# --- comparing what loaders deliver ---------------------------------------------------------------


def as_plain(batch: object) -> object:
    """A batch as nested Python lists and numbers, for == comparison with a readable diff."""
    if isinstance(batch, torch.Tensor):
        return ("tensor", str(batch.dtype), batch.tolist())
    if isinstance(batch, dict):
        return {k: as_plain(v) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return [as_plain(b) for b in batch]
    return batch


def epoch(loader: Iterable) -> list:
    return [as_plain(b) for b in loader]


def ids_and_pixels(loader: Iterable, limit: int | None = None) -> tuple[list[int], list[torch.Tensor]]:
    """Record ids (the labels of an ``id_dataset``) and image tensors, in delivery order."""
    ids: list[int] = []
    images: list[torch.Tensor] = []
    for k, (x, y) in enumerate(loader):
        if limit is not None and k >= limit:
            break
        ids += y.tolist()
        images += list(x)
    return ids, images


# --- packed image datasets ------------------------------------------------------------------------

ID_RECORDS = 37  # records in the ``id_packed`` datasets; prime: no batch size or rank count divides it


def picture(width: int, height: int, seed: int) -> Image.Image:
    """A photo-like RGB picture: smooth gradients plus a few flat shapes, different for each seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    phase = rng.uniform(0, 6, size=3)
    r = 127 + 100 * np.sin(x / width * 3.1 + phase[0]) * np.cos(y / height * 2.3)
    g = 127 + 100 * np.cos((x + y) / (width + height) * 5.0 + phase[1])
    b = 60 + 150 * (y / height) * (0.5 + 0.5 * np.sin(phase[2]))
    pixels = np.clip(np.stack([r, g, b], -1), 0, 255).astype(np.uint8)
    for _ in range(4):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        side = int(rng.integers(2, max(3, min(width, height) // 3)))
        pixels[y0:y0 + side, x0:x0 + side] = rng.integers(0, 256, 3)
    return Image.fromarray(pixels).filter(ImageFilter.GaussianBlur(1.0))


def encode(img: Image.Image, fmt: str = "JPEG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def write_id_list(root: Path, count: int, sizes: list[tuple[int, int]] | None = None,
                  png_every: int = 5) -> Path:
    """``count`` distinct pictures of varied sizes and a ``list.csv`` whose label is the record number.

    Returns the CSV path (pack it: labels come back as the record ids, in list order)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(count)
    rows = ["path,label"]
    for i in range(count):
        if sizes is not None:
            width, height = sizes[i % len(sizes)]
        else:
            width, height = int(rng.integers(48, 160)), int(rng.integers(48, 160))
        fmt, ext = ("PNG", "png") if png_every and i % png_every == png_every - 1 else ("JPEG", "jpg")
        name = f"img{i:04d}.{ext}"
        (root / name).write_bytes(encode(picture(width, height, seed=i), fmt))
        rows.append(f"{name},{i}")
    listing = root / "list.csv"
    listing.write_text("\n".join(rows) + "\n")
    return listing


def write_tiny_list(root: Path, records: int, files: int) -> Path:
    """A JSONL list of ``records`` rows naming ``files`` distinct 16-byte ``.bin`` files in turn: many
    tiny records without as many inodes (200,000 files took minutes to make and delete on a busy
    disk). Returns the list's path."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (root / f"{i:07d}.bin").write_bytes(i.to_bytes(8, "little") * 2)
    listing = root / "list.jsonl"
    listing.write_text("".join(f'{{"path": "{i % files:07d}.bin"}}\n' for i in range(records)))
    return listing


# --- one DDP rank (the target of a spawned process) ----------------------------------------------


def ddp_rank(rank: int, world_size: int, init_file: str, dataset: str, out: str) -> None:
    """Runs in a spawned process: join a gloo group, read two epochs through several loaders, and
    write what this rank delivered (record ids, batch by batch) to ``out`` as JSON."""
    import json
    import multiprocessing
    import traceback

    import torch.distributed as dist

    import fastload

    # A spawned process inherits "spawn" as its default start method, and every loader would then
    # spawn its workers (re-importing torch each time); torchrun's ranks are ordinary processes.
    multiprocessing.set_start_method("fork", force=True)

    def labels(loader: Iterable, epochs: int = 2) -> list[list[list[int]]]:
        return [[batch[1].tolist() for batch in loader] for _ in range(epochs)]

    result: dict[str, object] = {}
    torch.manual_seed(100 + rank)  # ranks seeded apart (seed + rank, as some scripts do): orders stay in step
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
        packed = fastload.PackedDataset(dataset, image_size=16, train=True)
        for drop_last in (True, False):
            loader = fastload.DataLoader(packed, batch_size=4, shuffle=True, drop_last=drop_last,
                                         num_workers=2)
            sampler = loader.epoch_sampler
            result[f"packed-drop_last={drop_last}"] = labels(loader)
            result[f"sampler-drop_last={drop_last}"] = [sampler.rank, sampler.world_size]
        result["plain-distributed"] = labels(fastload.DataLoader(
            Numbers(23), batch_size=4, shuffle=True, distributed=True, num_workers=2))
        result["plain-default"] = labels(fastload.DataLoader(Numbers(23), batch_size=4, num_workers=0), 1)
        result["packed-not-distributed"] = labels(fastload.DataLoader(
            packed, batch_size=4, shuffle=True, distributed=False, num_workers=0), 1)
        explicit = torch.utils.data.DistributedSampler(packed, shuffle=True, seed=3)
        result["explicit-sampler"] = labels(fastload.DataLoader(
            packed, batch_size=4, sampler=explicit, num_workers=2), 1)
        result["explicit-sampler-order"] = list(explicit)
        dist.barrier()
    except BaseException:
        result["error"] = traceback.format_exc()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        with open(out, "w") as f:
            json.dump(result, f)
