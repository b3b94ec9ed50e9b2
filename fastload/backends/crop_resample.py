"""Decoded regions → planned crops at the output size, a whole batch in a few torch ops (GPU or CPU).

Pillow's bilinear resampling (the torch backend's, bit for bit in its native code) is separable:
each output row is a weighted sum of a few source rows, each output column of a few source
columns, with weights that depend only on the box and the sizes. Written as matrices — one
``out × in`` per axis and image, zero outside the filter's reach — a batch's crops are two batched
matrix products, whatever their boxes: no per-image kernel launches, and flips are the
column matrix read backwards. Images of different sizes share one zero-padded buffer, taken in
chunks so that a batch of large photos does not take gigabytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

CHUNK_BYTES = 192 << 20
"""Most bytes of padded source pixels resampled at once (then the next chunk)."""


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


def pillow_weights(starts: torch.Tensor, extents: torch.Tensor, lows: torch.Tensor, highs: torch.Tensor,
                   out_len: int, max_len: int) -> torch.Tensor:
    """``n × out_len × max_len`` float32: Pillow's bilinear (antialiased) weights, one matrix a row.

    Row ``j`` of image ``k`` weighs the source pixels that Pillow's ``resize(box=)`` reads for
    output pixel ``j`` of the box ``[starts[k], starts[k] + extents[k])`` of a line whose pixels
    ``[lows[k], highs[k])`` may be read (Pillow's ``precompute_coeffs``: the filter widened by the
    downscale, its window rounded and clamped to the line, the weights normalised). With whole
    ``lows`` the windows are those of Pillow cutting ``[lows, highs)`` out first.
    """
    device = starts.device
    scale = extents / out_len
    filterscale = scale.clamp(min=1.0)
    center = starts[:, None] + (torch.arange(out_len, device=device, dtype=torch.float64) + 0.5) * scale[:, None]
    support = filterscale[:, None]  # the bilinear filter's support (1) widened by the downscale
    # The window's ends in double precision, as Pillow rounds them; the n × out × in grid in float32.
    low = torch.maximum(torch.trunc(center - support + 0.5), lows[:, None]).float()[..., None]
    high = torch.minimum(torch.trunc(center + support + 0.5), highs[:, None]).float()[..., None]
    pixel = torch.arange(max_len, device=device, dtype=torch.float32)
    weights = (1 - ((pixel - center.float()[..., None] + 0.5) / filterscale.float()[:, None, None]).abs()).clamp_(min=0)
    weights *= (pixel >= low) & (pixel < high)
    return weights / weights.sum(-1, keepdim=True).clamp_(min=1e-12)

def resample_into(out: torch.Tensor, positions: Sequence[int], regions: Sequence[torch.Tensor],
                  crops: Sequence[Crop]) -> None:
    """Resample each region's crop into ``out[positions[k]]`` (``N×3×H×W`` uint8, on the regions'
    device), rounding as Pillow does (half up, clamped to 0-255)."""
    order = sorted(range(len(regions)), key=lambda k: regions[k].shape[0] * regions[k].shape[1])
    start = 0
    while start < len(order):  # chunks of similar sizes, each within CHUNK_BYTES of padded pixels
        end, height, width = start, 0, 0
        while end < len(order):
            grown_h = max(height, regions[order[end]].shape[0])
            grown_w = max(width, regions[order[end]].shape[1])
            if end > start and (end + 1 - start) * grown_h * grown_w * 3 * 4 > CHUNK_BYTES:
                break
            end, height, width = end + 1, grown_h, grown_w
        chunk = order[start:end]
        _resample_chunk(out, [positions[k] for k in chunk], [regions[k] for k in chunk], [crops[k] for k in chunk])
        start = end

def _resample_chunk(out: torch.Tensor, positions: list[int], regions: list[torch.Tensor], crops: list[Crop]) -> None:
    device = out.device
    out_h, out_w = out.shape[2], out.shape[3]
    # fp16 on the GPU (pixels are exact in it, weights to 1/2048: well under a level), fp32 on the CPU.
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    height = max(r.shape[0] for r in regions)
    width = max(r.shape[1] for r in regions)
    padded = torch.zeros((len(regions), height, width, 3), dtype=dtype, device=device)
    for k, region in enumerate(regions):
        padded[k, :region.shape[0], :region.shape[1]] = region
    # Now n × H × W × 3: each region at its top left, zeros around (weighted 0).
    numbers = torch.tensor([[c.top, c.height, *(c.rows or (0, r.shape[0])), c.left, c.width,
                             *(c.columns or (0, r.shape[1]))] for c, r in zip(crops, regions)],
                           dtype=torch.float64).to(device)
    rows = pillow_weights(*numbers[:, 0:4].T, out_h, height).to(dtype)
    columns = pillow_weights(*numbers[:, 4:8].T, out_w, width)
    flips = torch.tensor([c.flip for c in crops], device=device)
    columns = torch.where(flips[:, None, None], columns.flip(1), columns).to(dtype)
    tall = torch.bmm(rows, padded.view(len(regions), height, width * 3)).view(len(regions), out_h, width, 3)
    # Now n × out_h × W × 3: rows resampled; then the columns, landing channels first.
    pixels = torch.einsum("niwc,njw->ncij", tall, columns)
    result = (pixels.float() + 0.5).clamp_(0, 255).to(torch.uint8)
    out[torch.tensor(positions, dtype=torch.long, device=device)] = result
