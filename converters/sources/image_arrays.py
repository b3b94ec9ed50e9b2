"""Python writer, image arrays: the one rule that tells an image array's layout, CHW or HWC.

The rule: an image array is uint8, H×W, or 3-D with its channels (1, 3 or 4) first (CHW, as the
loader and torchvision yield) or last (HWC, as PIL, NumPy and OpenCV give). When only one end of
its shape is a channel count, that end is the channels. When both are (3×50×3, 1×50×3, 3×50×4,
3×3×3), the shape cannot tell: the writer's ``layout="CHW"`` or ``"HWC"`` says which, and without
it the array is refused, never guessed.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from fastload.converters.sources.samples import BadSample

ImageLayout = Literal["CHW", "HWC"]
LAYOUTS = ("CHW", "HWC")
CHANNELS = (1, 3, 4)


def check_layout(layout: object) -> ImageLayout | None:
    """``layout=`` as the writer takes it; ValueError naming the choices otherwise."""
    if layout is not None and layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: choose 'CHW' (channels first, as the loader yields images) or "
                         "'HWC' (channels last, as PIL and NumPy give them), or None: told by the shape")
    return layout  # type: ignore[return-value]


def as_hwc(name: str, array: np.ndarray, layout: ImageLayout | None) -> np.ndarray:
    """Image field ``name``'s array as H×W or H×W×C (a view; see the module's docstring for the
    rule); BadSample naming the field when it is no image array or its layout cannot be told."""
    if array.dtype != np.uint8 or array.ndim not in (2, 3):
        raise BadSample(f"field {name!r} is a {array.dtype} array of shape {array.shape}; an image array is "
                        "uint8, H x W, or 1, 3 or 4 channels last (HWC) or first (CHW): convert it "
                        "(a float one in [0, 1]: (x * 255).round().astype(np.uint8)), or give encoded bytes")
    if array.ndim == 2:
        return array
    first, last = array.shape[0] in CHANNELS, array.shape[2] in CHANNELS
    if layout is None and first and last:
        a, b, c = array.shape
        raise BadSample(f"field {name!r} is a uint8 array of shape {array.shape}: CHW ({c}x{b} pixels, "
                        f"{_channels(a)}) or HWC ({b}x{a} pixels, {_channels(c)}), the shape cannot tell; "
                        "pass the Writer layout='CHW' or layout='HWC', or give a PIL image")
    if layout is None and not (first or last):
        raise BadSample(f"field {name!r} is a uint8 array of shape {array.shape}: neither end is 1, 3 or 4 "
                        "channels; an image array is H x W, H x W x C (HWC) or C x H x W (CHW)")
    chw = layout == "CHW" if layout is not None else first
    if not (first if chw else last):
        end = ("first", array.shape[0]) if chw else ("last", array.shape[2])
        raise BadSample(f"field {name!r} is a uint8 array of shape {array.shape}, not {layout}: its {end[0]} "
                        f"dimension, {end[1]}, is not 1, 3 or 4 channels (layout={layout!r})")
    return array.transpose(1, 2, 0) if chw else array


def _channels(n: int) -> str:
    return f"{n} channel{'s' * (n > 1)}"
