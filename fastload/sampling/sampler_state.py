"""What decided a sampler's pass: the samplers under it, their generators and epochs, torch's global RNG.

Saved as plain values (RNG states as base64 text) and set back; and whether a sampler (or a
dataset) saves its own position, with ``state_dict()`` / ``load_state_dict()``.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils.data import Sampler


def decide(samplers: list[Any], restore: dict[str, Any] | None) -> dict[str, Any]:
    """The RNG states and epochs the samplers draw from now, after setting them to ``restore``."""
    generators = generators_of(samplers)
    timed = [s for s in samplers
             if hasattr(s, "set_epoch") and isinstance(getattr(s, "epoch", None), int)]
    if restore is None:
        return {"global": _encode(torch.get_rng_state()),
                "generators": [_encode(g.get_state()) for g in generators],
                "epochs": [s.epoch for s in timed]}
    for g, encoded in zip(generators, restore["generators"]):
        g.set_state(_decode(encoded))
    for s, epoch in zip(timed, restore["epochs"]):
        s.set_epoch(epoch)
    return restore


@contextmanager
def global_rng(decided: dict[str, Any], restoring: bool) -> Iterator[None]:
    """Within: torch's global RNG as ``decided`` saved it (when ``restoring``); after: as it was."""
    if not restoring:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(_decode(decided["global"]))
        yield


def samplers_of(base: Any) -> list[Any]:
    """``base`` and every sampler it draws from (a BatchSampler's, a composite's), outermost first."""
    found: list[Any] = []
    todo, seen = [base], set()
    while todo:
        sampler = todo.pop(0)
        if id(sampler) in seen:
            continue
        seen.add(id(sampler))
        found.append(sampler)
        for name, value in vars(sampler).items() if hasattr(sampler, "__dict__") else ():
            if isinstance(value, Sampler) or (name == "sampler" and hasattr(value, "__dict__")):
                todo.append(value)
    return found


def generators_of(samplers: list[Any]) -> list[torch.Generator]:
    generators: dict[int, torch.Generator] = {}
    for sampler in samplers:
        for value in vars(sampler).values() if hasattr(sampler, "__dict__") else ():
            if isinstance(value, torch.Generator):
                generators.setdefault(id(value), value)
    return list(generators.values())


def is_stateful(sampler: Any) -> bool:
    return all(callable(getattr(sampler, name, None)) for name in ("state_dict", "load_state_dict"))


def length_of(sampler: Any) -> int | None:
    try:
        return len(sampler)
    except TypeError:
        return None


def _encode(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode("ascii")


def _decode(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)
