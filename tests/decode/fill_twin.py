"""The pixel cache's native fill and crops written down in numpy, step by step, for
test_fill_native.py's exact-bytes checks: fill_resize.c's axes and passes, fill_colour.c's colours
and chroma upsampling, fill_crop.c's crop from stored planes."""

from __future__ import annotations

import math

import numpy as np

from fastload.pixels.layout import chroma_size

ONE = 1 << 14


def axis(in_size: int, in0: float, in1: float, out_size: int) -> tuple[list[int], np.ndarray]:
    """fill_resize.c's weights, step by step in the same float64 operations: each output pixel's
    first input pixel, and its 14-bit weights (rows; zeros past its count)."""
    scale = (in1 - in0) / out_size
    stretch = max(scale, 1.0)
    firsts, rows = [], []
    for i in range(out_size):
        center = in0 + (i + 0.5) * scale
        lo, hi = max(int(center - stretch + 0.5), 0), min(int(center + stretch + 0.5), in_size)
        w = [1.0 - x if (x := abs((t + lo - center + 0.5) * (1.0 / stretch))) < 1.0 else 0.0 for t in range(hi - lo)]
        total = sum(w)
        k = [math.floor((v / total if total > 0 else 1.0 / len(w)) * ONE + 0.5) for v in w]
        k[k.index(max(k))] += ONE - sum(k)
        firsts.append(lo)
        rows.append(k)
    weights = np.zeros((out_size, max(len(k) for k in rows)), np.int64)
    for i, k in enumerate(rows):
        weights[i, :len(k)] = k
    return firsts, weights


def one_pass(plane: np.ndarray, firsts: list[int], weights: np.ndarray) -> np.ndarray:
    """One pass along axis 0 of a plane, rounded to 8 bits as fill_resize.c rounds."""
    taps = weights.shape[1]
    padded = np.concatenate([plane, np.zeros((taps, plane.shape[1]), plane.dtype)]).astype(np.int64)
    out = np.empty((len(firsts), plane.shape[1]), np.uint8)
    for i, first in enumerate(firsts):
        out[i] = np.clip((weights[i] @ padded[first:first + taps] + ONE // 2) >> 14, 0, 255)
    return out


def resize(plane: np.ndarray, box: tuple[float, ...], size: tuple[int, int], cut: bool = False) -> np.ndarray:
    """The fill's resize of ``box`` of a plane to ``size`` (width, height): rows pass, then
    columns; ``cut``: the box (whole pixels) cut out first."""
    x0, y0, x1, y1 = box
    if cut:
        plane, (x0, y0, x1, y1) = plane[int(y0):int(y1), int(x0):int(x1)], (0, 0, x1 - x0, y1 - y0)
    rows = one_pass(plane, *axis(plane.shape[0], y0, y1, size[1]))
    return one_pass(rows.T, *axis(plane.shape[1], x0, x1, size[0])).T


FIX = {k: int(k * 65536 + 0.5) for k in (0.299, 0.587, 0.114, 0.16874, 0.33126, 0.5, 0.41869, 0.08131, 1.402,
                                         0.34414, 0.71414, 1.772)}  # jccolor.c's and jdcolor.c's weights


def rgb_of(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> np.ndarray:
    """libjpeg's YCbCr to RGB (jdcolor.c), as fill_colour.c writes it down."""
    y, u, v, half = y.astype(np.int64), cb.astype(np.int64) - 128, cr.astype(np.int64) - 128, 1 << 15
    rgb = [y + ((FIX[1.402] * v + half) >> 16), y + ((-FIX[0.34414] * u - FIX[0.71414] * v + half) >> 16),
           y + ((FIX[1.772] * u + half) >> 16)]
    return np.clip(np.stack(rgb, -1), 0, 255).astype(np.uint8)


def planes_of(rgb: np.ndarray) -> np.ndarray:
    """fill_colour.c's RGB to planes: Y per pixel, chroma the rounded mean of each 2 x 2 (edges repeated)."""
    p = rgb.astype(np.int64)
    r, g, b = p[..., 0], p[..., 1], p[..., 2]
    y = (FIX[0.299] * r + FIX[0.587] * g + FIX[0.114] * b + (1 << 15)) >> 16
    out = [y.reshape(-1)]
    for chroma in (-FIX[0.16874] * r - FIX[0.33126] * g + FIX[0.5] * b,
                   FIX[0.5] * r - FIX[0.41869] * g - FIX[0.08131] * b):
        c = np.pad(chroma, ((0, chroma.shape[0] % 2), (0, chroma.shape[1] % 2)), mode="edge")
        sums = c[0::2, 0::2] + c[0::2, 1::2] + c[1::2, 0::2] + c[1::2, 1::2]
        out.append(np.clip((sums + (128 << 18) + (1 << 17)) >> 18, 0, 255).reshape(-1))
    return np.concatenate(out).astype(np.uint8)


def split(planes: np.ndarray, width: int, height: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    (cw, ch), n = chroma_size(width, height), width * height
    return planes[:n].reshape(height, width), planes[n:n + cw * ch].reshape(ch, cw), planes[n + cw * ch:].reshape(ch, cw)


def fancy(c: np.ndarray, width: int, height: int, odd_bias: int = 7) -> np.ndarray:
    """libjpeg's h2v2 fancy upsampling (jdsample.c: triangle weights 3/4, 1/4, edges repeated;
    libjpeg rounds with 8 and 7 by turns, the crop's upsampling with 8 on both: ``odd_bias``)."""
    p = np.pad(c.astype(np.int64), 1, mode="edge")
    out = np.empty((2 * c.shape[0], 2 * c.shape[1]), np.int64)
    for start, colsum in ((0, 3 * p[1:-1] + p[:-2]), (1, 3 * p[1:-1] + p[2:])):
        out[start::2, 0::2] = (3 * colsum[:, 1:-1] + colsum[:, :-2] + 8) >> 4
        out[start::2, 1::2] = (3 * colsum[:, 1:-1] + colsum[:, 2:] + odd_bias) >> 4
    return out[:height, :width]


def crop_twin(planes: np.ndarray, width: int, height: int, box: tuple[float, ...], size: tuple[int, int],
              crop_first: bool) -> np.ndarray:
    """fill_crop.c's crop (unmirrored): Y resized to ``size``; Cb and Cr over the box at their half
    scale (widened so that each sample covers two output pixels) resized to half of ``size``,
    rounded up, then upsampled 2x with the symmetric rounding; then RGB."""
    y, cb, cr = split(planes, width, height)
    (w, h), (x0, y0, x1, y1) = size, box
    hw, hh = (w + 1) // 2, (h + 1) // 2
    half = (x0 / 2, y0 / 2, x0 / 2 + (x1 - x0) * hw / w, y0 / 2 + (y1 - y0) * hh / h)
    cut = crop_first and all(float(v).is_integer() for v in box)
    cb, cr = (fancy(resize(c, half, (hw, hh)), w, h, odd_bias=8) for c in (cb, cr))
    return rgb_of(resize(y, box, size, cut), cb, cr)
