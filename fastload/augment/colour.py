"""User augmentation stage: colour jitter and grayscale, per image, on float pixels in [0, 1]."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fastload.augment.inputs import _images_of, _replace

Range = float | tuple[float, float]
Norm = Sequence[float] | None

_LUMA = (0.299, 0.587, 0.114)  # ITU-R 601-2, as PIL's "L"
_LUMA_16 = (19595, 38470, 7471)  # the same in 1/65536ths: PIL's integer conversion for uint8


# --- pixel scale: every colour operation works on float images in [0, 1] -----------------------

def _norm(mean: Norm, std: Norm) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    if mean is None and std is None:
        return None
    if mean is None or std is None:
        raise ValueError(f"mean and std go together: got mean={mean!r}, std={std!r}; "
                         "pass both (the loader's values) or neither")
    mean_t, std_t = tuple(float(v) for v in mean), tuple(float(v) for v in std)
    if len(mean_t) != 3 or len(std_t) != 3:
        raise ValueError(f"mean and std must have 3 values (R, G, B), "
                         f"got mean={mean!r}, std={std!r}")
    if not all(s > 0 for s in std_t):
        raise ValueError(f"std must be positive, got {std!r}")
    return mean_t, std_t


def _to_unit(images: torch.Tensor, norm: tuple | None) -> torch.Tensor:
    """Float32 images in [0, 1]: uint8 / 255, normalised ones un-normalised, other floats as is."""
    if images.dtype == torch.uint8:
        return images.float() / 255
    if not images.is_floating_point():
        raise TypeError(f"images must be uint8 or floating point, got {images.dtype}")
    x = images.float()
    if norm is not None:
        mean, std = (torch.tensor(v, device=x.device).view(1, 3, 1, 1) for v in norm)
        x = x * std + mean
    return x


def _from_unit(x: torch.Tensor, like: torch.Tensor, norm: tuple | None) -> torch.Tensor:
    if like.dtype == torch.uint8:
        return (x * 255).round_().clamp_(0, 255).to(torch.uint8)
    if norm is not None:
        mean, std = (torch.tensor(v, device=x.device).view(1, 3, 1, 1) for v in norm)
        x = (x - mean) / std
    return x.to(like.dtype)


def _luma(x: torch.Tensor) -> torch.Tensor:
    """N×1×H×W gray of N×3×H×W float images."""
    return (_LUMA[0] * x[:, 0] + _LUMA[1] * x[:, 1] + _LUMA[2] * x[:, 2]).unsqueeze(1)


def _shift_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotate the HSV hue of [0, 1] images by ``shift`` (N, in turns); saturation and value stay."""
    r, g, b = x.unbind(1)
    v, _ = x.max(1)
    delta = v - x.min(1)[0]
    safe = torch.where(delta > 0, delta, torch.ones_like(delta))
    hue = torch.where(v == r, (g - b) / safe,
                      torch.where(v == g, 2 + (b - r) / safe, 4 + (r - g) / safe))
    hue = torch.remainder(hue / 6 + shift.view(-1, 1, 1), 1.0)
    sat = delta / torch.where(v > 0, v, torch.ones_like(v))
    # HSV → RGB in closed form: channel n (R=5, G=3, B=1) is v - v·s·clamp(min(k, 4-k), 0, 1).
    k = torch.remainder(torch.tensor([5.0, 3.0, 1.0], device=x.device).view(1, 3, 1, 1)
                        + 6 * hue.unsqueeze(1), 6)
    ramp = torch.minimum(k, 4 - k).clamp_(0, 1)
    return v.unsqueeze(1) * (1 - sat.unsqueeze(1) * ramp)


# --- colour ------------------------------------------------------------------------------------

def _factor_range(name: str, value: Range, *, center: float,
                  bound: float | None) -> tuple[float, float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not (math.isfinite(value) and 0 <= value <= (math.inf if bound is None else bound)):
            limit = f"in [0, {bound}]" if bound is not None else "non-negative"
            raise ValueError(f"{name} must be {limit}, got {value}")
        lo, hi = center - value, center + value
        return (max(0.0, lo) if bound is None else lo), hi
    if isinstance(value, (tuple, list)) and len(value) == 2:
        lo, hi = float(value[0]), float(value[1])
        floor = 0.0 if bound is None else -bound
        ceil = math.inf if bound is None else bound
        if not floor <= lo <= hi <= ceil:
            raise ValueError(f"{name} as (min, max) must satisfy {floor} <= min <= max <= {ceil}, "
                             f"got {value!r}")
        return lo, hi
    raise ValueError(f"{name} must be a number or a (min, max) pair, got {value!r}")


@dataclass(frozen=True)
class JitterParams:
    """One draw of :class:`ColorJitter` for N images: each field is an N-vector of factors
    (hue: a shift in turns, in [-0.5, 0.5]). A disabled component holds its identity value."""

    brightness: torch.Tensor
    contrast: torch.Tensor
    saturation: torch.Tensor
    hue: torch.Tensor

    def to(self, device: torch.device | str) -> JitterParams:
        return JitterParams(*(getattr(self, f).to(device) for f in ("brightness", "contrast",
                                                                    "saturation", "hue")))


class ColorJitter:
    """Random brightness, contrast, saturation and hue, each image drawing its own factors.

    The semantics are torchvision's (brightness multiplies; contrast blends with the mean of the
    image's gray; saturation blends with the gray image; hue rotates the HSV hue; the result is
    clamped to the valid range after each step), with two differences: the steps always run in
    this fixed order, brightness, contrast, saturation, hue (torchvision permutes the order at
    random for every image), and uint8 images are computed in float and rounded once at the
    end (torchvision truncates to uint8 after every step). Gray is ``0.299 R + 0.587 G + 0.114 B``
    in float (torchvision's contrast and saturation weigh R by 0.2989 and floor uint8 gray).

    Works as a sample transform and as a batch transform. Float batches are taken as [0, 1],
    or, when ``mean``/``std`` are given (the loader's), as ``(x - mean) / std`` of [0, 1] pixels:
    they are un-normalised, jittered, clamped to [0, 1] and normalised again.

    Args:
        brightness: Factor drawn from ``[max(0, 1 - b), 1 + b]``, or a ``(min, max)`` pair.
        contrast: Same, for contrast.
        saturation: Same, for saturation.
        hue: Shift drawn from ``[-hue, hue]`` turns, ``0 <= hue <= 0.5``, or a ``(min, max)`` pair.
        mean: Per-channel mean of normalised float batches (the loader's ``mean``).
        std: Per-channel standard deviation of normalised float batches (the loader's ``std``).
    """

    def __init__(self, brightness: Range = 0.0, contrast: Range = 0.0, saturation: Range = 0.0,
                 hue: Range = 0.0, *, mean: Norm = None, std: Norm = None) -> None:
        self.brightness = _factor_range("brightness", brightness, center=1.0, bound=None)
        self.contrast = _factor_range("contrast", contrast, center=1.0, bound=None)
        self.saturation = _factor_range("saturation", saturation, center=1.0, bound=None)
        self.hue = _factor_range("hue", hue, center=0.0, bound=0.5)
        self.norm = _norm(mean, std)

    def __repr__(self) -> str:
        return (f"ColorJitter(brightness={self.brightness}, contrast={self.contrast}, "
                f"saturation={self.saturation}, hue={self.hue}, norm={self.norm})")

    def draw(self, n: int, generator: torch.Generator) -> JitterParams:
        """Factors for ``n`` images, from one ``n``×4 uniform draw on ``generator``'s device."""
        u = torch.rand(n, 4, generator=generator, device=generator.device)
        ranges = (self.brightness, self.contrast, self.saturation, self.hue)
        return JitterParams(*(lo + (hi - lo) * u[:, i] for i, (lo, hi) in enumerate(ranges)))

    def apply(self, images: torch.Tensor, params: JitterParams) -> torch.Tensor:
        """Jittered N×3×H×W ``images`` (same dtype) for the given factors."""
        p = params.to(images.device)
        x = _to_unit(images, self.norm)
        if self.brightness != (1.0, 1.0):
            x = (x * p.brightness.view(-1, 1, 1, 1)).clamp_(0, 1)
        if self.contrast != (1.0, 1.0):
            c = p.contrast.view(-1, 1, 1, 1)
            x = (c * x + (1 - c) * _luma(x).mean(dim=(1, 2, 3), keepdim=True)).clamp_(0, 1)
        if self.saturation != (1.0, 1.0):
            s = p.saturation.view(-1, 1, 1, 1)
            x = (s * x + (1 - s) * _luma(x)).clamp_(0, 1)
        if self.hue != (0.0, 0.0):
            x = _shift_hue(x.clamp(0, 1), p.hue)
        # Not in place: without any step, x may still be the caller's float tensor.
        return _from_unit(x.clamp(0, 1), images, self.norm)

    def __call__(self, data: Any, generator: torch.Generator) -> Any:
        images, is_sample = _images_of(data, "ColorJitter")
        return _replace(data, self.apply(images, self.draw(len(images), generator)), is_sample)


class RandomGrayscale:
    """With probability ``p`` per image, every channel becomes the ITU-R 601-2 luma
    ``0.299 R + 0.587 G + 0.114 B``; uint8 images are rounded exactly as PIL's ``convert("L")``.

    Works as a sample transform and as a batch transform; ``mean``/``std`` as in
    :class:`ColorJitter` (float values are not clamped: gray of in-range pixels stays in range).

    Args:
        p: Chance that an image turns gray.
        mean: Per-channel mean of normalised float batches (the loader's ``mean``).
        std: Per-channel standard deviation of normalised float batches (the loader's ``std``).
    """

    def __init__(self, p: float = 0.1, *, mean: Norm = None, std: Norm = None) -> None:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p must be a probability in [0, 1], got {p}")
        self.p = float(p)
        self.norm = _norm(mean, std)

    def __repr__(self) -> str:
        return f"RandomGrayscale(p={self.p}, norm={self.norm})"

    def draw(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """An N-vector of booleans: which images turn gray."""
        return torch.rand(n, generator=generator, device=generator.device) < self.p

    def apply(self, images: torch.Tensor, gray: torch.Tensor) -> torch.Tensor:
        """``images`` with those picked by the boolean N-vector ``gray`` turned gray."""
        if images.dtype == torch.uint8:
            rgb = images.to(torch.int32)
            luma = (_LUMA_16[0] * rgb[:, 0] + _LUMA_16[1] * rgb[:, 1] + _LUMA_16[2] * rgb[:, 2]
                    + 0x8000) >> 16
            out = luma.to(torch.uint8).unsqueeze(1).expand_as(images)
        else:
            unit = _luma(_to_unit(images, self.norm)).expand_as(images)
            out = _from_unit(unit, images, self.norm)
        return torch.where(gray.to(images.device).view(-1, 1, 1, 1), out, images)

    def __call__(self, data: Any, generator: torch.Generator) -> Any:
        images, is_sample = _images_of(data, "RandomGrayscale")
        return _replace(data, self.apply(images, self.draw(len(images), generator)), is_sample)
