"""The pixel cache's native fill and crops (fill_decode.c, fill_resize.c, fill_columns.c,
fill_crop.c, fill_colour.c): the very bytes of their written-down arithmetic (a numpy twin in
fill_twin.py: each plane shrunk or cropped on its own, chroma upsampled, then YCbCr to RGB), with
AVX2 or without, and every JPEG they refuse left to Pillow's path, which stores Pillow's RGB made
into planes."""

from __future__ import annotations

import ctypes
import io
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
from tests.decode.fill_twin import crop_twin, fancy, planes_of, resize, split
from tests.decode.test_decode import encode, photo

pytestmark = pytest.mark.skipif(not REGION_DECODE, reason="the native decoder is not built here")

if REGION_DECODE:
    from fastload.decode._jpeg_region import (
        RegionDecodeError, crop_planes_into, decode_planes_into, planes_from_rgb,
    )


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


@pytest.mark.parametrize("size", [(223, 17), (224, 9), (1, 3), (5, 1)])
def test_a_flipped_crop_is_the_unflipped_one_mirrored_at_any_output_size(size):
    """Chroma is resized to half the output, rounded up, and upsampled: at an odd width the
    mirrored half row's upsampling starts a pixel later, so that a flip still mirrors exactly."""
    planes, box = noisy_planes(341, 256, seed=2), (13.4, 20.7, 250.2, 231.9)
    plain, flipped = (np.zeros((3, size[1], size[0]), np.uint8) for _ in range(2))
    for out, flip in ((plain, False), (flipped, True)):
        crop_planes_into(planes, 341, 256, *box, False, flip, out.transpose(1, 2, 0))
    assert np.array_equal(plain.transpose(1, 2, 0), crop_twin(planes, 341, 256, box, size, False))
    assert np.array_equal(flipped, plain[:, :, ::-1])


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
    planes into a batch's CHW slot, flipped or not, at even and odd output widths."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler here to build the plain-C twin")
    plain = tmp_path / "plain.so"
    names = ("fill_resize.c", "fill_columns.c", "fill_crop.c", "fill_colour.c")
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-DFASTLOAD_NO_SIMD", "-o", str(plain),
                    *(str(REPO / "fastload/decode" / name) for name in names), "-lm"], check=True, capture_output=True)
    lib = ctypes.CDLL(str(plain))
    planes = np.random.default_rng(1).integers(0, 256, stored_bytes(417, 300), dtype=np.uint8)
    for box, (width, height), flip in [((0.0, 0.0, 417.0, 300.0), (256, 184), 0),
                                       ((3.5, 7.25, 390.0, 299.0), (200, 224), 1),
                                       ((100.0, 50.0, 180.0, 150.0), (224, 224), 0),
                                       ((0.0, 0.0, 417.0, 300.0), (61, 31), 1)]:
        fast, slow = np.zeros((3, height, width), np.uint8), np.ones((3, height, width), np.uint8)
        crop_planes_into(planes, 417, 300, *box, False, bool(flip), fast.transpose(1, 2, 0))
        target = Target(slow.ctypes.data, width, 1, width * height, flip)
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
