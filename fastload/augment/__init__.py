"""User augmentation stage: ready-made colour jitter, grayscale, mixup and cutmix transforms.

Each is called as ``fn(data, generator)``: ``data`` is a sample dict ``{"image": uint8 3×H×W,
"label": int, "index": int}`` (``PackedDataset(sample_transform=...)``) or an ``(images, labels)``
batch (``DataLoader(batch_transform=...)``), and every random number comes from ``generator``, on
its device. Each also has ``draw`` (the random parameters) and ``apply`` (the pixels, given them),
so a result can be checked, or replayed on another device, from the parameters alone.

The colour ones, per image (``ColorJitter``, ``RandomGrayscale``), are in ``colour``; the batch
ones that mix two images (``Mixup``, ``CutMix``) in ``mixing``; ``Compose`` in ``compose``;
``inputs`` tells a sample from a batch. Import them from here, ``fastload.augment``.
"""

from fastload.augment.colour import ColorJitter, JitterParams, Norm, RandomGrayscale, Range
from fastload.augment.compose import Compose
from fastload.augment.mixing import CutMix, CutMixParams, MixParams, Mixup

__all__ = ["ColorJitter", "Compose", "CutMix", "CutMixParams", "JitterParams", "MixParams", "Mixup",
           "Norm", "RandomGrayscale", "Range"]
