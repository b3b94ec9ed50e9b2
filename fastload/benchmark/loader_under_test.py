"""The loader under test: its dataset (a packed one opened as its row opens it), row name, RunSpec and probe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fastload.benchmark.baseline import ImageFolderBaseline
from fastload.benchmark.contenders import settings_text
from fastload.benchmark.far import StoreObjects, cache_room
from fastload.benchmark.inputs import Inputs
from fastload.benchmark.runs import RunSpec
from fastload.benchmark.stages import ImageFolderProbe, PackedProbe, Probe, shard_files


def cache_dir(inputs: Inputs) -> str:
    assert inputs.cache_dir is not None, "resolve() makes a temporary cache for datasets in a store"
    return inputs.cache_dir


def loader_spec(dataset: Any, batch_size: int, num_workers: int | None,
                cores: int, device: str | None = None) -> tuple[RunSpec, Probe]:
    """The loader doctor runs (``device``: where a model step on the GPU wants its batches)."""
    from fastload.dataset import PackedDataset
    from fastload.loading.loader import DataLoader

    if isinstance(dataset, PackedDataset):
        kwargs: dict[str, Any] = {} if num_workers is None else {"num_workers": num_workers}
        if device:
            kwargs["device"] = device
        spec = RunSpec(f"doctor: {row_name(dataset)}", "fastload", dataset.manifest.storage,
                       lambda: DataLoader(dataset, batch_size=batch_size, shuffle=True, **kwargs),
                       settings_text,
                       dataset.manifest.total_bytes / max(1, len(dataset)))
        return spec, PackedProbe(dataset)
    for method in ("read", "decode", "transform"):
        if not callable(getattr(dataset, method, None)):
            raise TypeError(f"doctor: {type(dataset).__name__} has no {method}() method; pass a "
                            "PackedDataset, a path, or a Dataset with read/decode/transform methods "
                            "(subclass fastload.benchmark.ImageFolderBaseline)")
    workers = cores if num_workers is None else num_workers
    extra: dict[str, Any] = {"persistent_workers": True} if workers else {}
    if device == "cuda":
        extra["pin_memory"] = True
    size = dataset.mean_size() if isinstance(dataset, ImageFolderBaseline) else 0.0
    what = ("ImageFolder (folder, Pillow)" if type(dataset) is ImageFolderBaseline else
            "small objects in a store (one GET each, Pillow)" if type(dataset) is StoreObjects
            else f"{type(dataset).__name__} (your Dataset)")
    spec = RunSpec(f"doctor: torch {what}", "baseline", "folder",
                   lambda: torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                                       num_workers=workers, **extra),
                   f"num_workers={workers}", size)
    return spec, ImageFolderProbe(dataset)


def packed_dataset(path: Path | str, image_size: int, inputs: Inputs) -> Any:
    """The packed dataset at ``path`` with the train pipeline (one in a store through the run's
    temporary node cache, empty at first: what a first epoch on a new node reads)."""
    from fastload.dataset import PackedDataset

    if isinstance(path, Path):
        return PackedDataset(path, image_size=image_size, train=True)
    return PackedDataset(path, image_size=image_size, train=True, storage_options=inputs.storage_options,
                         cache_dir=cache_dir(inputs), cache_limit=_room_for(path, inputs))


def _room_for(url: str, inputs: Inputs) -> int:
    from fastload.storage.packed import locate_packed

    return cache_room(locate_packed(url, inputs.storage_options).manifest())


def row_name(dataset: Any) -> str:
    """The name of fastload's train row on this dataset (see contenders / far)."""
    where = ", store" if dataset.reader.remote is not None else ""
    return f"fastload {dataset.manifest.storage}{where}"


def probe_of(dataset: Any) -> Probe:
    from fastload.dataset import PackedDataset

    return PackedProbe(dataset) if isinstance(dataset, PackedDataset) else ImageFolderProbe(dataset)


def sequential(inputs: Inputs, cold: bool) -> list[str]:
    first = inputs.packed[0] if inputs.packed else None
    return shard_files(first) if cold and isinstance(first, Path) else []

