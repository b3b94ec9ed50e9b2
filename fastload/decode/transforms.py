"""Transform stage: crop boxes and flips chosen from an image's size, before decoding a pixel."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Box = tuple[float, float, float, float]
"""``(left, top, width, height)`` in source pixels; Pillow's continuous coordinates."""


@dataclass(frozen=True)
class CropPlan:
    """What :func:`fastload.decode.crops.decode_crop` cuts from one image and delivers.

    Attributes:
        box: ``(left, top, width, height)`` in the original image's pixels (may be fractional).
        out_size: ``(height, width)`` of the output, torch order.
        flip: Mirror left to right after resizing.
        crop_first: Cut the box out, then resize it, as torchvision's ``resized_crop`` does
            (RandomResizedCrop); False resizes the box in place, its edge rows filtered with
            the pixels around it, as ``Resize`` then ``CenterCrop`` does (eval).
    """

    box: Box
    out_size: tuple[int, int]
    flip: bool = False
    crop_first: bool = False


def _out_size(image_size: int | tuple[int, int]) -> tuple[int, int]:
    if isinstance(image_size, (int, np.integer)) and not isinstance(image_size, bool):
        pair = (int(image_size), int(image_size))
    elif isinstance(image_size, (tuple, list)) and len(image_size) == 2:
        pair = tuple(image_size)
    else:
        raise ValueError(f"image_size must be an int or a (height, width) pair, got {image_size!r}")
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0
               for v in pair):
        raise ValueError(f"image_size must be positive integers, got {image_size!r}")
    return int(pair[0]), int(pair[1])


def _range(name: str, value: tuple[float, float]) -> tuple[float, float]:
    if len(value) != 2 or not 0 < value[0] <= value[1]:
        raise ValueError(f"{name} must be (min, max) with 0 < min <= max, got {value!r}")
    return float(value[0]), float(value[1])


def _check_image(width: int, height: int) -> None:
    if width < 1 or height < 1:
        raise ValueError(f"image size must be at least 1x1, got width={width}, height={height}")


def random_resized_crop_box(
    width: int,
    height: int,
    rng: np.random.Generator,
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """A random crop box drawn exactly as torchvision's ``RandomResizedCrop.get_params``.

    Up to 10 tries: area fraction uniform in ``scale``, aspect ratio (w/h) log-uniform in
    ``ratio``, kept if it fits, then top and left uniform. If none fits, the fallback is a
    centred crop of the whole image with its ratio clamped into ``ratio``. The random draws
    come from ``rng`` in torchvision's order (area, ratio, top, left), not from torch.

    Returns:
        ``(left, top, crop_width, crop_height)``, always inside the image and non-empty.
    """
    _check_image(width, height)
    scale = _range("scale", scale)
    ratio = _range("ratio", ratio)
    area = width * height
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    # max(1, …) only matters for extreme ratios on 1-pixel images; torchvision would crash.
    w, h = max(1, w), max(1, h)
    return (width - w) // 2, (height - h) // 2, w, h


def center_crop_box(
    width: int,
    height: int,
    image_size: int | tuple[int, int],
    *,
    resize_ratio: float = 0.875,
) -> tuple[float, float, float, float]:
    """The box in original pixels that torchvision's eval ``Resize`` + ``CenterCrop`` keeps.

    Matches ``Resize(round(image_size / resize_ratio))`` (shorter side, long side
    ``int(S * long / short)`` as torchvision truncates it) then ``CenterCrop(image_size)``
    (offsets ``round((resized - crop) / 2)``, Python rounding as torchvision). The crop is
    mapped back through each axis' resize scale, so the box is fractional. For an
    ``(h, w)`` pair, the side pinned to ``round(side / resize_ratio)`` is the one that makes
    the resized image cover the crop; for squares that is the shorter side, as torchvision.
    A crop that rounding makes larger than the resized image is clamped to it.

    Returns:
        ``(left, top, crop_width, crop_height)`` as floats, inside the image.
    """
    _check_image(width, height)
    out_h, out_w = _out_size(image_size)
    if not 0 < resize_ratio <= 1:
        raise ValueError(f"resize_ratio must be in (0, 1], got {resize_ratio}")
    target_h, target_w = round(out_h / resize_ratio), round(out_w / resize_ratio)
    if width * target_h <= height * target_w:
        new_w, new_h = target_w, int(target_w * height / width)
    else:
        new_w, new_h = int(target_h * width / height), target_h
    new_w, new_h = max(1, new_w), max(1, new_h)
    crop_w, crop_h = min(out_w, new_w), min(out_h, new_h)
    left, top = round((new_w - crop_w) / 2), round((new_h - crop_h) / 2)
    # Now in resized pixels; Pillow maps the full image onto the resized one per axis.
    sx, sy = width / new_w, height / new_h
    return left * sx, top * sy, crop_w * sx, crop_h * sy


@dataclass(frozen=True)
class TrainCrop:
    """Training geometry: ``RandomResizedCrop(image_size, scale, ratio)`` then a random flip.

    Attributes:
        image_size: Output side, or ``(height, width)``.
        scale: Range of the crop's area as a fraction of the image's.
        ratio: Range of the crop's aspect ratio, width / height.
        flip_prob: Chance of a left-right mirror.
    """

    image_size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_prob: float = 0.5

    def __post_init__(self) -> None:
        _out_size(self.image_size)
        _range("scale", self.scale)
        _range("ratio", self.ratio)
        if not 0.0 <= self.flip_prob <= 1.0:
            raise ValueError(f"flip_prob must be in [0, 1], got {self.flip_prob}")

    def sample(self, width: int, height: int, rng: np.random.Generator) -> CropPlan:
        """A plan for one image of ``width`` × ``height``; draws crop first, then flip."""
        box = random_resized_crop_box(width, height, rng, scale=self.scale, ratio=self.ratio)
        flip = bool(rng.random() < self.flip_prob)
        return CropPlan(box=box, out_size=_out_size(self.image_size), flip=flip, crop_first=True)


@dataclass(frozen=True)
class EvalCrop:
    """Evaluation geometry: resize the shorter side to ``image_size / resize_ratio``, centre crop.

    Attributes:
        image_size: Output side, or ``(height, width)``.
        resize_ratio: Crop side over resized side (ImageNet's 224/256 = 0.875).
    """

    image_size: int | tuple[int, int]
    resize_ratio: float = 0.875

    def __post_init__(self) -> None:
        _out_size(self.image_size)
        if not 0 < self.resize_ratio <= 1:
            raise ValueError(f"resize_ratio must be in (0, 1], got {self.resize_ratio}")

    def sample(self, width: int, height: int, rng: np.random.Generator | None = None) -> CropPlan:
        """The plan for one image of ``width`` × ``height``; ``rng`` is unused (no randomness)."""
        box = center_crop_box(width, height, self.image_size, resize_ratio=self.resize_ratio)
        return CropPlan(box=box, out_size=_out_size(self.image_size), flip=False)


def boxes_through_crop(boxes: np.ndarray, plan: CropPlan) -> tuple[np.ndarray, np.ndarray]:
    """Boxes ``(x0, y0, x1, y1)`` in the source image's pixels moved by ``plan`` as its pixels
    are: into the output's pixels, clipped to it, mirrored with a flip. Returns the boxes that keep
    an area (same dtype) and the mask of which input boxes they are (to drop their labels too)."""
    left, top, width, height = plan.box
    out_h, out_w = plan.out_size
    given = np.asarray(boxes)
    b = given.astype(np.float64).reshape(-1, 4)
    x0, x1 = ((b[:, [0, 2]] - left) * (out_w / width)).clip(0, out_w).T
    y0, y1 = ((b[:, [1, 3]] - top) * (out_h / height)).clip(0, out_h).T
    keep = (x1 > x0) & (y1 > y0)
    if plan.flip:
        x0, x1 = out_w - x1, out_w - x0
    moved = np.stack([x0, y0, x1, y1], axis=1)[keep]
    return moved.astype(given.dtype if given.dtype.kind == "f" else np.float64), keep
