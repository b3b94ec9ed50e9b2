"""Resume for an IterableDataset: only the dataset knows where its stream is (its own ``state_dict()``)."""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterableDataset

from fastload.sampling.sampler_state import is_stateful


def iterable_state(dataset: IterableDataset, *, num_workers: int) -> dict[str, Any]:
    """An IterableDataset's own ``state_dict()``, for a loader that reads it in the main process."""
    _require_stateful(dataset, num_workers, "state")
    return {"kind": "iterable", "dataset": dataset.state_dict()}  # type: ignore[attr-defined]


def load_iterable_state(dataset: IterableDataset, state: dict[str, Any], *,
                        num_workers: int) -> None:
    """Give an IterableDataset back the state :func:`iterable_state` saved."""
    _require_stateful(dataset, num_workers, "load")
    if state.get("kind") != "iterable":
        raise ValueError(f"load: the state was saved from a {state.get('kind')!r} sampler, this "
                         f"loader reads the IterableDataset {type(dataset).__name__}; resume with "
                         "the same dataset")
    dataset.load_state_dict(state["dataset"])  # type: ignore[attr-defined]


def _require_stateful(dataset: IterableDataset, num_workers: int, what: str) -> None:
    name = type(dataset).__name__
    if not is_stateful(dataset):
        raise TypeError(f"{what}: {name} is an IterableDataset without state_dict()/"
                        "load_state_dict() and cannot be resumed; give it those two methods (where "
                        "its stream is, and going back there)")
    if num_workers > 0:
        raise ValueError(f"{what}: {name} is read by num_workers={num_workers} workers, each with "
                         "its own copy of the dataset and its state; resume it with num_workers=0")
