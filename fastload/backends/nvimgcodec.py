"""The nvImageCodec tail: the sampler's key batches → records read by fastload → GPU decode → batches.

Per batch, in three background threads: records are read and their crops planned (exactly as the
torch backend plans them); the JPEGs go to nvImageCodec as one batch (whole images through the
GPU's hardware JPEG engines; only each crop's region on its CPU codecs); two batched matrix
products resample every crop to the output size (:mod:`fastload.backends.crop_resample`), flips
included. Records the GPU decoder does not take (PNGs, CMYK JPEGs, anything it fails on) are
decoded by the torch backend's own CPU code, per record, into the same batch; a record no one can
decode raises (or is skipped) as there. With worker processes, a share of each batch is decoded
by them on the CPU meanwhile (:mod:`fastload.backends.decode_split`), and they also read and plan
the GPU's share (:mod:`fastload.backends.worker_parts`): the training process then only decodes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import torch

from fastload.backends.crop_resample import Crop, resample_into
from fastload.backends.dali_pipeline import window
from fastload.backends.decode_split import DecodeSplit
from fastload.backends.nvimgcodec_decoder import Region, RegionDecoder
from fastload.backends.payload_slots import PayloadPool
from fastload.backends.planned import (
    PlannedBatch,
    batch_labels,
    check_batching,
    check_dataset,
    read_and_plan,
)
from fastload.backends.planned_part import as_batch
from fastload.backends.worker_parts import FailedPart, PartRouter, WorkerParts
from fastload.config import available_cpus
from fastload.decode.crops import decode_crop
from fastload.decode.pipeline import ThreadDecoder
from fastload.errors import CorruptRecordError
from fastload.loading.prefetch import ThreadPrefetcher
from fastload.loading.transfer import Normalizer, map_tensors, ready_on_loop_stream
from fastload.samples.collate import skipped_in, with_skips

DEPTH = 2
"""Batches read and planned ahead, and batches decoded ahead, of the loop."""
HELD_HERE = 2 * DEPTH + 3
"""GPU parts the training process can hold at once: the decoded queue and the made thread's input,
the one being decoded, the one the reader holds while torch hands out the next, and the router's."""


class _Decoded(NamedTuple):
    """One batch through nvImageCodec: what it decoded (None where it could not), not yet resampled."""

    batch: PlannedBatch
    on_device: list[int]  # the batch positions handed to nvImageCodec
    pixels: list[torch.Tensor | None]  # H×W×3 uint8, on the device, in on_device's order
    crops: list[Crop]
    done: torch.cuda.Event | None  # recorded after the decode (GPU)


class _Made(NamedTuple):
    """One decoded batch, before it is handed to the loop's stream."""

    images: torch.Tensor
    labels: Any
    skipped: int


class NvImageCodecBackend:
    """Runs a PackedDataset's built-in image pipeline with nvImageCodec's decoder, in fastload's order.

    fastload reads the records (checksummed) and plans every crop and flip exactly as the torch
    backend does; nvImageCodec decodes the JPEGs on the GPU and torch resamples the batch there. The samples, order, labels, skip rule and resume state are the torch
    backend's; the pixels are within rounding of its full-scale decode.

    Args:
        dataset: a :class:`~fastload.PackedDataset` made with ``image_size=`` and no ``transform``.
        device: a CUDA device decodes there; None or ``cpu`` uses nvImageCodec's CPU codecs (for
            tests and machines without a GPU; ``backend="torch"`` is the fast CPU path).
        mean, std: normalise to float32 on the device (as fastload's Normalizer).
        batch_size, collate_fn, batched: the loader's; this tail builds whole batches itself.
        num_workers, prefetch_factor: the loader's worker processes, if any, decode a share of
            each batch on the CPU while the GPU decodes the rest (:mod:`fastload.backends.decode_split`),
            and read and plan that rest; 0 decodes every batch on the GPU, read and planned in a thread.
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
        self.normalizer = Normalizer(mean, std) if mean is not None and std is not None else None
        self._decoder: RegionDecoder | None = None
        self._decode_lock = threading.Lock()  # one batch at a time through the decoder
        self._cpu = ThreadDecoder(available_cpus())  # the records the GPU decoder does not take
        self._streams: tuple[torch.cuda.Stream, torch.cuda.Stream] | None = None  # decode, resample
        # The hardware JPEG engines decode whole images only, and faster than CUDA decodes regions
        # (H200: 19 against 46 ms a batch of 256 photos); on the CPU only the box is decoded.
        self.whole_images = self.gpu
        # Worker processes decode a share of each batch (labels joined as int64 tensors: not with
        # a target_transform, whose labels may be anything).
        self._workers = num_workers if dataset.target_transform is None else 0
        self._prefetch_factor = prefetch_factor
        self._worker_parts: WorkerParts | None = None  # made at the first epoch; its workers persist
        self._batch_size = batch_size or 1
        self.payload_slots: int | None = None
        """Payload slots of the workers' planned parts (made at the first epoch): None, enough for
        every part in flight; 0, none (a fresh shared-memory buffer per part)."""
        self.cpu_share = 0.5 if self._workers else 0.0
        """The share of each batch the CPU decodes now (it adapts; the last epoch's carries on)."""

    def batches(self, key_batches: Iterable[Sequence[Any]]) -> Iterator[tuple[torch.Tensor, Any]]:
        """``(images, labels)`` for each batch of sampler keys, in order, on the device.

        Three threads overlap three batches: one reads and plans (with worker processes, they
        do, and this thread receives their planned parts), one decodes (nvImageCodec), one
        resamples and decodes what the GPU decoder did not take. An error (a damaged record) is
        raised when the loop reaches its batch, after the batches before it; the iteration ends there.
        """
        decoder = self._ready_decoder()
        skip = self.dataset.on_error == "skip"
        planned: Iterator[PlannedBatch]
        if self._workers:  # planned in the worker processes, which run ahead as torch's loader does
            split = DecodeSplit(key_batches, self.cpu_share)
            router = self._worker_side().epoch(split)
            planned = (as_batch(part) for part in router.parts("gpu"))
            stop_planning = router.close
        else:
            prefetched = ThreadPrefetcher((read_and_plan(self.dataset, keys, skip=skip) for keys in key_batches), DEPTH)
            planned, stop_planning = prefetched, prefetched.close
        decoded = ThreadPrefetcher((self._decode(decoder, batch) for batch in planned), DEPTH)
        made = ThreadPrefetcher((self._finish(batch) for batch in decoded), DEPTH)
        try:
            if self._workers:
                yield from self._joined(split, router, made)
            else:
                for batch in made:
                    yield self._hand_over(batch)
        finally:
            made.close()
            decoded.close()
            stop_planning()

    def _joined(self, split: DecodeSplit, router: PartRouter, made: Iterator[_Made]) -> Iterator[tuple[torch.Tensor, Any]]:
        """Each batch's CPU part (worker processes) and GPU part, joined in the sampler's order;
        the share moves toward the side that kept the loop waiting less."""
        b = 0
        while (cut := split.cut(b)) is not None:
            started = time.perf_counter()
            cpu_part = router.take("cpu") if cut.cpu else None
            if isinstance(cpu_part, FailedPart):  # as a GPU part's error: in the batch's place, then the end
                raise CorruptRecordError(cpu_part.error)
            between = time.perf_counter()
            gpu_part = next(made) if cut.gpu else None
            split.adapt(between - started, time.perf_counter() - between)
            self.cpu_share = split.share
            split.release(b)
            b += 1
            yield self._hand_over(gpu_part, cpu_part)

    def _worker_side(self) -> WorkerParts:
        """torch's loader over both sides' parts: the worker processes persist across epochs."""
        if self._worker_parts is None:
            count = self.payload_slots
            if count is None:  # what can be in flight: the workers' parts ahead, and those held here
                count = self._workers * (self._prefetch_factor or 2) + HELD_HERE
            pool = PayloadPool.sized_for(self.dataset, self._batch_size, count) if count else None
            self._worker_parts = WorkerParts(self.dataset, num_workers=self._workers, pool=pool,
                                             prefetch_factor=self._prefetch_factor, pin_memory=self.gpu)
        return self._worker_parts

    def _ready_decoder(self) -> RegionDecoder:
        if self._decoder is None:
            if self.gpu and self.device.index is None:  # "cuda": the current device at the first epoch
                self.device = torch.device("cuda", torch.cuda.current_device())
            self._decoder = RegionDecoder(self.device, available_cpus())
            if self.gpu:
                self._streams = (torch.cuda.Stream(self.device), torch.cuda.Stream(self.device))
        return self._decoder

    # --- one batch: decode on the device, then resample it and decode the rest on the CPU -------

    def _decode(self, decoder: RegionDecoder, batch: PlannedBatch) -> _Decoded:
        decode_stream = self._streams[0] if self.gpu else None
        with self._decode_lock, torch.cuda.stream(decode_stream):  # None (CPU): no stream
            try:
                parsed = [decoder.parse(payload) for payload in batch.payloads]
                on_device = [k for k, code in enumerate(parsed) if code is not None]
                regions, crops = self._crops(batch, on_device)
                pixels = decoder.decode([parsed[k] for k in on_device], regions, decode_stream) if on_device else []
            finally:  # also after a failed decode: what it queued may still read the payloads
                done = torch.cuda.Event() if decode_stream is not None else None
                if done is not None:
                    done.record(decode_stream)
                    if batch.lease is not None:  # its payload slot is released once the GPU has read it
                        batch.lease.read_until(done)
        return _Decoded(batch, on_device, pixels, crops, done)

    def _finish(self, decoded: _Decoded) -> _Made:
        try:
            return self._resample_and_decode_rest(decoded)
        finally:  # nothing reads the payloads now (the CPU decoded its records; on the GPU: after ``done``)
            if decoded.batch.lease is not None:
                decoded.batch.lease.release()

    def _resample_and_decode_rest(self, decoded: _Decoded) -> _Made:
        batch = decoded.batch
        resample_stream = self._streams[1] if self.gpu else None
        with torch.cuda.stream(resample_stream):
            if decoded.done is not None and resample_stream is not None:
                resample_stream.wait_event(decoded.done)
            out_h, out_w = self.dataset.pipeline.out_size
            images = torch.empty((len(batch.indices), 3, out_h, out_w), dtype=torch.uint8, device=self.device)
            kept = [j for j, pixels in enumerate(decoded.pixels) if pixels is not None]
            resample_into(images, [decoded.on_device[j] for j in kept], [decoded.pixels[j] for j in kept],
                          [decoded.crops[j] for j in kept])
            taken = {decoded.on_device[j] for j in kept}
            failed = self._decode_on_cpu(batch, [k for k in range(len(batch.indices)) if k not in taken], images)
            if failed:
                keep = [k for k in range(len(batch.indices)) if k not in failed]
                images = images[torch.tensor(keep, dtype=torch.long, device=self.device)]
            labels = batch_labels(self.dataset, [i for k, i in enumerate(batch.indices) if k not in failed])
            labels = map_tensors(labels, lambda t: t.to(self.device, non_blocking=True))
            if resample_stream is not None:
                # nvImageCodec's images (in ``decoded``) are freed when this returns: finish with them.
                resample_stream.synchronize()
        errors = {batch.indices[k]: exc for k, exc in failed.items()} | batch.failed
        skipped = len(failed) + len(batch.failed)
        if skipped:
            self.dataset._count_skips(errors, skipped)
        return _Made(images, labels, skipped)

    def _crops(self, batch: PlannedBatch, ks: list[int]) -> tuple[list[Region | None], list[Crop]]:
        """What to decode of each record ``ks`` (the whole image, or the box grown by the resize
        filter's reach unless the crop is cut out first), and where its crop's box is in that."""
        regions: list[Region | None] = []
        crops = []
        for k in ks:
            plan, (width, height) = batch.plans[k], batch.sizes[k]
            if self.whole_images:
                left, top, box_w, box_h = plan.box
                cut_out = plan.crop_first  # train crops: the filter reads the box alone
                regions.append(None)
                crops.append(Crop(top=top, left=left, height=box_h, width=box_w, flip=plan.flip,
                                  rows=(int(top), int(top + box_h)) if cut_out else None,
                                  columns=(int(left), int(left + box_w)) if cut_out else None))
                continue
            cut = window(plan, width, height)
            (x0, y0), (w, h) = cut.anchor, cut.shape
            regions.append(Region(x0, y0, x0 + w, y0 + h))
            (top, left), (bottom, right) = cut.roi_start, cut.roi_end
            crops.append(Crop(top=top, left=left, height=bottom - top, width=right - left, flip=plan.flip))
        return regions, crops

    def _decode_on_cpu(self, batch: PlannedBatch, ks: list[int], images: torch.Tensor) -> dict[int, CorruptRecordError]:
        """Decode records ``ks`` with the torch backend's CPU code into their slots of ``images``;
        returns the records that failed under ``on_error="skip"`` (else their error is raised)."""
        if not ks:
            return {}
        out_h, out_w = self.dataset.pipeline.out_size
        host = torch.empty((len(ks), out_h, out_w, 3), dtype=torch.uint8)
        failed: dict[int, CorruptRecordError] = {}

        def one(j: int) -> None:
            k = ks[j]
            try:
                payload = batch.payloads[k]  # decode_crop searches bytes: a view of a worker's buffer is copied
                decode_crop(payload if isinstance(payload, bytes) else bytes(payload), batch.plans[k],
                            out=host[j].numpy(), where=batch.where(self.dataset, k), max_pixels=self.dataset.max_pixels)
            except CorruptRecordError as exc:
                if self.dataset.on_error != "skip":
                    raise
                failed[k] = exc

        self._cpu.map(one, len(ks))
        slots = torch.tensor(ks, dtype=torch.long, device=self.device)
        images[slots] = host.permute(0, 3, 1, 2).to(self.device)
        return failed

    def _hand_over(self, made: _Made | None, cpu_part: Any = None) -> tuple[torch.Tensor, Any]:
        """The batch on the loop's stream: the GPU part, after the CPU part if there is one,
        normalised; with the count of records ``on_error="skip"`` left out."""
        parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        skipped = 0
        if cpu_part is not None:
            skipped += skipped_in(cpu_part) or 0
            parts.append((cpu_part[0].to(self.device, non_blocking=True),
                          cpu_part[1].to(self.device, non_blocking=True)))
        if made is not None:
            skipped += made.skipped
            gpu_part = (made.images, made.labels)
            if self._streams is not None:
                gpu_part = ready_on_loop_stream(gpu_part, self._streams[1])
            parts.append(gpu_part)
        if len(parts) == 1:
            images, labels = parts[0]
        else:
            images, labels = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        if self.normalizer is not None:
            images = self.normalizer((images,))[0]
        batch: Any = (images, labels)
        return with_skips(batch, skipped) if skipped else batch
