"""Loader fixtures: packed image datasets whose labels are record numbers (see helpers.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .helpers import ID_RECORDS, write_id_list


@pytest.fixture(scope="session")
def id_packed(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``id_packed(storage)`` → a packed dataset of ``ID_RECORDS`` pictures (several shards) whose
    label is the record number. Session-scoped and read-only."""
    from fastload.converters import pack

    base = tmp_path_factory.mktemp("loader-data")
    listing = write_id_list(base / "pictures", ID_RECORDS)
    made: dict[str, Path] = {}

    def get(storage: str = "lmdb") -> Path:
        if storage not in made:
            out = base / f"ids-{storage}.fl"
            pack(listing, out, format=storage, shard_size="64KB", workers=2, progress=False)
            made[storage] = out
        return made[storage]

    return get


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    """An initialised one-rank gloo process group (what ``distributed=True`` needs), torn down after."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'group'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
