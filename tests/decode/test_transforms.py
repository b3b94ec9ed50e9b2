"""Crop geometry: boxes inside the image, torchvision's RandomResizedCrop and eval crop rules."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastload.sampling.order import sample_rng
from fastload.decode.transforms import (
    CropPlan,
    EvalCrop,
    TrainCrop,
    center_crop_box,
    random_resized_crop_box,
)

sides = st.integers(min_value=1, max_value=5000)
seeds = st.integers(min_value=0, max_value=2**32)


def torchvision_get_params(width, height, rng, scale, ratio):
    """torchvision 0.20 ``RandomResizedCrop.get_params``, line for line, drawing from ``rng``.

    The only changes: ``torch.empty(1).uniform_`` / ``torch.randint`` became the numpy
    generator's ``uniform`` / ``integers`` (same order), and it returns (left, top, w, h).
    """
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(rng.integers(0, height - h + 1))
            j = int(rng.integers(0, width - w + 1))
            return j, i, w, h
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    i = (height - h) // 2
    j = (width - w) // 2
    return j, i, w, h


@settings(max_examples=300, deadline=None)
@given(width=sides, height=sides, seed=seeds)
def test_random_crop_matches_torchvision_and_stays_inside(width, height, seed):
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    box = random_resized_crop_box(width, height, np.random.default_rng(seed))
    assert box == torchvision_get_params(width, height, np.random.default_rng(seed), scale, ratio)
    left, top, w, h = box
    assert all(isinstance(v, int) for v in box)
    assert 0 <= left and left + w <= width and 0 < w
    assert 0 <= top and top + h <= height and 0 < h


@settings(max_examples=200, deadline=None)
@given(width=st.integers(200, 3000), height=st.integers(200, 3000), seed=seeds,
       lo=st.floats(0.05, 0.9), ratio_hi=st.floats(1.0, 3.0))
def test_accepted_crops_respect_area_and_ratio(width, height, seed, lo, ratio_hi):
    scale, ratio = (lo, 1.0), (1 / ratio_hi, ratio_hi)
    left, top, w, h = random_resized_crop_box(
        width, height, np.random.default_rng(seed), scale=scale, ratio=ratio
    )
    fallback_w = min(width, round(height * ratio[1]))
    fallback_h = min(height, round(width / ratio[0]))
    if (w, h) == (fallback_w, fallback_h):
        return  # could be the fallback, checked on its own below
    # w and h are the rounded sides of a crop whose area and ratio were in range.
    area = width * height
    assert (w + 0.5) * (h + 0.5) >= scale[0] * area * (1 - 1e-9)
    assert (w - 0.5) * (h - 0.5) <= scale[1] * area * (1 + 1e-9)
    assert (w - 0.5) / (h + 0.5) <= ratio[1] * (1 + 1e-9)
    assert (w + 0.5) / (h - 0.5) >= ratio[0] * (1 - 1e-9)


def test_fallback_is_a_centred_crop_with_clamped_ratio():
    # No crop of >= 8% area fits a 1000x10 strip at ratio <= 4/3, so every try fails.
    assert random_resized_crop_box(1000, 10, np.random.default_rng(0)) == (493, 0, 13, 10)
    assert random_resized_crop_box(10, 1000, np.random.default_rng(0)) == (0, 493, 10, 13)
    # Inside the ratio range with a scale that can never fit: the whole image.
    whole = random_resized_crop_box(400, 300, np.random.default_rng(0), scale=(1.5, 2.0))
    assert whole == (0, 0, 400, 300)


def test_area_fractions_cover_the_scale_range():
    rng = np.random.default_rng(0)
    fractions = []
    for _ in range(2000):
        _, _, w, h = random_resized_crop_box(500, 375, rng)
        fractions.append(w * h / (500 * 375))
    assert min(fractions) < 0.1 and max(fractions) > 0.9


@pytest.mark.parametrize(
    "kwargs,name",
    [(dict(scale=(0.5, 0.1)), "scale"), (dict(scale=(0.0, 1.0)), "scale"),
     (dict(ratio=(2.0, 1.0)), "ratio"), (dict(ratio=(-1.0, 1.0)), "ratio")],
)
def test_bad_ranges_are_refused(kwargs, name):
    with pytest.raises(ValueError, match=name):
        random_resized_crop_box(100, 100, np.random.default_rng(0), **kwargs)
    with pytest.raises(ValueError, match=name):
        TrainCrop(224, **kwargs)


def test_center_crop_box_matches_resize_then_center_crop_by_hand():
    # Resize(256) makes 500x375 into 341x256 (int(256 * 500 / 375) = 341); CenterCrop(224)
    # then starts at round(117 / 2) = 58 (Python rounds half to even) and round(32 / 2) = 16.
    sx, sy = 500 / 341, 375 / 256
    box = center_crop_box(500, 375, 224)
    assert box == pytest.approx((58 * sx, 16 * sy, 224 * sx, 224 * sy))
    # Portrait: width is the shorter side.
    box = center_crop_box(375, 500, 224)
    assert box == pytest.approx((16 * sy, 58 * sx, 224 * sy, 224 * sx))


@settings(max_examples=300, deadline=None)
@given(width=sides, height=sides, out_h=st.integers(1, 600), out_w=st.integers(1, 600),
       resize_ratio=st.floats(0.3, 1.0))
def test_center_crop_box_is_inside_and_keeps_the_output_shape(width, height, out_h, out_w,
                                                               resize_ratio):
    left, top, w, h = center_crop_box(width, height, (out_h, out_w), resize_ratio=resize_ratio)
    eps = 1e-9 * max(width, height)
    assert -eps <= left and left + w <= width + eps and w > 0
    assert -eps <= top and top + h <= height + eps and h > 0
    if resize_ratio <= 0.9 and min(width, height) >= 8 and min(out_h, out_w) >= 8:
        # The crop fits the resized image, so its shape is the output's, up to the
        # integer sizes of the resized image.
        assert (w / h) / (out_w / out_h) == pytest.approx(1.0, rel=0.25)


def test_center_crop_is_centred():
    left, top, w, h = center_crop_box(1000, 800, 224)
    assert left + w / 2 == pytest.approx(500, abs=2)
    assert top + h / 2 == pytest.approx(400, abs=2)


def test_train_crop_plan_is_deterministic_per_record():
    crop = TrainCrop(224)
    plans = [crop.sample(640, 480, sample_rng(1, 2, 3)) for _ in range(2)]
    assert plans[0] == plans[1]
    assert plans[0].out_size == (224, 224)
    assert isinstance(plans[0], CropPlan)


def test_flip_probability_extremes_and_mix():
    assert not any(TrainCrop(32, flip_prob=0.0).sample(64, 64, sample_rng(0, 0, i)).flip
                   for i in range(50))
    assert all(TrainCrop(32, flip_prob=1.0).sample(64, 64, sample_rng(0, 0, i)).flip
               for i in range(50))
    flips = [TrainCrop(32).sample(64, 64, sample_rng(0, 0, i)).flip for i in range(400)]
    assert 100 < sum(flips) < 300


def test_eval_crop_plan():
    plan = EvalCrop((224, 320)).sample(1000, 700)
    assert plan.out_size == (224, 320) and plan.flip is False
    assert plan.box == center_crop_box(1000, 700, (224, 320))


@pytest.mark.parametrize("image_size", [0, -3, (224,), (224, 0), 22.4, "224", True])
def test_bad_image_size_is_refused(image_size):
    with pytest.raises(ValueError, match="image_size"):
        TrainCrop(image_size)
    with pytest.raises(ValueError, match="image_size"):
        EvalCrop(image_size)


@pytest.mark.parametrize("ratio", [0.0, 1.5, -0.875])
def test_bad_resize_ratio_is_refused(ratio):
    with pytest.raises(ValueError, match="resize_ratio"):
        EvalCrop(224, resize_ratio=ratio)


def test_bad_flip_prob_and_image_dimensions_are_refused():
    with pytest.raises(ValueError, match="flip_prob"):
        TrainCrop(224, flip_prob=1.5)
    with pytest.raises(ValueError, match="width=0"):
        random_resized_crop_box(0, 10, np.random.default_rng(0))
