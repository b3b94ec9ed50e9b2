"""The decode stage of the GPU pipeline: a planned batch's JPEGs parsed, each given to its engine
(:mod:`fastload.backends.decode_engines`), decoded on the decode stream, and the batch's resample
planned on the host meanwhile; an event marks where the decode's GPU work ends.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from fastload.backends.crop_resample import value_dtype
from fastload.backends.dali_pipeline import window
from fastload.backends.decode_engines import ORDER, Engine, facts_of, next_engine, route
from fastload.backends.nvimgcodec_decoder import DecodedImage, EngineDecoders, Region
from fastload.backends.planned import PlannedBatch
from fastload.backends.resample_plan import Chunk, Crop, plan_chunks
from fastload.backends.stage_trace import NO_TRACE
from fastload.backends.stream_events import in_stream, on_device, recorded


class Decoded(NamedTuple):
    """One batch through nvImageCodec, not yet resampled.

    Attributes:
        batch: the planned batch.
        number: its place in the pass (the stage trace's batch number).
        on_device: the batch positions nvImageCodec decoded, in order.
        images: their pixels (on the device), in ``on_device``'s order.
        chunks: their resample, planned.
        engines: the engine that decoded each record of the batch (``cpu``: the CPU path's to do).
        done: recorded on the decode stream after the decode (None on the CPU).
    """

    batch: PlannedBatch
    number: int
    on_device: list[int]
    images: list[DecodedImage]
    chunks: list[Chunk]
    engines: list[Engine]
    done: torch.cuda.Event | None


class DecodeStage:
    """Parses, routes and decodes one planned batch at a time (called by the decode thread).

    Args:
        dataset: the PackedDataset (its pipeline's output size).
        decoders: one nvImageCodec decoder per engine of the device.
        stream: the decode stream (None on the CPU).
        whole_images: decode whole images (else each crop's region).
    """

    def __init__(self, dataset: Any, decoders: EngineDecoders, stream: torch.cuda.Stream | None,
                 whole_images: bool) -> None:
        self.dataset, self.decoders, self.stream = dataset, decoders, stream
        self.device = decoders.device
        self.whole_images = whole_images
        self.trace: Any = NO_TRACE

    def __call__(self, number: int, batch: PlannedBatch) -> Decoded:
        with on_device(self.device), self.trace.stage("decode", number):
            engines, decoded, done = self._decode(batch)
            taken = sorted(decoded)
            images = [decoded[k] for k in taken]
            crops = [self.region_and_crop(batch, k)[1] for k in taken]
            # Planned while the GPU decodes; the regions' rows may be padded (row_bytes).
            chunks = plan_chunks([(im.height, im.width, im.row_bytes) for im in images], crops, taken,
                                 self.dataset.pipeline.out_size, value_dtype(self.device),
                                 pinned=self.device.type == "cuda")
        return Decoded(batch, number, taken, images, chunks, engines, done)

    def _decode(self, batch: PlannedBatch) -> tuple[list[Engine], dict[int, DecodedImage], torch.cuda.Event | None]:
        available = self.decoders.engines
        decoded: dict[int, DecodedImage] = {}
        with self.decoders.lock, in_stream(self.stream):
            parsed = [self.decoders.parse(payload) for payload in batch.payloads]
            engines: list[Engine] = [route(facts_of(payload, code), available) if code is not None else "cpu"
                                     for payload, code in zip(batch.payloads, parsed)]
            try:
                for engine in ORDER[:-1]:  # hardware, CUDA (with what the hardware failed on), CPU codecs
                    ks = [k for k, e in enumerate(engines) if e == engine]
                    if not ks:
                        continue
                    regions = [self.region_and_crop(batch, k)[0] for k in ks]
                    got = self.decoders.by_engine[engine].decode([parsed[k] for k in ks], regions, self.stream)
                    for k, image in zip(ks, got):
                        if image is None:
                            engines[k] = next_engine(engine, available)
                        else:
                            decoded[k] = image
            finally:  # also after a failed decode: what it queued may still read the payloads
                done = recorded(self.stream)
                if done is not None and batch.lease is not None:
                    batch.lease.read_until(done)  # its payload slot is released once the GPU has read it
        return engines, decoded, done

    def region_and_crop(self, batch: PlannedBatch, k: int) -> tuple[Region | None, Crop]:
        """What to decode of record ``k`` (None: the whole image; else the box grown by the resize
        filter's reach unless the crop is cut out first) and where its crop is in that."""
        plan, (width, height) = batch.plans[k], batch.sizes[k]
        if self.whole_images:
            left, top, box_w, box_h = plan.box
            # Train crops with whole-pixel corners are cut out first: the filter reads the box alone.
            cut_out = plan.crop_first and all(float(v).is_integer() for v in plan.box)
            return None, Crop(top=top, left=left, height=box_h, width=box_w, flip=plan.flip,
                              rows=(int(top), int(top + box_h)) if cut_out else None,
                              columns=(int(left), int(left + box_w)) if cut_out else None)
        cut = window(plan, width, height)
        (x0, y0), (w, h) = cut.anchor, cut.shape
        (top, left), (bottom, right) = cut.roi_start, cut.roi_end
        return Region(x0, y0, x0 + w, y0 + h), Crop(top=top, left=left, height=bottom - top, width=right - left,
                                                     flip=plan.flip)
