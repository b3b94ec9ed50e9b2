"""Python writer, sample side: a checked sample's image and file fields turned into the bytes its
record stores, each checked as a pack checks a file.

Stored as given: encoded bytes, and a path's file bytes. Encoded here: a PIL image or a uint8
array given as the image, HWC or CHW as converters.sources.image_arrays' one rule tells (PNG,
lossless, unless the writer's JPEG ``quality`` is set), a 2-D uint8/uint16 array or PIL image
given as a mask (a one-channel PNG: class ids kept bit-exact), any other NumPy array in a file
field (``.npy``, no pickle). A field of type "mask-rows" (what the writer makes of a mask unless
``mask_storage="file"``) stores its values' rows instead (converters.packing.mask_rows): an
array's or PIL image's straight, a file's decoded first.

Bounds come before the work: bytes, a path's file and an array's ``.npy`` are held to
``max_file_size`` (an array's by its ``nbytes``, before anything copies it), and an image or mask
to encode to ``max_pixels`` (by its shape or size, before it is copied or encoded). The Writer
copies a sample's arrays (``held``) only once they are bounded, so a broadcast view of a 30000 ×
30000 array is refused by its shape, not after gigabytes of copying.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

import numpy as np
from fastload.converters.packing.checks import InvalidFile, check_image
from fastload.converters.packing.headers import JPEG_SOI
from fastload.converters.packing.mask_rows import image_values, mask_rows, rows_from_file
from fastload.converters.sources.file_fields import FileFacts, check_file
from fastload.converters.sources.image_arrays import ImageLayout, as_hwc
from fastload.converters.sources.samples import BadSample, Checked, is_pil

from fastload.format.files import read_regular
from fastload.format.layout import record_checksum


@dataclass
class Payloads:
    """A checked sample's record: the image's bytes and header, each file field's bytes."""

    data: bytes
    width: int
    height: int
    checksum: int
    encoded: bool  # the image was encoded here (not stored as given)
    files: list[tuple[bytes, int, FileFacts]] = field(default_factory=list)


def held(checked: Checked, file_types: dict[str, str], layout: ImageLayout | None, *, max_pixels: int,
         max_file_size: int) -> Checked:
    """``checked`` with each array it holds bounded by its shape (the image's told HWC by ``layout``),
    then copied as HWC, so that its caller may reuse its own; BadSample naming the field."""
    for name, kind in (("image", "image"), *file_types.items()):
        value = checked.inputs[name]
        if isinstance(value, np.ndarray):
            value = _bounded(name, kind, value, layout, max_pixels, max_file_size)
            checked.inputs[name] = np.array(value, order="C", copy=True)
    return checked


def to_payloads(checked: Checked, file_types: dict[str, str], quality: int | None, *, decode: bool,
                max_pixels: int, max_file_size: int, layout: ImageLayout | None = None) -> Payloads:
    """Encode (or read) and check a sample's image and file fields; BadSample naming the field.
    ``layout``: an image array's (see converters.sources.image_arrays); "HWC" once ``held``."""
    raw = checked.inputs["image"]
    data = _bytes("image", "image", raw, quality, max_file_size, max_pixels, layout)
    try:
        header = check_image(data, decode=decode, max_pixels=max_pixels)
    except InvalidFile as exc:
        raise BadSample(f"its image: {exc.reason}") from None
    out = Payloads(data, header.width, header.height, record_checksum(data), not isinstance(raw, (bytes, PurePath)))
    for name, kind in file_types.items():
        value = checked.inputs[name]
        if kind == "mask-rows" and not isinstance(value, (bytes, PurePath)):
            payload, facts = _rows(name, value, header.width, header.height)
            out.files.append((payload, record_checksum(payload), facts))
            continue
        payload = _bytes(name, kind, value, None, max_file_size, max_pixels, layout)
        rel = f"{name}.jpg" if payload.startswith(JPEG_SOI) else f"{name}.npy" if kind == "npy" else f"{name}.png"
        try:
            facts = check_file(payload, rel, kind, header.width, header.height, max_pixels, decode)
            if kind == "mask-rows":
                payload = rows_from_file(payload, max_pixels)
        except InvalidFile as exc:
            raise BadSample(f"field {name!r} ({kind}): {exc.reason}") from None
        out.files.append((payload, record_checksum(payload), facts))
    return out


def _bytes(name: str, kind: str, value: Any, quality: int | None, max_file_size: int, max_pixels: int,
           layout: ImageLayout | None) -> bytes:
    """What a file field stores for ``value``: bytes as given, a path's bytes, or an encoding; each
    bounded (see the module's docstring) before it is read, copied or encoded."""
    if isinstance(value, bytes):
        if len(value) > max_file_size:
            raise BadSample(f"field {name!r} holds {len(value)} bytes, over the {max_file_size} limit (max_file_size)")
        return value
    if isinstance(value, PurePath):
        try:
            return read_regular(value, max_file_size)
        except OSError as exc:
            raise BadSample(f"field {name!r}: {os.fsdecode(value)} cannot be read ({exc.strerror or exc})") from None
    if isinstance(value, np.ndarray):
        value = _bounded(name, kind, value, layout, max_pixels, max_file_size)
        if kind == "npy":
            buffer = io.BytesIO()
            np.save(buffer, value, allow_pickle=False)
            return buffer.getvalue()
        image = _from_array(value)
    else:  # a PIL image
        _check_pixels(name, *value.size, max_pixels)
        image = value
    buffer = io.BytesIO()
    try:
        if quality is not None and kind == "image":
            image.convert("RGB" if image.mode not in ("RGB", "L") else image.mode).save(buffer, "JPEG", quality=quality)
        else:
            image.save(buffer, "PNG")
    except (OSError, ValueError) as exc:
        raise BadSample(f"field {name!r}: a {image.mode} image cannot be encoded ({exc}); give RGB or L") from None
    return buffer.getvalue()


def _bounded(name: str, kind: str, array: np.ndarray, layout: ImageLayout | None, max_pixels: int,
             max_file_size: int) -> np.ndarray:
    """A file field's array checked and bounded by its dtype and shape alone (not a value read): an
    image's as HWC (by ``layout``), a mask's 2-D; BadSample naming the field."""
    if kind == "npy":
        if array.dtype.hasobject:
            raise BadSample(f"field {name!r} is an array of Python objects; .npy fields hold numbers (no pickle)")
        if array.nbytes > max_file_size:
            raise BadSample(f"field {name!r} is a {array.dtype} array of shape {array.shape} ({array.nbytes} bytes), "
                            f"over the {max_file_size} limit (max_file_size); store it in parts, or raise the limit")
        return array
    array = as_hwc(name, array, layout) if kind == "image" else _mask_array(name, array)
    _check_pixels(name, array.shape[1], array.shape[0], max_pixels)
    return array


def _check_pixels(name: str, width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise BadSample(f"field {name!r} is {width}x{height}, {width * height} pixels, over the {max_pixels} limit "
                        "(max_pixels; not encoded)")


def _rows(name: str, value: Any, width: int, height: int) -> tuple[bytes, FileFacts]:
    """A mask given as an array or PIL image stored as its values' rows (no PNG in between)."""
    try:
        values = image_values(value) if is_pil(value) else _mask_array(name, value)
    except InvalidFile as exc:
        raise BadSample(f"field {name!r} (mask-rows): {exc.reason}") from None
    if values.shape != (height, width):
        raise BadSample(f"field {name!r} (mask-rows) is {values.shape[1]}x{values.shape[0]}, its image is "
                        f"{width}x{height}: a mask that follows the image's crop must be its size")
    return mask_rows(values), FileFacts(width, height)


def _mask_array(name: str, array: np.ndarray) -> np.ndarray:
    if array.ndim != 2 or array.dtype not in (np.uint8, np.uint16):
        raise BadSample(f"field {name!r} is a {array.dtype} array of shape {array.shape}; a mask array is "
                        "2-D uint8 or uint16 (class ids)")
    return array


def _from_array(array: np.ndarray) -> Any:
    """A bounded image (H×W, H×W×C) or mask array as a PIL image: uint8 "L"/"RGB"/"RGBA", uint16 "I;16"."""
    from PIL import Image

    array = array[:, :, 0] if array.ndim == 3 and array.shape[2] == 1 else array
    return Image.fromarray(np.ascontiguousarray(array))
