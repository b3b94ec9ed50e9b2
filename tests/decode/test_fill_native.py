"""The pixel cache's native fill and crops (fill_decode.c, fill_resize.c, fill_crop.c): the very
bytes of their written-down arithmetic (a numpy twin below), with AVX2 or without, within a level
of Pillow's resize, and every JPEG they refuse left to Pillow's path."""

from __future__ import annotations

import ctypes
import io
import math
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from fastload.decode.crops import REGION_DECODE
from fastload.decode.stored import decode_stored
from fastload.errors import CorruptRecordError
from tests.conftest import REPO
from tests.decode.test_decode import encode, photo

pytestmark = pytest.mark.skipif(not REGION_DECODE, reason="the native decoder is not built here")

if REGION_DECODE:
    from fastload.decode._jpeg_region import RegionDecodeError, crop_stored_into, decode_stored_into

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


def one_pass(pixels: np.ndarray, firsts: list[int], weights: np.ndarray) -> np.ndarray:
    """One pass along axis 0, rounded to 8 bits as fill_resize.c rounds."""
    taps = weights.shape[1]
    padded = np.concatenate([pixels, np.zeros((taps, *pixels.shape[1:]), pixels.dtype)]).astype(np.int64)
    out = np.empty((len(firsts), *pixels.shape[1:]), np.uint8)
    for i, first in enumerate(firsts):
        sums = np.tensordot(weights[i], padded[first:first + taps], axes=1)
        out[i] = np.clip((sums + ONE // 2) >> 14, 0, 255)
    return out


def twin(pixels: np.ndarray, box: tuple[float, float, float, float], size: tuple[int, int],
         cut: bool = False) -> np.ndarray:
    """The fill's resize of ``box`` of HWC ``pixels`` to ``size`` (width, height): rows pass, then
    columns; ``cut``: the box (whole pixels) cut out first."""
    x0, y0, x1, y1 = box
    if cut:
        pixels, box = pixels[int(y0):int(y1), int(x0):int(x1)], (0, 0, x1 - x0, y1 - y0)
        x0, y0, x1, y1 = box
    rows = one_pass(pixels, *axis(pixels.shape[0], y0, y1, size[1]))
    return one_pass(rows.transpose(1, 0, 2), *axis(pixels.shape[1], x0, x1, size[0])).transpose(1, 0, 2)


KINDS = {  # name: (JPEG, scale the fill decodes it at, stored width, height)
    "4:2:0": (lambda: encode(photo(500, 375, seed=1), quality=90), 1, 341, 256),
    "portrait 4:4:4": (lambda: encode(photo(300, 400, seed=3), quality=95, subsampling=0), 1, 256, 341),
    "grey": (lambda: encode(photo(450, 350, seed=4).convert("L"), quality=90), 1, 329, 256),
    "progressive": (lambda: encode(photo(420, 333, seed=5), quality=85, progressive=True), 1, 322, 256),
    "large, at 1/2": (lambda: encode(photo(1100, 700, seed=8), quality=90), 2, 402, 256),
    "stored as decoded": (lambda: encode(photo(256, 200, seed=6), quality=90), 1, 256, 200),
}


@pytest.fixture(scope="module")
def jpegs() -> dict[str, bytes]:
    return {name: make() for name, (make, *_) in KINDS.items()}


def decoded(data: bytes, scale: int) -> np.ndarray:
    """What libjpeg decodes at 1/scale, as RGB (Pillow: the same library, the same settings)."""
    img = Image.open(io.BytesIO(data))
    if scale > 1:
        img.draft("RGB", (img.width // scale, img.height // scale))
    return np.asarray(img.convert("RGB"))


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_fill_gives_the_bytes_of_its_arithmetic_within_a_level_of_pillows(jpegs, kind):
    data, (_, scale, width, height) = jpegs[kind], KINDS[kind]
    img = Image.open(io.BytesIO(data))
    out = np.full((height, width, 3), 7, np.uint8)
    decode_stored_into(data, scale, img.width, img.height, out, 10**9)
    whole = decoded(data, scale)
    assert np.array_equal(out, twin(whole, (0, 0, whole.shape[1], whole.shape[0]), (width, height)))
    pillow = np.asarray(Image.fromarray(whole).resize((width, height), Image.BILINEAR), np.int16)
    assert np.abs(pillow - out).max() <= 1 and np.abs(pillow - out).mean() < 0.2
    if kind == "grey":
        assert np.array_equal(out[..., 0], out[..., 1]) and np.array_equal(out[..., 0], out[..., 2])


@pytest.mark.parametrize("box, crop_first, flip", [
    ((13.4, 20.7, 250.2, 231.9), False, False),  # a train box mapped onto stored pixels: shrunk a little
    ((60.25, 10.5, 140.75, 90.0), True, True),  # small: enlarged, mirrored; fractional, so not cut out first
    ((16.0, 8.0, 240.0, 232.0), True, False),  # whole-pixel corners: cut out first
    ((16.0, 8.0, 240.0, 232.0), False, True),  # the same box in place: its edges see their neighbours
])
def test_a_crop_from_stored_pixels_gives_the_bytes_of_its_arithmetic(box, crop_first, flip):
    rng = np.random.default_rng(0)
    stored = np.asarray(photo(341, 256, seed=2))
    stored = np.clip(stored.astype(np.int16) + rng.integers(-20, 21, stored.shape), 0, 255).astype(np.uint8)
    batch = np.zeros((2, 3, 224, 224), np.uint8)  # a CHW slot of a batch, as the loader hands it
    crop_stored_into(stored, *box, crop_first, flip, batch[1].transpose(1, 2, 0))
    want = twin(stored, box, (224, 224), cut=crop_first and all(float(v).is_integer() for v in box))
    assert np.array_equal(batch[1].transpose(1, 2, 0), want[:, ::-1] if flip else want)
    assert not batch[0].any()


class Target(ctypes.Structure):
    """resample.h's Target: where a crop's pixels go."""
    _fields_ = [("pixels", ctypes.c_void_p), ("stride_y", ctypes.c_ssize_t), ("stride_x", ctypes.c_ssize_t),
                ("stride_c", ctypes.c_ssize_t), ("flip", ctypes.c_int)]


def test_the_avx2_code_and_the_plain_c_give_the_same_bytes(tmp_path):
    """fill_resize.c built without its AVX2 paths (as on a CPU or an architecture without them)
    against the module's build, on shrinks and enlargements of noise (every rounding exercised)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler here to build the plain-C twin")
    plain = tmp_path / "plain.so"
    sources = [str(REPO / "fastload/decode" / name) for name in ("fill_resize.c", "fill_crop.c", "resample_store.c")]
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-DFASTLOAD_NO_SIMD", "-o", str(plain), *sources, "-lm"],
                   check=True, capture_output=True)
    lib = ctypes.CDLL(str(plain))
    stored = np.random.default_rng(1).integers(0, 256, (300, 417, 3), dtype=np.uint8)
    for box, (width, height) in [((0.0, 0.0, 417.0, 300.0), (256, 184)), ((3.5, 7.25, 390.0, 299.0), (200, 224)),
                                 ((100.0, 50.0, 180.0, 150.0), (224, 224)), ((0.0, 0.0, 417.0, 300.0), (60, 31))]:
        fast, slow = np.zeros((height, width, 3), np.uint8), np.ones((height, width, 3), np.uint8)
        crop_stored_into(stored, *box, False, False, fast)
        target = Target(slow.ctypes.data, width * 3, 3, 1, 0)
        assert lib.fastload_fill_crop(ctypes.c_void_p(stored.ctypes.data), 417, 300, (ctypes.c_double * 4)(*box), 0,
                                      width, height, ctypes.byref(target)) == 1
        assert np.array_equal(fast, slow), box


def test_jpegs_the_fill_refuses_raise_region_decode_errors(jpegs):
    data = jpegs["4:2:0"]
    out = np.empty((256, 341, 3), np.uint8)
    with pytest.raises(RegionDecodeError):  # the index says another size
        decode_stored_into(data, 1, 501, 375, out, 10**9)
    with pytest.raises(RegionDecodeError):  # larger than the image at that scale: never enlarged
        decode_stored_into(data, 2, 500, 375, out, 10**9)
    with pytest.raises(RegionDecodeError, match="pixel limit"):
        decode_stored_into(data, 1, 500, 375, out, 1000)
    with pytest.raises(RegionDecodeError, match="libjpeg"):  # damaged in its scan
        decode_stored_into(data[:2000] + bytes(400) + data[2400:], 1, 500, 375, out, 10**9)
    with pytest.raises(ValueError, match=r"out \(C-contiguous\) must be a uint8 array of shape \(H, W, 3\)"):
        decode_stored_into(data, 1, 500, 375, np.empty((256, 341, 4), np.uint8), 10**9)
    with pytest.raises(ValueError, match="outside"):
        crop_stored_into(out, 0.0, 0.0, 400.0, 100.0, False, False, np.empty((8, 8, 3), np.uint8))


def test_decode_stored_leaves_what_the_native_fill_refuses_to_pillow(jpegs):
    cmyk = encode(photo(320, 240, seed=9).convert("CMYK"), quality=90)
    png = encode(photo(320, 240, seed=10), "PNG")
    for data in (cmyk, png):  # decoded by Pillow and resized by it: within a level of the fill's arithmetic
        out = decode_stored(data, 320, 240, np.empty((192, 256, 3), np.uint8), where="r", max_pixels=10**9)
        whole = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert np.abs(twin(whole, (0, 0, 320, 240), (256, 192)).astype(np.int16) - out).max() <= 1
    cut_short = jpegs["4:2:0"][:len(jpegs["4:2:0"]) // 2]
    with pytest.raises(CorruptRecordError, match="record 7"):
        decode_stored(cut_short, 500, 375, np.empty((256, 341, 3), np.uint8), where="record 7", max_pixels=10**9)
