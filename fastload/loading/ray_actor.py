"""mode="ray", step two: a decode actor, the loader's own fetch + collate on a cluster node, and the
batch as it crosses Ray's object store (tensors as NumPy arrays: stored and read without a copy)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from fastload.loading.transfer import map_tensors
from fastload.samples.collate import SkipCounted, with_skips


class DecodeActor:
    """Runs on a Ray node (``ray.remote(DecodeActor)``): the dataset is opened there, from its path
    or URL (``PackedDataset`` pickles without its open files), and each call makes one whole batch
    exactly as torch's fetcher does in the threads mode: ``collate_fn(dataset.__getitems__(keys))``.

    Args:
        dataset: the loader's map-style dataset.
        collate_fn: the loader's.
        threads: the CPUs this actor decodes with (the actor's, not the node's): what
            ``available_cpus()`` says in its process, for every dataset that leaves its decode
            threads to fastload (a mix's sources too).
    """

    def __init__(self, dataset: Any, collate_fn: Callable[[Any], Any], threads: int) -> None:
        os.environ["FASTLOAD_CPUS"] = str(threads)  # this process is the actor's alone
        self.dataset, self.collate_fn = dataset, collate_fn
        self.dropped: set[int] = set()  # passes given up: their batches still queued here are not made
        fill = getattr(dataset, "fill_cache", None)
        if fill is not None:  # in a store: fetch ahead into this node's cache
            fill()

    def ready(self) -> str:
        """This actor's node (called once: the actor has started and opened the dataset)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def decode(self, keys: Sequence[Any], pass_id: int) -> Any:
        """The batch of sampler ``keys``, its tensors as :class:`Stored` arrays; None, at once,
        when pass ``pass_id`` was given up."""
        if pass_id in self.dropped:
            return None
        getitems = getattr(self.dataset, "__getitems__", None)
        samples = getitems(list(keys)) if getitems else [self.dataset[k] for k in keys]
        return walk(self.collate_fn(samples), torch.Tensor, _store)

    def drop(self, pass_id: int) -> None:
        """Pass ``pass_id`` is given up. Called in the actor's ``CONTROL`` group, beside a batch
        being made: Ray's ``cancel`` does not stop a synchronous actor's calls already queued in it."""
        self.dropped.add(pass_id)


ACTOR_CPUS = 1
"""What each decode actor asks of the cluster; it decodes with as many threads."""

CONTROL = "control"
"""The concurrency group of :meth:`DecodeActor.drop`: one thread of its own, beside the decoding one."""


class Stored:
    """A tensor of the batch as a NumPy array: Ray writes it into the object store out of band
    and the trainer reads it in place (read-only) before copying it to memory of its own."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, ...]:
        return Stored, (self.array,)


def _store(tensor: torch.Tensor) -> Any:
    try:
        return Stored(tensor.detach().numpy())
    except (TypeError, RuntimeError):  # a dtype NumPy lacks (bfloat16): pickled as torch does
        return tensor


def to_tensors(batch: Any, pin: bool) -> Any:
    """A batch as the actor sent it → the batch the local modes deliver: each array copied once,
    into pinned memory when ``pin`` (what torch's pin_memory makes), else into a tensor of its own."""

    def load(stored: Stored) -> torch.Tensor:
        array = stored.array
        dtype = torch.from_numpy(np.empty(0, dtype=array.dtype)).dtype
        out = torch.empty(array.shape, dtype=dtype, pin_memory=pin)
        if out.numel():
            out.numpy()[...] = array  # out of the object store (read-only) in one copy
        return out

    return walk(batch, Stored, load)


def walk(batch: Any, kind: type, fn: Callable[[Any], Any]) -> Any:
    """``batch`` with ``fn`` applied to every ``kind`` inside it (:func:`map_tensors`), its
    ``on_error="skip"`` count and pixel cache counts kept."""
    if isinstance(batch, SkipCounted):
        return with_skips(map_tensors(batch._plain(batch), fn, kind), batch.skipped, batch.pixel_counts)
    return map_tensors(batch, fn, kind)
