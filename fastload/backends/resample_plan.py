"""The resample planned on the host: Pillow's bilinear taps of every output pixel of a batch, and
where each crop's source rows are, as one int64 and one float array per chunk the device takes in
two copies (:mod:`fastload.backends.crop_resample` runs them).

Pillow's antialiased bilinear resize is separable: output pixel ``o`` along an axis is a weighted
sum of at most ``2·⌈scale⌉ + 1`` source pixels, the weights depending only on the box and the
sizes. The native module computes them as the CPU path does (``crop_taps``, Pillow's own
arithmetic, the GIL released; about a millisecond a batch of 256); without it, NumPy does the
same sums. Each crop reads only its window (the pixels its taps reach); the crops of a chunk are
those of similar windows, within :data:`CHUNK_BYTES` once gathered and padded to the largest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

CHUNK_BYTES = 512 << 20
"""Most bytes of gathered windows (uint8 and their float copy) resampled at once (then the next chunk)."""
PRECISION_BITS = 22  # Pillow's fixed-point weights (resample_axes.h)


@dataclass(frozen=True)
class Crop:
    """Where one decoded region's crop is, in the region's pixels, and how it leaves.

    Attributes:
        top, left: the box's corner (fractional for eval crops).
        height, width: the box's size.
        flip: mirror left to right.
        rows, columns: the ``[start, end)`` the filter may read along each axis: the whole
            region, or the box itself when it is cut out before the resize (train crops).
            None: the whole region.
    """

    top: float
    left: float
    height: float
    width: float
    flip: bool
    rows: tuple[int, int] | None = None
    columns: tuple[int, int] | None = None


class Chunk(NamedTuple):
    """Crops resampled together. ``ints`` holds, back to back: the row taps' indices (``count ×
    out_h × row_taps``, into each crop's window), the column taps' (``count × out_w ×
    column_taps``, a flipped crop's read right to left), the crops' places in the output batch
    (``count``), and the byte offset of each gathered row (``count × rows``; a crop's rows past
    its window repeat its last); ``floats`` the row taps' weights, then the columns'."""

    count: int
    rows: int  # the tallest window
    columns: int  # the widest window, in pixels
    row_taps: int
    column_taps: int
    ints: torch.Tensor  # int64, on the host (pinned for a GPU)
    floats: torch.Tensor  # the resample's dtype, on the host

    def int_sizes(self, out_h: int, out_w: int) -> list[int]:
        n = self.count
        return [n * out_h * self.row_taps, n * out_w * self.column_taps, n, n * self.rows]

    def float_sizes(self, out_h: int, out_w: int) -> list[int]:
        return [self.count * out_h * self.row_taps, self.count * out_w * self.column_taps]


LineTaps = Callable[..., None]


def native_taps() -> LineTaps | None:
    """The native module's ``crop_taps``, or None where it is not built."""
    try:
        from fastload.decode._jpeg_region import crop_taps
    except ImportError:
        return None
    return crop_taps


def numpy_taps(starts: np.ndarray, extents: np.ndarray, lows: np.ndarray, highs: np.ndarray, flips: np.ndarray,
               out_size: int, index: np.ndarray, weights: np.ndarray, reach: np.ndarray) -> None:
    """``crop_taps`` in NumPy (the same arithmetic, for a machine without the native module)."""
    n = len(starts)
    taps = index.size // max(1, n * out_size)
    # As fastload_axis: the box in float (as Pillow takes it), everything else in double.
    start = (starts - lows).astype(np.float32)
    span = (starts - lows + extents).astype(np.float32) - start
    scale = span.astype(np.float64) / out_size
    stretch = np.maximum(scale, 1.0)[:, None]
    center = start.astype(np.float64)[:, None] + (np.arange(out_size) + 0.5) * scale[:, None]
    first = np.maximum(np.trunc(center - stretch + 0.5), 0)
    count = np.minimum(np.trunc(center + stretch + 0.5), (highs - lows)[:, None]) - first
    t = np.arange(taps)
    w = np.clip(1.0 - np.abs((first[..., None] + t - center[..., None] + 0.5) * (1.0 / stretch)[..., None]), 0.0, None)
    w *= t < count[..., None]
    total = w.sum(-1, keepdims=True)
    w = np.floor(np.divide(w, total, out=w, where=total != 0) * (1 << PRECISION_BITS) + 0.5) / (1 << PRECISION_BITS)
    begin = first.min(axis=1, initial=np.inf)[:, None]
    slots = np.where(t < count[..., None], first[..., None] - begin[..., None] + t, first[..., None] - begin[..., None])
    order = np.where(flips[:, None].astype(bool), np.arange(out_size)[::-1], np.arange(out_size))
    rows = np.arange(n)[:, None]
    index.reshape(n, out_size, taps)[rows, order] = slots
    weights.reshape(n, out_size, taps)[rows, order] = w
    reach.reshape(n, 2)[:] = np.stack([lows + begin[:, 0], lows + np.maximum((first + count).max(axis=1), begin[:, 0] + 1)], 1)


def plan_chunks(shapes: Sequence[tuple[int, int, int]], crops: Sequence[Crop], positions: Sequence[int],
                out_size: tuple[int, int], dtype: torch.dtype, pinned: bool = False) -> list[Chunk]:
    """The crops of decoded regions planned as chunks of similar windows, into ``out_size``.

    Args:
        shapes: each region's ``(height, width, row_bytes)``: 3 interleaved channels, rows
            ``row_bytes`` apart; the regions lie back to back (the last row of each unpadded).
        crops: each region's crop; positions: its place in the output batch.
        dtype: the device's weights (:func:`~fastload.backends.crop_resample.value_dtype`).
        pinned: make the host arrays in pinned memory (for a GPU).
    """
    if not shapes:
        return []
    out_h, out_w = out_size
    heights, widths, row_bytes = (np.array(side, dtype=np.int64) for side in zip(*shapes))
    starts = np.zeros(len(shapes), dtype=np.int64)
    np.cumsum(((heights - 1) * row_bytes + widths * 3)[:-1], out=starts[1:])
    boxes = np.array([[c.top, c.height, *(c.rows or (0, h)), c.left, c.width, *(c.columns or (0, w))]
                      for c, (h, w, _) in zip(crops, shapes)], dtype=np.float64)
    flips = np.array([c.flip for c in crops], dtype=np.uint8)
    # Windows as the taps will find them, a pixel or two over (a chunk's exact ones come with them).
    rough_rows, rough_columns = _rough_window(boxes[:, 0:4], out_h), _rough_window(boxes[:, 4:8], out_w)
    order = np.argsort(rough_rows * rough_columns, kind="stable")
    value_bytes = torch.empty(0, dtype=dtype).element_size()
    chunks, begin = [], 0
    while begin < len(order):  # grow a chunk while its padded windows fit the budget (at least one crop)
        rows = np.maximum.accumulate(rough_rows[order[begin:]])
        columns = np.maximum.accumulate(rough_columns[order[begin:]])
        cost = np.arange(1, len(rows) + 1) * rows * columns * 3 * (1 + value_bytes)
        end = begin + max(1, int(np.searchsorted(cost, CHUNK_BYTES, side="right")))
        members = order[begin:end]
        chunks.append(_chunk(members, int(rows[end - begin - 1]), boxes[members], flips[members], starts[members],
                             row_bytes[members], np.asarray(positions, dtype=np.int64)[members], out_size, dtype,
                             pinned))
        begin = end
    return chunks


def _rough_window(boxes: np.ndarray, out_len: int) -> np.ndarray:
    """At least the pixels each crop's taps reach along an axis: the box and the filter's reach."""
    stretch = np.maximum(boxes[:, 1] / out_len, 1.0)
    return np.minimum(np.ceil(boxes[:, 1] + 2 * stretch + 2), boxes[:, 3] - boxes[:, 2]).astype(np.int64)


def _taps_needed(boxes: np.ndarray, out_len: int) -> int:
    """Pillow's taps per output pixel for the widest filter among ``boxes`` (``2·⌈scale⌉ + 1``),
    the span in float as ``crop_taps`` takes it."""
    start = (boxes[:, 0] - boxes[:, 2]).astype(np.float32)
    span = (boxes[:, 0] - boxes[:, 2] + boxes[:, 1]).astype(np.float32) - start
    return int(np.ceil(np.maximum(span.astype(np.float64) / out_len, 1.0).max())) * 2 + 1


def _chunk(members: np.ndarray, rough_rows: int, boxes: np.ndarray, flips: np.ndarray, starts: np.ndarray,
           row_bytes: np.ndarray, places: np.ndarray, out_size: tuple[int, int], dtype: torch.dtype,
           pinned: bool) -> Chunk:
    n, (out_h, out_w) = len(members), out_size
    row_taps, column_taps = _taps_needed(boxes[:, 0:4], out_h), _taps_needed(boxes[:, 4:8], out_w)
    sizes = [n * out_h * row_taps, n * out_w * column_taps, n, n * rough_rows]
    ints = torch.empty(sum(sizes), dtype=torch.int64, pin_memory=pinned)
    floats = torch.empty(sizes[0] + sizes[1], dtype=dtype, pin_memory=pinned)
    row_index, column_index, place, _ = np.split(ints.numpy(), np.cumsum(sizes)[:-1])
    weights = np.empty(sizes[0] + sizes[1], dtype=np.float32)  # the taps' own precision, then the device's
    reach = np.empty((2, n, 2), dtype=np.int64)
    taps = native_taps() or numpy_taps
    box = np.ascontiguousarray(boxes.T)  # rows: top, height, low, high, left, width, low, high
    lines = box[[2, 3, 6, 7]].astype(np.int64)
    taps(box[0], box[1], lines[0], lines[1], np.zeros(n, dtype=np.uint8), out_h, row_index, weights[:sizes[0]], reach[0])
    taps(box[4], box[5], lines[2], lines[3], flips, out_w, column_index, weights[sizes[0]:], reach[1])
    floats.numpy()[:] = weights
    place[:] = places
    tall, wide = reach[0, :, 1] - reach[0, :, 0], reach[1, :, 1] - reach[1, :, 0]
    rows, columns = int(tall.max()), int(wide.max())
    if rows > rough_rows:
        raise RuntimeError(f"fastload: a crop's window has {rows} rows, over the {rough_rows} planned for; "
                           "a bug in fastload, please report it")
    # The gathered block's row r of crop k: its window's row r (its last past the window's end).
    r = np.minimum(np.arange(rows)[None, :], (tall - 1)[:, None])
    offsets = ints.numpy()[sum(sizes[:3]):sum(sizes[:3]) + n * rows].reshape(n, rows)
    np.add(starts[:, None] + reach[1, :, :1] * 3, (reach[0, :, :1] + r) * row_bytes[:, None], out=offsets)
    return Chunk(n, rows, columns, row_taps, column_taps, ints[:sum(sizes[:3]) + n * rows], floats)
