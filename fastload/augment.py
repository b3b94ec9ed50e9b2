"""User augmentation stage: ready-made colour jitter, grayscale, mixup and cutmix transforms.

Each is called as ``fn(data, generator)``: ``data`` is a sample dict ``{"image": uint8 3×H×W,
"label": int, "index": int}`` (``PackedDataset(sample_transform=...)``) or an ``(images, labels)``
batch (``DataLoader(batch_transform=...)``), and every random number comes from ``generator``, on
its device. Each also has ``draw`` (the random parameters) and ``apply`` (the pixels, given them),
so a result can be checked, or replayed on another device, from the parameters alone.

One module over 400 lines: the four share the sample/batch handling and the pixel scale helpers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

Range = float | tuple[float, float]
Norm = Sequence[float] | None

_LUMA = (0.299, 0.587, 0.114)  # ITU-R 601-2, as PIL's "L"
_LUMA_16 = (19595, 38470, 7471)  # the same in 1/65536ths: PIL's integer conversion for uint8


# --- what the data looks like: a sample dict or an (images, labels, ...) batch ------------------

def _images_of(data: Any, name: str) -> tuple[torch.Tensor, bool]:
    """The images as N×3×H×W and whether ``data`` is a sample dict."""
    if isinstance(data, dict):
        image = data.get("image")
        if not isinstance(image, torch.Tensor) or image.dim() != 3 or image.shape[0] != 3:
            raise ValueError(f"{name}: the sample's 'image' must be a 3×H×W tensor, got "
                             f"{_describe(image)}")
        return image.unsqueeze(0), True
    if isinstance(data, (tuple, list)) and data and isinstance(data[0], torch.Tensor):
        images = data[0]
        if images.dim() != 4 or images.shape[1] != 3:
            raise ValueError(f"{name}: a batch's images must be N×3×H×W, "
                             f"got {_describe(images)}")
        return images, False
    raise TypeError(f"{name}: expected a sample dict {{'image', 'label', 'index'}} or an "
                    f"(images, labels) batch, got {type(data).__name__}")


def _replace(data: Any, images: torch.Tensor, is_sample: bool) -> Any:
    if is_sample:
        return {**data, "image": images[0]}
    return (images, *data[1:])


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _batch_only(data: Any, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(data, dict):
        raise TypeError(f"{name} is a batch transform: pass it as DataLoader(batch_transform=...), "
                        "not as PackedDataset(sample_transform=...) (it was given a sample dict)")
    if not isinstance(data, (tuple, list)) or len(data) < 2:
        raise TypeError(f"{name}: expected an (images, labels) batch, got {type(data).__name__}")
    images, _ = _images_of(data, name)
    return images, data[1]


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


# --- mixing two images of a batch ----------------------------------------------------------------

def _gamma(shape: float, generator: torch.Generator) -> torch.Tensor:
    """One Gamma(shape, 1) draw, float64 on ``generator``'s device, without a host sync.

    Marsaglia & Tsang (2000) on 32 candidates at once, keeping the first accepted (each is
    accepted with probability above 0.95, so all 32 fail with probability below 1e-40);
    a shape below 1 draws Gamma(shape + 1) and scales it by ``U ** (1 / shape)``.
    """
    device, a = generator.device, shape + 1 if shape < 1 else shape
    d = a - 1 / 3
    c = 1 / math.sqrt(9 * d)
    z = torch.randn(32, generator=generator, device=device, dtype=torch.float64)
    u = torch.rand(32, generator=generator, device=device, dtype=torch.float64)
    v = (1 + c * z) ** 3
    log_v = torch.log(v.clamp(min=1e-300))
    accept = (v > 0) & (torch.log(u) < 0.5 * z * z + d - d * v + d * log_v)
    value = d * v[accept.to(torch.uint8).argmax()].clamp(min=1e-300)
    if shape < 1:
        boost = torch.rand((), generator=generator, device=device, dtype=torch.float64)
        value = value * boost ** (1 / shape)
    return value


def _beta(alpha: float, generator: torch.Generator) -> torch.Tensor:
    """One Beta(alpha, alpha) draw (a float64 scalar tensor) as X / (X + Y) of two Gamma draws."""
    x, y = _gamma(alpha, generator), _gamma(alpha, generator)
    return (x / (x + y).clamp(min=1e-300)).where(x + y > 0, torch.full_like(x, 0.5))


class _BatchMix:
    """What Mixup and CutMix share: ``alpha``, ``num_classes`` and the soft labels."""

    def __init__(self, alpha: float, num_classes: int) -> None:
        name = type(self).__name__
        if not alpha > 0:
            raise ValueError(f"{name}: alpha must be positive, got {alpha}")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"{name}: num_classes must be a positive int, got {num_classes!r}")
        self.alpha, self.num_classes = float(alpha), num_classes

    def __repr__(self) -> str:
        return f"{type(self).__name__}(alpha={self.alpha}, num_classes={self.num_classes})"

    def _mix_labels(self, labels: Any, lam: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        """``lam * y + (1 - lam) * y[perm]`` of one-hot (or already soft) labels, float32."""
        c, name = self.num_classes, type(self).__name__
        if not isinstance(labels, torch.Tensor):
            raise TypeError(f"{name}: labels must be a tensor, got {type(labels).__name__}")
        if labels.dim() == 1 and not labels.is_floating_point():
            soft = F.one_hot(labels.long(), c).float()
        elif labels.dim() == 2 and labels.is_floating_point() and labels.shape[1] == c:
            soft = labels
        else:
            raise ValueError(f"{name}: labels must be class indices (N) or soft labels (N×{c}), "
                             f"got {_describe(labels)}; check num_classes={c}")
        lam, perm = lam.to(soft.device), perm.to(soft.device)
        return (lam * soft + (1 - lam) * soft[perm]).to(soft.dtype)


@dataclass(frozen=True)
class MixParams:
    """One draw of :class:`Mixup`: the weight ``lam`` (float64 scalar tensor) of each image and
    ``perm``, the batch order of the images mixed in."""

    lam: torch.Tensor
    perm: torch.Tensor


class Mixup(_BatchMix):
    """Mixup (Zhang et al., 2018) on a batch: ``lam * x + (1 - lam) * x[perm]``, labels likewise.

    One ``lam ~ Beta(alpha, alpha)`` and one permutation per batch. Images must be float (give
    the loader ``mean``/``std``); labels become soft, ``N × num_classes`` float32.

    Args:
        alpha: Beta distribution parameter.
        num_classes: Number of classes, the width of the soft labels.
    """

    def __init__(self, alpha: float = 0.2, *, num_classes: int) -> None:
        super().__init__(alpha, num_classes)

    def draw(self, n: int, generator: torch.Generator) -> MixParams:
        """``lam`` then the permutation of ``n`` images."""
        lam = _beta(self.alpha, generator)
        return MixParams(lam, torch.randperm(n, generator=generator, device=generator.device))

    def apply(self, images: torch.Tensor, labels: Any, params: MixParams) -> tuple[Any, Any]:
        """The mixed ``(images, labels)`` for the given draw."""
        if not images.is_floating_point():
            raise TypeError(f"Mixup needs float images, got {images.dtype}: give the DataLoader "
                            "mean= and std= so batches arrive normalised as float32")
        soft = self._mix_labels(labels, params.lam, params.perm)
        lam, perm = params.lam.to(images.device), params.perm.to(images.device)
        return (lam * images + (1 - lam) * images[perm]).to(images.dtype), soft

    def __call__(self, batch: Any, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        images, labels = _batch_only(batch, "Mixup")
        return (*self.apply(images, labels, self.draw(len(images), generator)), *batch[2:])


@dataclass(frozen=True)
class CutMixParams:
    """One draw of :class:`CutMix`.

    Attributes:
        drawn_lam: The Beta draw (float64 scalar tensor); the box covers about ``1 - drawn_lam``.
        perm: Batch order of the images pasted in.
        center: ``(row, column)`` of the box's centre, int64.
        box: ``(top, left, bottom, right)``, int64, bottom and right exclusive, inside the image.
        lam: The share of each image's own pixels, ``1 - box area / image area`` (float64).
    """

    drawn_lam: torch.Tensor
    perm: torch.Tensor
    center: torch.Tensor
    box: torch.Tensor
    lam: torch.Tensor


class CutMix(_BatchMix):
    """CutMix (Yun et al., 2019) on a batch: a box of each image replaced by the same box of
    ``images[perm]``, labels mixed by the share of pixels each image keeps.

    One ``lam ~ Beta(alpha, alpha)``, box and permutation per batch. The box is the paper's (and
    timm's): sides ``int(side * sqrt(1 - lam))``, centre uniform over the pixels, half sides
    ``side // 2`` either way, clipped to the image; ``lam`` is then corrected to the box's real
    area. Works on uint8 and float images; labels become soft, ``N × num_classes`` float32.

    Args:
        alpha: Beta distribution parameter.
        num_classes: Number of classes, the width of the soft labels.
    """

    def __init__(self, alpha: float = 1.0, *, num_classes: int) -> None:
        super().__init__(alpha, num_classes)

    def draw(self, n: int, height: int, width: int, generator: torch.Generator) -> CutMixParams:
        """``lam``, the permutation, then the centre's row and column, for ``n`` images of
        ``height`` × ``width``."""
        device = generator.device
        drawn = _beta(self.alpha, generator)
        perm = torch.randperm(n, generator=generator, device=device)
        center = torch.stack([torch.randint(height, (), generator=generator, device=device),
                              torch.randint(width, (), generator=generator, device=device)])
        sizes = torch.tensor([height, width], device=device)
        half = torch.floor(sizes * torch.sqrt(1 - drawn)).long() // 2
        low, high = (center - half).clamp(min=0), torch.minimum(center + half, sizes)
        box = torch.cat([low, high])
        lam = 1 - (high - low).prod().double() / (height * width)
        return CutMixParams(drawn, perm, center, box, lam)

    def apply(self, images: torch.Tensor, labels: Any, params: CutMixParams) -> tuple[Any, Any]:
        """The mixed ``(images, labels)`` for the given draw."""
        soft = self._mix_labels(labels, params.lam, params.perm)
        device = images.device
        box, perm = params.box.to(device), params.perm.to(device)
        rows = torch.arange(images.shape[2], device=device).view(-1, 1)
        cols = torch.arange(images.shape[3], device=device).view(1, -1)
        inside = (rows >= box[0]) & (rows < box[2]) & (cols >= box[1]) & (cols < box[3])
        return torch.where(inside, images[perm], images), soft

    def __call__(self, batch: Any, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        images, labels = _batch_only(batch, "CutMix")
        n, _, height, width = images.shape
        params = self.draw(n, height, width, generator)
        return (*self.apply(images, labels, params), *batch[2:])


class Compose:
    """Several transforms in turn, each given the same generator (so they draw one after another).

    Args:
        *transforms: Callables ``fn(data, generator) -> data``.
    """

    def __init__(self, *transforms: Callable[[Any, torch.Generator], Any]) -> None:
        for i, t in enumerate(transforms):
            if not callable(t):
                raise TypeError(f"Compose: transform {i} is not callable: {t!r}")
        self.transforms = transforms

    def __repr__(self) -> str:
        return f"Compose({', '.join(map(repr, self.transforms))})"

    def __call__(self, data: Any, generator: torch.Generator) -> Any:
        for t in self.transforms:
            data = t(data, generator)
        return data
