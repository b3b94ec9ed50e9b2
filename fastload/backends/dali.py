"""The DALI tail: the sampler's key batches → records read by fastload → DALI → batches."""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from fastload.backends.dali_pipeline import PURPOSE, build_pipeline, feed_arrays, window
from fastload.backends.planned import batch_labels, check_batching, check_dataset, read_and_plan
from fastload.config import available_cpus
from fastload.errors import CorruptRecordError
from fastload.optional import require
from fastload.loading.prefetch import ThreadPrefetcher
from fastload.loading.transfer import map_tensors

DEPTH = 2
"""Batches DALI works on ahead of the loop (its ``prefetch_queue_depth``)."""


@dataclass
class _Fed:
    """One batch handed to DALI, waiting for its images."""

    indices: list[int]
    labels: Any  # int64 tensor, or what target_transform + default_collate made


class _Prepared(NamedTuple):
    """A batch read and planned in Python, not yet fed: its record and its DALI inputs."""

    fed: _Fed
    inputs: dict[str, Any]


class DaliBackend:
    """Runs a PackedDataset's built-in image pipeline as a DALI pipeline, in fastload's order.

    fastload reads the records (checksummed) and plans every crop and flip exactly as the torch
    backend does; DALI only decodes the planned region, resizes, flips and normalises. Batches
    are fed with ``feed_input`` and taken with ``outputs()``, so this class always knows which
    batches are in flight: none is padded, repeated or carried into another epoch.

    Args:
        dataset: a :class:`~fastload.PackedDataset` made with ``image_size=`` and no ``transform``.
        device: ``cuda`` runs DALI on that GPU (nvJPEG decode); None or ``cpu`` its CPU operators.
        mean, std: normalise to float32 inside DALI (0–1 scale per channel).
        batch_size: the loader's, so the pipeline is built for it (None: found from the batches).
        collate_fn, batched: the loader's; DALI builds whole batches itself.
        num_workers, prefetch_factor: the loader's; DALI runs its own threads, so they are unused.
    """

    def __init__(self, dataset: Any, *, batch_size: int | None, device: torch.device | None,
                 mean: Sequence[float] | None, std: Sequence[float] | None,
                 collate_fn: Any = None, batched: bool = True, num_workers: int = 0,
                 prefetch_factor: int | None = None) -> None:
        check_dataset(dataset, "dali", skip_ok=False)
        check_batching("dali", collate_fn, batched)
        require("nvidia.dali", PURPOSE)
        self.dataset = dataset
        self.gpu = device is not None and device.type == "cuda"
        self.device = device if self.gpu else torch.device("cpu")
        self.mean, self.std = mean, std
        self._pipe: Any = None
        self._depth = 0
        self._batch_size = 0  # the built pipeline's
        self._batch_hint = batch_size or 0  # the loader's (None: a batch_sampler of its own)
        self._inflight: deque[_Fed] = deque()  # fed and scheduled, outputs not yet taken
        self._generation = 0

    def batches(self, key_batches: Iterable[Sequence[Any]]) -> Iterator[tuple[torch.Tensor, Any]]:
        """``(images, labels)`` for each batch of sampler keys, in order.

        A background thread reads and plans up to ``DEPTH`` batches ahead while DALI works on
        ``DEPTH`` more. A read error (a damaged record) is raised when the loop reaches its
        batch, after the batches before it. A new iteration discards what an earlier one left
        in flight; the earlier iterator then raises if it is used again.
        """
        self._generation += 1
        generation = self._generation
        self._drain()
        prepared = ThreadPrefetcher(map(self._prepare, key_batches), DEPTH)
        pending: deque[_Prepared] = deque()  # read and planned, not yet fed to DALI
        failure: Exception | None = None
        exhausted = False
        try:
            while True:
                while not exhausted and len(self._inflight) + len(pending) < DEPTH:
                    try:
                        pending.append(next(prepared))
                    except StopIteration:
                        exhausted = True
                    except Exception as exc:  # raised in its turn, after the batches before it
                        failure, exhausted = exc, True
                self._feed_pending(pending)
                if not self._inflight:  # and so nothing is pending either
                    break
                yield self._take()
                if self._generation != generation:
                    raise RuntimeError("backend='dali': this iterator was superseded by a newer "
                                       "iter(loader), which discarded its batches; iterate one "
                                       "at a time")
        finally:
            prepared.close()
        if failure is not None:
            raise failure

    # --- feeding DALI ---------------------------------------------------------------------------

    def _prepare(self, keys: Sequence[Any]) -> _Prepared:
        """Read and plan one batch in Python: records, crop windows, flips and labels."""
        planned = read_and_plan(self.dataset, keys)
        windows = [window(plan, width, height) for plan, (width, height) in zip(planned.plans, planned.sizes)]
        inputs: dict[str, Any] = feed_arrays(windows, [plan.flip for plan in planned.plans])
        inputs["encoded"] = [np.frombuffer(p, dtype=np.uint8) for p in planned.payloads]
        return _Prepared(_Fed(planned.indices, batch_labels(self.dataset, planned.indices)), inputs)

    def _fits(self, item: _Prepared) -> bool:
        return self._pipe is not None and len(item.fed.indices) <= self._batch_size

    def _can_take(self, pending: deque[_Prepared]) -> bool:
        """The pipeline can run these batches now (built, deep and wide enough for them)."""
        return self._depth >= len(pending) and all(self._fits(item) for item in pending)

    def _feed_pending(self, pending: deque[_Prepared]) -> None:
        """Hand DALI what it can take now; a new pipeline is primed with all of ``pending``."""
        try:
            if pending and not self._inflight and not self._can_take(pending):
                widest = max(len(item.fed.indices) for item in pending)
                self._build(depth=len(pending),
                            batch_size=max(widest, self._batch_size, self._batch_hint))
                # Its first schedule_run() runs `depth` iterations: every one is fed before it.
                for item in pending:
                    self._feed(item.inputs)
                    self._inflight.append(item.fed)
                pending.clear()
                self._pipe.schedule_run()
            while pending and len(self._inflight) < self._depth and self._fits(pending[0]):
                item = pending.popleft()
                self._feed(item.inputs)
                self._inflight.append(item.fed)
                self._pipe.schedule_run()
        except Exception:
            self._discard()  # half-fed: DALI's state is unknown, start afresh next time
            raise

    def _build(self, *, depth: int, batch_size: int) -> None:
        self._pipe = None  # the old one (nothing in flight) is released first
        device_id = None
        if self.gpu:
            if self.device.index is None:  # "cuda": the current device when the first batch is made
                self.device = torch.device("cuda", torch.cuda.current_device())
            device_id = self.device.index
        self._pipe = build_pipeline(batch_size=batch_size, out_size=self.dataset.pipeline.out_size,
                                    gpu=self.gpu, device_id=device_id, num_threads=available_cpus(),
                                    depth=depth, mean=self.mean, std=self.std)
        self._depth, self._batch_size = depth, batch_size

    def _feed(self, inputs: dict[str, Any]) -> None:
        for name, data in inputs.items():
            self._pipe.feed_input(name, data)

    # --- taking batches out -----------------------------------------------------------------------

    def _take(self) -> tuple[torch.Tensor, Any]:
        """The oldest batch in flight, as torch tensors on the loader's device (no copy)."""
        fed = self._inflight.popleft()
        stream = torch.cuda.current_stream(self.device) if self.gpu else None
        try:
            # On the GPU the batch is ordered on the loop's current stream (no host wait),
            # and DALI frees its memory in that stream's order when torch lets go of it.
            (images,) = self._pipe.outputs(cuda_stream=stream)
        except RuntimeError as exc:
            self._discard()
            raise self._error(fed, exc) from exc
        tensor = images.as_tensor()
        batch = torch.from_dlpack(tensor) if self.gpu else torch.from_numpy(np.asarray(tensor))
        labels = fed.labels
        if self.gpu:
            labels = map_tensors(labels, lambda t: t.to(self.device, non_blocking=True))
        return batch, labels

    def _drain(self) -> None:
        """Take and drop the outputs an iteration broken off early left in flight."""
        while self._inflight:
            self._inflight.popleft()
            try:
                self._pipe.outputs()
            except RuntimeError:
                self._discard()

    def _discard(self) -> None:
        """After a DALI error the pipeline is dead: the next iteration builds a new one."""
        self._pipe = None
        self._inflight.clear()

    def _error(self, fed: _Fed, exc: Exception) -> CorruptRecordError:
        """DALI's failure, named by the record it failed on (or the batch) and what to do."""
        text = str(exc)
        sample = re.search(r"sample #(\d+)", text)
        reader, root = self.dataset.reader, self.dataset.root
        if sample is not None and int(sample.group(1)) < len(fed.indices):
            subject = reader.where(fed.indices[int(sample.group(1))])
        else:
            shown = ", ".join(str(i) for i in fed.indices[:8])
            subject = f"{root}: one of records {shown}{', …' if len(fed.indices) > 8 else ''}"
        return CorruptRecordError(
            f"{subject}: DALI could not decode it ({_reason(text)}); find damaged records with "
            f"`fastload verify --decode {root}`, or load this dataset with backend='torch'")


def _reason(text: str) -> str:
    """The informative line of a DALI pipeline error, out of its boilerplate and traceback."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    after = lines[lines.index("encountered:") + 1:] if "encountered:" in lines else lines
    useful = [line for line in after if not line.startswith(("Critical error", "Current pipeline"))]
    return useful[0].rstrip(" :") if useful else "no reason given"
