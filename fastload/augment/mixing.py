"""User augmentation stage: mixup and cutmix, mixing two images of a batch and their labels."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from fastload.augment.inputs import _batch_only, _describe


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
