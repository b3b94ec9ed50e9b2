"""Decoded regions → planned crops at the output size: a whole batch in a fixed handful of torch ops.

The host plans every crop's taps (:mod:`fastload.backends.resample_plan`, Pillow's bilinear
weights, before the pixels are decoded); here the batch's decoded pixels are joined into one
buffer (one ``cat``), and for each
chunk of similar windows: the plan goes to the device in two copies, one indexed read gathers every
crop's window into one padded block, the taps are scattered into a row and a column matrix per
crop, two batched matrix products resample, one rounding, one indexed write into the batch.
About 30 operations a batch of any size (tests/backends/test_crop_resample.py counts them), not
work per image: on a GPU, ~20 kernel launches where per-image copies took hundreds.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fastload.backends.resample_plan import Chunk


def value_dtype(device: torch.device) -> torch.dtype:
    """What the resample computes in: fp16 on the GPU (pixels are exact in it, weights to 1/2048:
    well under a level), fp32 on the CPU."""
    return torch.float16 if device.type == "cuda" else torch.float32


def resample_into(out: torch.Tensor, pixels: Sequence[torch.Tensor], chunks: Sequence[Chunk]) -> None:
    """Resample the crops of the decoded regions ``pixels`` into their places in ``out``
    (``N×3×H×W`` uint8 on the regions' device), rounding as Pillow does (half up, clamped to 0-255).

    Args:
        pixels: each region's ``H×W×3`` uint8 pixels, flat (1-D, row after row).
        chunks: their crops, planned by :func:`~fastload.backends.resample_plan.plan_chunks` with
            ``out``'s size and :func:`value_dtype` (pinned for a GPU).
    """
    if not chunks:
        return
    total = sum(p.numel() for p in pixels)
    # A gathered line reads a whole window's width from where its row starts: room past the end.
    flat = torch.empty(total + 3 * max(c.columns for c in chunks), dtype=torch.uint8, device=out.device)
    torch.cat(list(pixels), out=flat[:total])
    for chunk in chunks:
        _resample_chunk(out, flat, chunk, value_dtype(out.device))


def _resample_chunk(out: torch.Tensor, flat: torch.Tensor, chunk: Chunk, dtype: torch.dtype) -> None:
    n, rows, columns = chunk.count, chunk.rows, chunk.columns
    out_h, out_w = out.shape[2], out.shape[3]
    # From pinned memory on a GPU: copies the host does not wait for.
    ints = chunk.ints.to(out.device, non_blocking=True)
    row_index, column_index, places, offsets = ints.split(chunk.int_sizes(out_h, out_w))
    row_weights, column_weights = chunk.floats.to(out.device, non_blocking=True).split(chunk.float_sizes(out_h, out_w))
    row_matrix = torch.zeros((n, out_h, rows), dtype=dtype, device=out.device).scatter_add_(
        2, row_index.view(n, out_h, -1), row_weights.view(n, out_h, -1))
    column_matrix = torch.zeros((n, out_w, columns), dtype=dtype, device=out.device).scatter_add_(
        2, column_index.view(n, out_w, -1), column_weights.view(n, out_w, -1))
    # Every crop's window, rows padded to the tallest and lines to the widest (the padding is
    # other pixels, weighted 0): n × rows × (columns · 3).
    windows = flat.unfold(0, columns * 3, 1).index_select(0, offsets).view(n, rows, columns * 3).to(dtype)
    tall = torch.bmm(windows.transpose(1, 2), row_matrix.transpose(1, 2))
    # Now n × (columns · 3) × out_h: rows resampled; then the columns, as n × out_w × (3 · out_h).
    wide = torch.bmm(column_matrix, tall.view(n, columns, 3 * out_h))
    result = wide.add_(0.5).clamp_(0, 255).view(n, out_w, 3, out_h).permute(0, 2, 3, 1)
    out.index_copy_(0, places, result.to(torch.uint8))
