"""The pixel cache's native fill and crops (fill_decode.c, fill_resize.c, fill_columns.c,
fill_crop.c, fill_colour.c): the very bytes of their written-down arithmetic (a numpy twin below:
each plane shrunk or cropped on its own, then YCbCr to RGB), with AVX2 or without, and every JPEG
they refuse left to Pillow's path, which stores Pillow's RGB made into planes."""

from __future__ import annotations

import ctypes
import io
import math
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from fastload.decode.crops import REGION_DECODE, decode_crop
from fastload.decode.stored import decode_stored
from fastload.decode.transforms import CropPlan
from fastload.errors import CorruptRecordError
from fastload.pixels.layout import chroma_size, stored_bytes
from tests.conftest import REPO
from tests.decode.test_decode import encode, photo

pytestmark = pytest.mark.skipif(not REGION_DECODE, reason="the native decoder is not built here")

if REGION_DECODE:
    from fastload.decode._jpeg_region import (
        RegionDecodeError, crop_planes_into, decode_planes_into, planes_from_rgb,
    )

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


def one_pass(plane: np.ndarray, firsts: list[int], weights: np.ndarray) -> np.ndarray:
    """One pass along axis 0 of a plane, rounded to 8 bits as fill_resize.c rounds."""
    taps = weights.shape[1]
    padded = np.concatenate([plane, np.zeros((taps, plane.shape[1]), plane.dtype)]).astype(np.int64)
    out = np.empty((len(firsts), plane.shape[1]), np.uint8)
    for i, first in enumerate(firsts):
        out[i] = np.clip((weights[i] @ padded[first:first + taps] + ONE // 2) >> 14, 0, 255)
    return out


def resize(plane: np.ndarray, box: tuple[float, ...], size: tuple[int, int], cut: bool = False) -> np.ndarray:
    """The fill's resize of ``box`` of a plane to ``size`` (width, height): rows pass, then
    columns; ``cut``: the box (whole pixels) cut out first."""
    x0, y0, x1, y1 = box
    if cut:
        plane, (x0, y0, x1, y1) = plane[int(y0):int(y1), int(x0):int(x1)], (0, 0, x1 - x0, y1 - y0)
    rows = one_pass(plane, *axis(plane.shape[0], y0, y1, size[1]))
    return one_pass(rows.T, *axis(plane.shape[1], x0, x1, size[0])).T


FIX = {k: int(k * 65536 + 0.5) for k in (0.299, 0.587, 0.114, 0.16874, 0.33126, 0.5, 0.41869, 0.08131, 1.402,
                                         0.34414, 0.71414, 1.772)}  # jccolor.c's and jdcolor.c's weights


def rgb_of(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> np.ndarray:
    """libjpeg's YCbCr to RGB (jdcolor.c), as fill_colour.c writes it down."""
    y, u, v, half = y.astype(np.int64), cb.astype(np.int64) - 128, cr.astype(np.int64) - 128, 1 << 15
    rgb = [y + ((FIX[1.402] * v + half) >> 16), y + ((-FIX[0.34414] * u - FIX[0.71414] * v + half) >> 16),
           y + ((FIX[1.772] * u + half) >> 16)]
    return np.clip(np.stack(rgb, -1), 0, 255).astype(np.uint8)


def planes_of(rgb: np.ndarray) -> np.ndarray:
    """fill_colour.c's RGB to planes: Y per pixel, chroma the rounded mean of each 2 x 2 (edges repeated)."""
    p = rgb.astype(np.int64)
    r, g, b = p[..., 0], p[..., 1], p[..., 2]
    y = (FIX[0.299] * r + FIX[0.587] * g + FIX[0.114] * b + (1 << 15)) >> 16
    out = [y.reshape(-1)]
    for chroma in (-FIX[0.16874] * r - FIX[0.33126] * g + FIX[0.5] * b,
                   FIX[0.5] * r - FIX[0.41869] * g - FIX[0.08131] * b):
        c = np.pad(chroma, ((0, chroma.shape[0] % 2), (0, chroma.shape[1] % 2)), mode="edge")
        sums = c[0::2, 0::2] + c[0::2, 1::2] + c[1::2, 0::2] + c[1::2, 1::2]
        out.append(np.clip((sums + (128 << 18) + (1 << 17)) >> 18, 0, 255).reshape(-1))
    return np.concatenate(out).astype(np.uint8)


def split(planes: np.ndarray, width: int, height: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    (cw, ch), n = chroma_size(width, height), width * height
    return planes[:n].reshape(height, width), planes[n:n + cw * ch].reshape(ch, cw), planes[n + cw * ch:].reshape(ch, cw)


def fancy(c: np.ndarray, width: int, height: int) -> np.ndarray:
    """libjpeg's h2v2 fancy upsampling (jdsample.c: triangle weights 3/4, 1/4, edges repeated)."""
    p = np.pad(c.astype(np.int64), 1, mode="edge")
    out = np.empty((2 * c.shape[0], 2 * c.shape[1]), np.int64)
    for start, colsum in ((0, 3 * p[1:-1] + p[:-2]), (1, 3 * p[1:-1] + p[2:])):
        out[start::2, 0::2] = (3 * colsum[:, 1:-1] + colsum[:, :-2] + 8) >> 4
        out[start::2, 1::2] = (3 * colsum[:, 1:-1] + colsum[:, 2:] + 7) >> 4
    return out[:height, :width]


def raw_planes(data: bytes, scale: int, ratio: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """The planes libjpeg decodes at 1/scale: Y (Pillow's, without colour conversion); chroma, a
    sample per ``ratio`` luma pixels each way, Pillow's when 1; when 2 (4:2:0 at 1/1) the fill's at
    the decoded size (an identity resize), checked through libjpeg's upsampling against Pillow's."""
    img = Image.open(io.BytesIO(data))
    img.draft("L" if img.mode == "L" else "YCbCr", (img.width // scale, img.height // scale))
    ycc = np.asarray(img)
    if img.mode == "L":
        return ycc, None, None
    if ratio == 1:
        return ycc[..., 0], ycc[..., 1], ycc[..., 2]
    height, width = ycc.shape[:2]
    planes = np.empty(stored_bytes(width, height), np.uint8)
    decode_planes_into(data, scale, img.size[0] * scale, img.size[1] * scale, planes, width, height, 10**9)
    y, cb, cr = split(planes, width, height)
    assert np.array_equal(y, ycc[..., 0])
    if cb.shape[1] > 2:
        assert np.array_equal(fancy(cb, width, height), ycc[..., 1])
        assert np.array_equal(fancy(cr, width, height), ycc[..., 2])
    return y, cb, cr


def fill_twin(data: bytes, scale: int, ratio: int, size: tuple[int, int]) -> np.ndarray:
    """fill_decode.c's planes: each decoded plane shrunk over the image (chroma: each stored
    sample two stored luma pixels wide and high)."""
    y, cb, cr = raw_planes(data, scale, ratio)
    (w, h), (cw, ch) = size, chroma_size(*size)
    out = [resize(y, (0.0, 0.0, float(w) * y.shape[1] / w, float(h) * y.shape[0] / h), size)]
    for c in (cb, cr):
        span = (float(cw * 2) * y.shape[1] / w / ratio, float(ch * 2) * y.shape[0] / h / ratio)
        out.append(np.full((ch, cw), 128, np.uint8) if c is None else resize(c, (0.0, 0.0, *span), (cw, ch)))
    return np.concatenate([p.reshape(-1) for p in out])


KINDS = {  # name: (JPEG, scale the fill decodes it at, chroma ratio at that scale, stored width, height)
    "4:2:0": (lambda: encode(photo(500, 375, seed=1), quality=90), 1, 2, 341, 256),
    "portrait 4:4:4": (lambda: encode(photo(300, 400, seed=3), quality=95, subsampling=0), 1, 1, 256, 341),
    "grey": (lambda: encode(photo(450, 350, seed=4).convert("L"), quality=90), 1, 1, 329, 256),
    "progressive": (lambda: encode(photo(420, 333, seed=5), quality=85, progressive=True), 1, 2, 322, 256),
    "large, at 1/2 (chroma scaled up by libjpeg)": (lambda: encode(photo(1100, 700, seed=8), quality=90), 2, 1, 402, 256),
    "stored as decoded": (lambda: encode(photo(256, 200, seed=6), quality=90), 1, 2, 256, 200),
    "odd sides": (lambda: encode(photo(257, 199, seed=7), quality=90), 1, 2, 193, 150),
    "one pixel wide": (lambda: encode(photo(1, 37, seed=2), quality=90), 1, 2, 1, 29),
    "one pixel high": (lambda: encode(photo(45, 1, seed=2), quality=90), 1, 2, 45, 1),
}


@pytest.fixture(scope="module")
def jpegs() -> dict[str, bytes]:
    return {name: make() for name, (make, *_) in KINDS.items()}


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_fill_gives_the_bytes_of_its_arithmetic(jpegs, kind):
    data, (_, scale, ratio, width, height) = jpegs[kind], KINDS[kind]
    img = Image.open(io.BytesIO(data))
    out = np.full(stored_bytes(width, height), 7, np.uint8)
    decode_planes_into(data, scale, img.width, img.height, out, width, height, 10**9)
    assert np.array_equal(out, fill_twin(data, scale, ratio, (width, height)))


def test_a_4_2_2_jpeg_is_stored_as_the_same_planes():
    """Its chroma, decoded half as wide as the image but as high, is shrunk each way to the
    stored half size: Y to the bit; chroma within a fraction of a level of Pillow's upsampled
    chroma shrunk so (libjpeg's raw 4:2:2 chroma is not to be had from Pillow)."""
    data = encode(photo(401, 299, seed=11), quality=92, subsampling=1)
    out = np.empty(stored_bytes(257, 191), np.uint8)
    decode_planes_into(data, 1, 401, 299, out, 257, 191, 10**9)
    img = Image.open(io.BytesIO(data))
    img.draft("YCbCr", img.size)
    ycc, (y, cb, cr), (cw, ch) = np.asarray(img), split(out, 257, 191), chroma_size(257, 191)
    assert np.array_equal(y, resize(ycc[..., 0], (0.0, 0.0, 401.0, 299.0), (257, 191)))
    for k, c in ((1, cb), (2, cr)):
        near = resize(ycc[..., k], (0.0, 0.0, cw * 2 * 401 / 257, ch * 2 * 299 / 191), (cw, ch))
        assert np.abs(near.astype(np.int16) - c).mean() < 0.2


def noisy_planes(width: int, height: int, seed: int = 0) -> np.ndarray:
    """Planes of a photo with noise on it: every rounding of the resize exercised."""
    rgb = np.asarray(photo(width, height, seed=seed)).astype(np.int16)
    rgb = rgb + np.random.default_rng(seed).integers(-20, 21, rgb.shape)
    return planes_of(np.clip(rgb, 0, 255).astype(np.uint8))


def crop_twin(planes: np.ndarray, width: int, height: int, box: tuple[float, ...], size: tuple[int, int],
              crop_first: bool) -> np.ndarray:
    y, cb, cr = split(planes, width, height)
    half = tuple(v / 2 for v in box)
    cut = crop_first and all(float(v).is_integer() for v in box)
    return rgb_of(resize(y, box, size, cut), resize(cb, half, size), resize(cr, half, size))


@pytest.mark.parametrize("box, crop_first, flip", [
    ((13.4, 20.7, 250.2, 231.9), False, False),  # a train box mapped onto stored pixels: shrunk a little
    ((60.25, 10.5, 140.75, 90.0), True, True),  # small: enlarged, mirrored; fractional, so not cut out first
    ((16.0, 8.0, 240.0, 232.0), True, False),  # whole-pixel corners: cut out first (Y; chroma in place)
    ((16.0, 8.0, 240.0, 232.0), False, True),  # the same box in place: its edges see their neighbours
    ((0.0, 0.0, 341.0, 256.0), False, False),  # the whole image, to its odd-sided chroma's last sample
])
def test_a_crop_from_stored_planes_gives_the_bytes_of_its_arithmetic(box, crop_first, flip):
    planes = noisy_planes(341, 256)
    batch = np.zeros((2, 3, 224, 224), np.uint8)  # a CHW slot of a batch, as the loader hands it
    crop_planes_into(planes, 341, 256, *box, crop_first, flip, batch[1].transpose(1, 2, 0))
    want = crop_twin(planes, 341, 256, box, (224, 224), crop_first)
    assert np.array_equal(batch[1].transpose(1, 2, 0), want[:, ::-1] if flip else want)
    assert not batch[0].any()


@pytest.mark.parametrize("width, height", [(1, 29), (29, 1), (1, 1), (3, 5)])
def test_a_crop_from_an_image_one_pixel_wide_or_high(width, height):
    planes = noisy_planes(width, height, seed=4)
    out = np.zeros((16, 24, 3), np.uint8)  # a packed HWC array: the other strides' path
    crop_planes_into(planes, width, height, 0.0, 0.0, float(width), float(height), True, False, out)
    assert np.array_equal(out, crop_twin(planes, width, height, (0, 0, width, height), (24, 16), True))


class Target(ctypes.Structure):  # resample.h's: where a crop's pixels go
    _fields_ = [("pixels", ctypes.c_void_p), ("stride_y", ctypes.c_ssize_t), ("stride_x", ctypes.c_ssize_t),
                ("stride_c", ctypes.c_ssize_t), ("flip", ctypes.c_int)]


def test_the_avx2_code_and_the_plain_c_give_the_same_bytes(tmp_path):
    """The fill's resize and colours built without their AVX2 paths (as on a CPU or an
    architecture without them) against the module's build, on shrinks and enlargements of noisy
    planes into a batch's CHW slot."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler here to build the plain-C twin")
    plain = tmp_path / "plain.so"
    names = ("fill_resize.c", "fill_columns.c", "fill_crop.c", "fill_colour.c")
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-DFASTLOAD_NO_SIMD", "-o", str(plain),
                    *(str(REPO / "fastload/decode" / name) for name in names), "-lm"], check=True, capture_output=True)
    lib = ctypes.CDLL(str(plain))
    planes = np.random.default_rng(1).integers(0, 256, stored_bytes(417, 300), dtype=np.uint8)
    for box, (width, height) in [((0.0, 0.0, 417.0, 300.0), (256, 184)), ((3.5, 7.25, 390.0, 299.0), (200, 224)),
                                 ((100.0, 50.0, 180.0, 150.0), (224, 224)), ((0.0, 0.0, 417.0, 300.0), (60, 31))]:
        fast, slow = np.zeros((3, height, width), np.uint8), np.ones((3, height, width), np.uint8)
        crop_planes_into(planes, 417, 300, *box, False, False, fast.transpose(1, 2, 0))
        target = Target(slow.ctypes.data, width, 1, width * height, 0)
        assert lib.fastload_fill_crop(ctypes.c_void_p(planes.ctypes.data), 417, 300, (ctypes.c_double * 4)(*box), 0,
                                      width, height, ctypes.byref(target)) == 1
        assert np.array_equal(fast, slow), box


def test_rgb_is_made_into_planes_with_the_written_down_arithmetic():
    for width, height in [(341, 256), (7, 5), (1, 1), (1, 4)]:
        rgb = np.random.default_rng(width).integers(0, 256, (height, width, 3), dtype=np.uint8)
        out = np.full(stored_bytes(width, height), 7, np.uint8)
        planes_from_rgb(rgb, out)
        assert np.array_equal(out, planes_of(rgb))


def test_jpegs_the_fill_refuses_raise_region_decode_errors(jpegs):
    data, out = jpegs["4:2:0"], np.empty(stored_bytes(341, 256), np.uint8)
    with pytest.raises(RegionDecodeError):  # the index says another size
        decode_planes_into(data, 1, 501, 375, out, 341, 256, 10**9)
    with pytest.raises(RegionDecodeError):  # larger than the image at that scale: never enlarged
        decode_planes_into(data, 2, 500, 375, out, 341, 256, 10**9)
    with pytest.raises(RegionDecodeError, match="pixel limit"):
        decode_planes_into(data, 1, 500, 375, out, 341, 256, 1000)
    with pytest.raises(RegionDecodeError, match="libjpeg"):  # damaged in its scan
        decode_planes_into(data[:2000] + bytes(400) + data[2400:], 1, 500, 375, out, 341, 256, 10**9)
    with pytest.raises(RegionDecodeError, match="not a YCbCr or grey JPEG"):
        decode_planes_into(encode(photo(320, 240, seed=9).convert("CMYK"), quality=90), 1, 320, 240,
                           np.empty(stored_bytes(256, 192), np.uint8), 256, 192, 10**9)
    with pytest.raises(ValueError, match="are not the planes of a 341x256 image"):
        decode_planes_into(data, 1, 500, 375, out[:-1], 341, 256, 10**9)
    with pytest.raises(ValueError, match="outside"):
        crop_planes_into(out, 341, 256, 0.0, 0.0, 400.0, 100.0, False, False, np.empty((8, 8, 3), np.uint8))


def test_decode_stored_leaves_what_the_native_fill_refuses_to_pillow(jpegs):
    cmyk = encode(photo(320, 240, seed=9).convert("CMYK"), quality=90)
    png = encode(photo(320, 240, seed=10), "PNG")
    grey_png = encode(photo(320, 240, seed=10).convert("L"), "PNG")
    for data in (cmyk, png, grey_png):  # Pillow's RGB at the stored size, then planes
        out = decode_stored(data, 320, 240, np.empty(stored_bytes(256, 192), np.uint8), (256, 192), where="r",
                            max_pixels=10**9)
        assert np.array_equal(out, planes_of(decode_crop(data, CropPlan((0, 0, 320, 240), (192, 256)))))
    cut_short = jpegs["4:2:0"][:len(jpegs["4:2:0"]) // 2]
    with pytest.raises(CorruptRecordError, match="record 7"):
        decode_stored(cut_short, 500, 375, np.empty(stored_bytes(341, 256), np.uint8), (341, 256),
                      where="record 7", max_pixels=10**9)
