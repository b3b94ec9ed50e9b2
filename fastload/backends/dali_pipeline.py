"""The DALI graph of the built-in image pipeline: encoded bytes + our crop plans → CHW batches."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from fastload.optional import require
from fastload.decode.transforms import CropPlan

PURPOSE = "DataLoader(backend='dali')"


class Window(NamedTuple):
    """What DALI cuts for one sample: the region it decodes, and the crop box inside that region.

    Attributes:
        anchor: ``(x, y)`` of the decoded region in the image, whole pixels.
        shape: ``(width, height)`` of the decoded region.
        roi_start: ``(y, x)`` of the plan's box in region pixels (fractional; ``fn.resize`` order).
        roi_end: ``(y, x)`` of the box's far corner in region pixels.
    """

    anchor: tuple[int, int]
    shape: tuple[int, int]
    roi_start: tuple[float, float]
    roi_end: tuple[float, float]


def window(plan: CropPlan, width: int, height: int) -> Window:
    """The decode region and resize ROI that reproduce ``decode_crop(plan)``'s resampling.

    Unless the plan cuts its box out first (train crops), the box is resized as Pillow resizes
    a ``box=`` of the whole image: the filter also reads pixels just outside the box. So the decoded region is the box grown by the filter's
    reach (half the downscale factor, plus one pixel) and clamped to the image; DALI's own
    crop helpers round differently and are not used.
    """
    left, top, box_w, box_h = plan.box
    out_h, out_w = plan.out_size
    reach_x = math.ceil(max(box_w / out_w, 1.0) / 2) + 1
    reach_y = math.ceil(max(box_h / out_h, 1.0) / 2) + 1
    if plan.crop_first:  # train crops: cut out, then resized (torchvision's resized_crop)
        reach_x = reach_y = 0
    x0, y0 = max(0, math.floor(left) - reach_x), max(0, math.floor(top) - reach_y)
    x1 = min(width, math.ceil(left + box_w) + reach_x)
    y1 = min(height, math.ceil(top + box_h) + reach_y)
    # Now the region is [x0, x1) × [y0, y1); the ROI is the box in its coordinates.
    return Window(anchor=(x0, y0), shape=(x1 - x0, y1 - y0),
                  roi_start=(top - y0, left - x0), roi_end=(top + box_h - y0, left + box_w - x0))


def feed_arrays(windows: Sequence[Window], flips: Sequence[bool]) -> dict[str, np.ndarray]:
    """A batch's windows and flips as dense arrays, one per external source (batch first)."""
    return {
        "anchor": np.array([w.anchor for w in windows], dtype=np.int32),
        "shape": np.array([w.shape for w in windows], dtype=np.int32),
        "roi_start": np.array([w.roi_start for w in windows], dtype=np.float32),
        "roi_end": np.array([w.roi_end for w in windows], dtype=np.float32),
        "flip": np.array(flips, dtype=np.int32),
    }


def build_pipeline(*, batch_size: int, out_size: tuple[int, int], gpu: bool, device_id: int | None,
                   num_threads: int, depth: int, mean: Sequence[float] | None,
                   std: Sequence[float] | None) -> Any:
    """A built DALI pipeline, fed under the names of :func:`feed_arrays` and ``encoded``.

    ``gpu=False`` runs DALI's CPU operators (``device_id`` must then be None); ``gpu=True``
    decodes with nvJPEG (``mixed``: the hardware decoder where there is one) and resizes on
    the GPU. The only output is the image batch: ``N×3×H×W`` uint8, or float32 normalised
    with ``mean``/``std`` (0–1 scale, as :class:`fastload.loading.transfer.Normalizer`).
    """
    dali = require("nvidia.dali", PURPOSE)
    fn = require("nvidia.dali.fn", PURPOSE)
    types = require("nvidia.dali.types", PURPOSE)
    out_h, out_w = out_size
    pipe = dali.Pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id,
                         prefetch_queue_depth=depth, exec_dynamic=True)
    with pipe:
        encoded = fn.external_source(name="encoded", dtype=types.UINT8, ndim=1)
        anchor = fn.external_source(name="anchor", dtype=types.INT32, ndim=1)
        shape = fn.external_source(name="shape", dtype=types.INT32, ndim=1)
        roi_start = fn.external_source(name="roi_start", dtype=types.FLOAT, ndim=1)
        roi_end = fn.external_source(name="roi_end", dtype=types.FLOAT, ndim=1)
        flip = fn.external_source(name="flip", dtype=types.INT32, ndim=0)
        # EXIF orientation is ignored, as by Pillow in the torch backend: the boxes were
        # planned on the stored width and height.
        extra = {"jpeg_fancy_upsampling": True} if gpu else {}
        images = fn.decoders.image_slice(encoded, anchor, shape, device="mixed" if gpu else "cpu",
                                         output_type=types.RGB, adjust_orientation=False,
                                         normalized_anchor=False, normalized_shape=False, **extra)
        # Now HWC uint8: the decoded region around the box (on the GPU when gpu=True).
        images = fn.resize(images, resize_x=out_w, resize_y=out_h, roi_start=roi_start,
                           roi_end=roi_end, roi_relative=False, interp_type=types.INTERP_LINEAR,
                           antialias=True)
        # Now HWC uint8 at the output size: flip, normalise, go channels-first in one pass.
        if mean is not None and std is not None:
            images = fn.crop_mirror_normalize(images, mirror=flip, dtype=types.FLOAT,
                                              mean=[255.0 * m for m in mean],
                                              std=[255.0 * s for s in std], output_layout="CHW")
        else:
            images = fn.crop_mirror_normalize(images, mirror=flip, dtype=types.UINT8,
                                              output_layout="CHW")
        pipe.set_outputs(images)
    pipe.build()
    return pipe
