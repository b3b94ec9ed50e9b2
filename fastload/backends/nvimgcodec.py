"""The nvImageCodec tail: the sampler's key batches → records read by fastload → GPU decode → batches.

A pipeline, not a sequence: each stage runs in a thread of its own (on a CUDA stream of its own),
up to ``prefetch_factor`` batches ahead of the next, so that batch N+1's read, plan, parse and
decode run while batch N resamples and the model steps on batch N-1::

    keys ─► read + plan (worker processes, or a thread) ─► parse, route, decode (decode stream)
         ─► resample + the CPU's rest (resample stream) ─► hand-over (the loop's stream waits on its event)

Records are read and their crops planned exactly as the torch backend plans them
(:mod:`fastload.backends.planned`); each JPEG goes to the GPU's hardware engines, CUDA, or the CPU
(:mod:`fastload.backends.decode_engines`); the batch's crops are resampled in a few batched
operations (:mod:`fastload.backends.crop_resample`). With worker processes, a share of each batch
is decoded by them on the CPU meanwhile (:mod:`fastload.backends.decode_split`) and copied to the
GPU on a side stream (:mod:`fastload.backends.hand_over`), and they read and plan the GPU's share
(:mod:`fastload.backends.worker_parts`).
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from fastload.backends.decode_split import DecodeSplit
from fastload.backends.decode_stage import Decoded, DecodeStage
from fastload.backends.hand_over import copied, hand_over
from fastload.backends.nvimgcodec_decoder import EngineDecoders
from fastload.backends.payload_slots import PayloadPool
from fastload.backends.pipeline_stage import PipelineStage
from fastload.backends.planned import PlannedBatch, check_batching, check_dataset, read_and_plan
from fastload.backends.planned_part import as_batch
from fastload.backends.resample_stage import Made, ResampleStage
from fastload.backends.stage_trace import NO_TRACE
from fastload.backends.stream_events import Retiring, Streams, on_device
from fastload.backends.worker_parts import FailedPart, WorkerParts
from fastload.config import available_cpus
from fastload.decode.pipeline import ThreadDecoder
from fastload.errors import CorruptRecordError
from fastload.loading.transfer import Normalizer

DEPTH = 2
"""Batches each stage runs ahead of the next when the loader has no ``prefetch_factor``."""
_said_where: set[str] = set()


def where_it_runs(device: torch.device | None, cuda_available: bool) -> str | None:
    """What to tell a user whose loader, given no device, decodes on the CPU codecs though the
    machine has CUDA (``device="cpu"`` is a choice, said by the user: nothing to tell)."""
    if device is not None or not cuda_available:
        return None
    return ("backend='nvimgcodec' without device='cuda': JPEGs are decoded by nvImageCodec's CPU codecs and "
            "the batches delivered on the CPU, though CUDA is available here; pass device='cuda' to decode "
            "on the GPU (its hardware JPEG engines first), or use backend='torch', the fast CPU path")


class NvImageCodecBackend:
    """Runs a PackedDataset's built-in image pipeline with nvImageCodec's decoder, in fastload's order.

    fastload reads the records (checksummed) and plans every crop and flip exactly as the torch
    backend does; nvImageCodec decodes the JPEGs on the GPU and torch resamples the batch there.
    The samples, order, labels, skip rule and resume state are the torch backend's; the pixels
    are within rounding of its full-scale decode.

    Args:
        dataset: a :class:`~fastload.PackedDataset` made with ``image_size=`` and no ``transform``.
        device: a CUDA device decodes there; None or ``cpu`` uses nvImageCodec's CPU codecs (for
            tests and machines without a GPU; None is said once where CUDA is available;
            ``backend="torch"`` is the fast CPU path).
        mean, std: normalise to float32 on the device (as fastload's Normalizer).
        batch_size, collate_fn, batched: the loader's; this tail builds whole batches itself.
        num_workers, prefetch_factor: the loader's worker processes, if any, decode a share of
            each batch on the CPU while the GPU decodes the rest, and read and plan that rest; 0
            decodes every batch on the GPU, read and planned in a thread. Each stage runs
            ``prefetch_factor`` batches ahead (2 if None).
    """

    def __init__(self, dataset: Any, *, batch_size: int | None, device: torch.device | None,
                 mean: Sequence[float] | None, std: Sequence[float] | None,
                 collate_fn: Any = None, batched: bool = True, num_workers: int = 0,
                 prefetch_factor: int | None = None) -> None:
        check_dataset(dataset, "nvimgcodec", skip_ok=True)
        check_batching("nvimgcodec", collate_fn, batched)
        self.dataset = dataset
        self.gpu = device is not None and device.type == "cuda"
        self.device = device if self.gpu else torch.device("cpu")
        said = where_it_runs(device, torch.cuda.is_available())
        if said is not None and said not in _said_where:
            _said_where.add(said)
            warnings.warn(said, stacklevel=4)
        self.normalizer = Normalizer(mean, std) if mean is not None and std is not None else None
        self._depth = max(1, prefetch_factor or DEPTH)
        self._decoders: EngineDecoders | None = None
        self._streams: Streams | None = None
        self._cpu = ThreadDecoder(available_cpus())  # the records nvImageCodec does not take
        self._retiring = Retiring(limit=2 * self._depth + 2)
        # Worker processes decode a share of each batch (labels joined as int64 tensors: not with
        # a target_transform, whose labels may be anything).
        self._workers = num_workers if dataset.target_transform is None else 0
        self._prefetch_factor = prefetch_factor
        self._worker_parts: WorkerParts | None = None  # made at the first epoch; its workers persist
        self._batch_size = batch_size or 1
        self._counted: Counter[str] = Counter()
        self._counted_before: Counter[str] = Counter()
        self.whole_images = self.gpu
        """Decode whole images, cropped by the resample: the hardware engines take no regions, and
        whole images through them beat CUDA's region decode (H200: 19 against 46 ms a batch of 256
        photos). Without a GPU, each crop's region alone (the CPU codecs)."""
        self.trace: Any = NO_TRACE
        """Where the stages record their runs (a :class:`~fastload.backends.stage_trace.StageTrace`)."""
        self.payload_slots: int | None = None
        """Payload slots of the workers' planned parts (made at the first epoch): None, enough for
        every part in flight; 0, none (a fresh shared-memory buffer per part)."""
        self.cpu_share = 0.5 if self._workers else 0.0
        """The share of each batch the CPU decodes now (it adapts; the last epoch's carries on)."""

    @property
    def engines(self) -> tuple[str, ...]:
        """The decoders this loader's device has, the first choice first (known at the first epoch)."""
        return self._decoders.engines if self._decoders is not None else ()

    def batches(self, key_batches: Iterable[Sequence[Any]]) -> Iterator[tuple[torch.Tensor, Any]]:
        """``(images, labels)`` for each batch of sampler keys, in order, on the device.

        An error (a damaged record) is raised when the loop reaches its batch, after the batches
        before it; the iteration ends there. A pass given up gives its payload slots back.
        """
        decode, resample = self._stages()
        cpu_parts: PipelineStage | None = None
        planned: Iterator[PlannedBatch]
        if self._workers:  # planned in the worker processes, which run ahead as torch's loader does
            split = DecodeSplit(key_batches, self.cpu_share)
            with on_device(self.device):  # torch's pin-memory thread pins on the device current now
                router = self._worker_side().epoch(split)
            planned = (as_batch(part) for part in router.parts("gpu"))
            stream = self._streams.copy if self._streams is not None else None
            cpu_parts = PipelineStage((copied(part, self.device, stream) for part in router.parts("cpu")),
                                      self._depth)
            stop_planning = router.close
        else:
            prefetched = PipelineStage(self._planned(key_batches), self._depth)
            planned, stop_planning = prefetched, prefetched.close
        decoded = PipelineStage((decode(number, batch) for number, batch in enumerate(planned)), self._depth)
        made = PipelineStage((self._resampled(resample, batch) for batch in decoded), self._depth)
        try:
            if cpu_parts is not None:
                yield from self._joined(split, cpu_parts, made)
            else:
                for batch in made:
                    yield hand_over(self.device, self.normalizer, batch)
        finally:
            for stage in (made, decoded, cpu_parts):
                if stage is not None:
                    stage.close()
            stop_planning()
            self._retiring.flush()

    def _planned(self, key_batches: Iterable[Sequence[Any]]) -> Iterator[PlannedBatch]:
        skip = self.dataset.on_error == "skip"
        for number, keys in enumerate(key_batches):
            with self.trace.stage("plan", number):
                batch = read_and_plan(self.dataset, keys, skip=skip)
            yield batch

    def _resampled(self, resample: ResampleStage, decoded: Decoded) -> Made:
        made = resample(decoded)
        self._counted.update(f"decoded_{engine}" for engine in decoded.engines)
        return made

    def _joined(self, split: DecodeSplit, cpu_parts: Iterator[Any], made: Iterator[Made]) -> Iterator[Any]:
        """Each batch's CPU part (worker processes) and GPU part, joined in the sampler's order;
        the share moves toward the side that kept the loop waiting less."""
        b = 0
        while (cut := split.cut(b)) is not None:
            started = time.perf_counter()
            cpu_part = next(cpu_parts) if cut.cpu else None
            if isinstance(cpu_part, FailedPart):  # as a GPU part's error: in the batch's place, then the end
                raise CorruptRecordError(cpu_part.error)
            between = time.perf_counter()
            gpu_part = next(made) if cut.gpu else None
            split.adapt(between - started, time.perf_counter() - between)
            self.cpu_share = split.share
            split.release(b)
            b += 1
            if cpu_part is not None:
                self._counted["decoded_workers"] += len(cpu_part.labels) + cpu_part.skipped
            yield hand_over(self.device, self.normalizer, gpu_part, cpu_part)

    def _stages(self) -> tuple[DecodeStage, ResampleStage]:
        """The decode and resample stages (decoders and streams made at the first epoch)."""
        if self._decoders is None:
            if self.gpu and self.device.index is None:  # "cuda": the current device at the first epoch
                self.device = torch.device("cuda", torch.cuda.current_device())
            with on_device(self.device):
                self._decoders = EngineDecoders(self.device, available_cpus())
                self._streams = Streams(self.device) if self.gpu else None
        streams = self._streams
        decode = DecodeStage(self.dataset, self._decoders, streams.decode if streams else None, self.whole_images)
        resample = ResampleStage(self.dataset, self.device, streams.resample if streams else None, self._cpu,
                                 self._retiring)
        decode.trace = resample.trace = self.trace
        return decode, resample

    def _worker_side(self) -> WorkerParts:
        """torch's loader over both sides' parts: the worker processes persist across epochs."""
        if self._worker_parts is None:
            count, why = self.payload_slots, ""
            if count is None:  # what can be in flight: the workers' parts ahead, and those held here
                ahead = self._prefetch_factor or 2
                count = self._workers * ahead + 2 * self._depth + 3
                why = (f"one per part in flight: {self._workers} workers × prefetch_factor {ahead} + "
                       f"{count - self._workers * ahead} in this process")
            pool = PayloadPool.sized_for(self.dataset, self._batch_size, count, why) if count else None
            self._worker_parts = WorkerParts(self.dataset, num_workers=self._workers, pool=pool,
                                             prefetch_factor=self._prefetch_factor, pin_memory=self.gpu)
        return self._worker_parts

    def counts(self) -> dict[str, int]:
        """Records decoded by each engine (``decoded_hardware``, ``decoded_cuda``,
        ``decoded_cpu_codecs``; ``decoded_cpu``: the CPU path in this process; ``decoded_workers``:
        the worker processes' share) and the payload slots' parts (``slots_pooled``,
        ``slots_no_slot``, ``slots_oversize``), since the last :meth:`reset_counts`."""
        now = Counter(self._counted)
        pool = self._worker_parts.pool if self._worker_parts is not None else None
        if pool is not None:
            now.update({f"slots_{name}": count for name, count in pool.counts.items()})
        return {name: count - self._counted_before[name] for name, count in sorted(now.items())}

    def reset_counts(self) -> None:
        """Count from now on (``loader.stats(reset=True)``)."""
        self._counted_before = Counter()
        self._counted_before.update(self.counts())
