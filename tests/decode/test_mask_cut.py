"""The cut of a mask stored as rows (fastload.decode.masks.cut_mask): the native cut gives the NumPy
cut's values to the bit for every element type, layout and plan (boxes past the edges, up- and
downscaled, flipped); both name a damaged stored mask alike; the native function refuses outputs
that do not fit."""

from __future__ import annotations

import numpy as np
import pytest
from fastload.converters.packing.mask_rows import mask_rows

from fastload.decode import masks
from fastload.decode.masks import _OUT, cut_mask, cut_mask_numpy, read_mask_rows
from fastload.decode.transforms import CropPlan
from fastload.errors import CorruptRecordError
from fastload.format.mask_rows import HEADER

native = pytest.mark.skipif(masks.mask_rows_into is None, reason="fastload.decode._jpeg_region is not built")


def stored_masks(rng: np.random.Generator) -> list[np.ndarray]:
    """Values of each stored element and layout: sparse class ids (runs), 16-bit noise (raw),
    16-bit bands (runs), small int32s, floats with -0.0 and NaN, one column, a long row (4-byte lengths)."""
    h, w = 37, 53
    return [(rng.integers(0, 4, (h, w)) * (rng.random((h, w)) < 0.05)).astype(np.uint8),
            rng.integers(0, 2**16, (h, w)).astype(np.uint16),
            np.repeat(rng.integers(0, 3, (h, 1)), w, 1).astype(np.uint16),
            rng.integers(-5, 5, (h, w)).astype(np.int32),
            rng.choice([0.0, -0.0, 1.5, np.nan], (h, w)).astype(np.float32),
            rng.integers(0, 3, (h, 1)).astype(np.uint8),
            np.full((3, 70000), 7, dtype=np.uint8)]


def random_plan(rng: np.random.Generator, width: int, height: int) -> CropPlan:
    box_w, box_h = rng.uniform(0.3, width * 1.2), rng.uniform(0.3, height * 1.2)
    left, top = rng.uniform(-2, max(width - box_w, 0) + 2), rng.uniform(-2, max(height - box_h, 0) + 2)
    return CropPlan((left, top, box_w, box_h), (int(rng.integers(1, 70)), int(rng.integers(1, 70))),
                    bool(rng.integers(2)))


@native
def test_the_native_cut_gives_the_numpy_cut_to_the_bit():
    rng = np.random.default_rng(4)
    layouts = set()
    for values in stored_masks(rng):
        mask = read_mask_rows(mask_rows(values), where="x", max_pixels=10**9)
        layouts.add((values.dtype.str, mask.row_starts is None, None if mask.lengths is None else mask.lengths.itemsize))
        for _ in range(40):
            plan = random_plan(rng, mask.width, mask.height)
            got = np.zeros(plan.out_size, _OUT[mask.element.str])
            want = np.ones_like(got)
            cut_mask(mask, plan, got, "x")
            cut_mask_numpy(mask, plan, want, "x")
            assert got.tobytes() == want.tobytes(), (values.dtype, plan)
    assert {raw for _, raw, _ in layouts} == {True, False} and ("|u1", False, 4) in layouts  # 4-byte lengths


@pytest.mark.parametrize("cut", [pytest.param(cut_mask, marks=native), cut_mask_numpy])
def test_a_damaged_stored_mask_is_named_by_either_cut(cut):
    stored = mask_rows(np.zeros((5, 60), dtype=np.uint8))  # 5 runs, one a row
    lengths = HEADER.size + 4 * 6
    mask = read_mask_rows(stored[:lengths] + b"\0" * 10 + stored[lengths + 10:], where="x", max_pixels=10**6)
    with pytest.raises(CorruptRecordError, match="record 3 field 'mask': .*rows 0..4 are not 60 pixels each.*re-pack"):
        cut(mask, CropPlan((0, 0, 60, 5), (4, 4)), np.zeros((4, 4), np.uint8), "record 3 field 'mask'")


@native
def test_the_native_cut_refuses_what_it_cannot_cut_into():
    mask = read_mask_rows(mask_rows(np.zeros((5, 60), dtype=np.uint16)), where="x", max_pixels=10**6)
    plan = CropPlan((0, 0, 60, 5), (4, 4))
    for out in (np.zeros((4, 4), np.uint8), np.zeros((4, 8), np.int32)[:, ::2], np.zeros((4, 4, 1), np.int32)):
        with pytest.raises(ValueError, match="out must be a non-empty C-contiguous 2-D array"):
            masks.mask_rows_into(mask.values, mask.lengths, mask.row_starts, 60, 5, *plan.box, True, False, out)
    with pytest.raises(ValueError, match="too few values for rows 0..4"):  # raw rows, one pixel short
        masks.mask_rows_into(np.zeros(299, np.uint8), None, None, 60, 5, 0, 0, 60, 5, False, False,
                             np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match="rows 0..4 are not 60 pixels"):  # row starts past the runs
        masks.mask_rows_into(mask.values, mask.lengths, np.array([0, 1, 2, 3, 4, 9], "<u4"), 60, 5, *plan.box,
                             True, False, np.zeros((4, 4), np.int32))
