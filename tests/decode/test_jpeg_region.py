"""Native JPEG crop decode: only the rows and columns the resize reads, resized with Pillow's
arithmetic: the very bytes of Pillow's path."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from fastload.decode.crops import REGION_DECODE, decode_crop, draft_scale, jpeg_decoder
from fastload.errors import CorruptRecordError
from fastload.decode.transforms import CropPlan, EvalCrop, TrainCrop
from tests.decode.test_decode import encode, photo

HEADERS = Path("/usr/include/jpeglib.h").exists()
pytestmark = pytest.mark.skipif(not (REGION_DECODE or HEADERS),
                                reason="no libjpeg headers here, so no native decoder to test")


def test_the_native_decoder_is_built_where_libjpeg_headers_exist():
    # setup.py marks the extension optional; this catches a build that broke quietly.
    assert REGION_DECODE, "fastload.decode._jpeg_region did not build; see the pip install log"
    assert jpeg_decoder().startswith("region decode (libjpeg")


@pytest.mark.parametrize("value, expected", [
    ("pillow", "False Pillow, whole images (FASTLOAD_JPEG_DECODER=pillow)"),
    ("region", "True region decode (libjpeg"),
])
def test_the_environment_can_ask_for_pillow(value, expected):
    code = "from fastload.decode.crops import REGION_DECODE, jpeg_decoder; print(REGION_DECODE, jpeg_decoder())"
    env = {**os.environ, "FASTLOAD_JPEG_DECODER": value}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.startswith(expected)


def test_a_bad_decoder_name_in_the_environment_is_an_error():
    env = {**os.environ, "FASTLOAD_JPEG_DECODER": "turbo"}
    out = subprocess.run([sys.executable, "-c", "import fastload.decode.crops"], env=env, capture_output=True,
                         text=True)
    assert out.returncode != 0
    assert "FASTLOAD_JPEG_DECODER='turbo': use 'region' or 'pillow'" in out.stderr


KINDS = {
    "4:2:0": lambda: encode(photo(500, 375, seed=1), quality=90),
    "4:2:2": lambda: encode(photo(480, 360, seed=2), quality=90, subsampling=1),
    "4:4:4": lambda: encode(photo(400, 300, seed=3), quality=95, subsampling=0),
    "grey": lambda: encode(photo(450, 350, seed=4).convert("L"), quality=90),
    "progressive": lambda: encode(photo(500, 400, seed=5), quality=85, progressive=True),
    "restart markers": lambda: encode(photo(420, 340, seed=6), quality=90, restart_marker_blocks=3),
    "odd size": lambda: encode(photo(333, 257, seed=7), quality=80),
    "large (reduced scale)": lambda: encode(photo(1800, 1350, seed=8), quality=90),
}


@pytest.fixture(scope="module")
def jpegs() -> dict[str, bytes]:
    return {name: make() for name, make in KINDS.items()}


def both_paths(data: bytes, plan) -> tuple[np.ndarray, np.ndarray]:
    return decode_crop(data, plan), decode_crop(data, plan, region=False)


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("in_thread", [False, True], ids=["main thread", "decode thread"])
def test_train_and_eval_crops_equal_the_whole_image_path(jpegs, kind, in_thread):
    """Whole-pixel train boxes and fractional ones (eval, or reduced-scale train): the same
    bytes as Pillow's decode + resize, in any thread."""
    data = jpegs[kind]
    width, height = Image.open(io.BytesIO(data)).size
    rng = np.random.default_rng(0)
    plans = [TrainCrop(224).sample(width, height, rng) for _ in range(24)]
    plans += [TrainCrop(32).sample(width, height, rng) for _ in range(8)]  # small outputs: 1/8 scale
    plans += [EvalCrop(224).sample(width, height), EvalCrop(64).sample(width, height)]

    def check(plan) -> None:
        region, whole = both_paths(data, plan)
        assert region.shape == whole.shape == (*plan.out_size, 3)
        assert np.array_equal(region, whole), plan
        pillow = Image.open(io.BytesIO(data))
        scale = draft_scale(plan.box, plan.out_size)
        if scale > 1:
            pillow.draft("RGB", (width // scale, height // scale))
        pillow = pillow.convert("RGB")
        left, top, w, h = (v / scale for v in plan.box)
        box = (left, top, min(left + w, pillow.width), min(top + h, pillow.height))
        if plan.crop_first and all(float(v).is_integer() for v in box):
            pillow = pillow.crop(tuple(int(v) for v in box)).resize(plan.out_size[::-1], Image.BILINEAR)
        else:
            pillow = pillow.resize(plan.out_size[::-1], Image.BILINEAR, box=box)
        if plan.flip:
            pillow = pillow.transpose(Image.FLIP_LEFT_RIGHT)
        assert np.array_equal(region, np.asarray(pillow)), plan

    if in_thread:
        with ThreadPoolExecutor(1) as pool:
            list(pool.map(check, plans))
    else:
        for plan in plans:
            check(plan)


def test_the_large_kind_is_decoded_at_reduced_scale(jpegs):
    plan = TrainCrop(32).sample(1800, 1350, np.random.default_rng(1))
    assert draft_scale(plan.box, plan.out_size) > 1


def test_many_threads_decode_the_same_as_one(jpegs):
    data = jpegs["4:2:0"]
    rng = np.random.default_rng(3)
    plans = [TrainCrop(224).sample(500, 375, rng) for _ in range(64)]
    with ThreadPoolExecutor(1) as pool:
        alone = list(pool.map(lambda p: decode_crop(data, p), plans))
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda p: decode_crop(data, p), plans))
    assert all(np.array_equal(a, b) for a, b in zip(alone, together))


# --- the native call itself ------------------------------------------------------------------


def pixels(result) -> np.ndarray:
    buffer, _, _, width, height = result
    return np.frombuffer(buffer, dtype=np.uint8).reshape(height, width, 3)


@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_a_region_is_the_same_rows_and_columns_of_the_whole_image(jpegs, native, scale):
    data = jpegs["large (reduced scale)"]
    whole = pixels(native.decode_region(data, scale, 0, 0, 10**6, 10**6, 10**9))
    height, width = whole.shape[:2]
    assert (width, height) == (-(-1800 // scale), -(-1350 // scale))
    rng = np.random.default_rng(scale)
    for _ in range(20):
        left, top = int(rng.integers(0, width - 1)), int(rng.integers(0, height - 1))
        right, bottom = int(rng.integers(left + 1, width + 1)), int(rng.integers(top + 1, height + 1))
        result = native.decode_region(data, scale, left, top, right, bottom, 10**9)
        assert result[1:] == (left, top, right - left, bottom - top)
        assert np.array_equal(pixels(result), whole[top:bottom, left:right])


def test_a_box_past_the_edge_is_clamped_and_one_outside_refused(jpegs, native):
    data = jpegs["4:2:0"]
    _, left, top, width, height = native.decode_region(data, 1, 450, 300, 900, 900, 10**9)
    assert (left, top, width, height) == (450, 300, 50, 75)
    with pytest.raises(native.RegionDecodeError, match="outside the 500x375 image"):
        native.decode_region(data, 1, 500, 0, 600, 10, 10**9)
    with pytest.raises(ValueError, match="bad scale 3"):
        native.decode_region(data, 3, 0, 0, 10, 10, 10**9)
    with pytest.raises(ValueError, match="box corner -1,0"):
        native.decode_region(data, 1, -1, 0, 10, 10, 10**9)


def test_what_libjpeg_refuses_or_warns_about_raises(jpegs, native):
    data = jpegs["4:2:0"]
    cmyk = encode(photo(64, 48).convert("CMYK"))
    png = encode(photo(64, 48), "PNG")
    for bad, message in [(data[: len(data) // 2], "libjpeg: Premature end of JPEG file"),
                         (data[:300], "libjpeg: "), (cmyk, "libjpeg: Unsupported color conversion"),
                         (png, "libjpeg: Not a JPEG file"), (b"", "libjpeg: ")]:
        with pytest.raises(native.RegionDecodeError, match=message):
            native.decode_region(bad, 1, 0, 0, 10**6, 10**6, 10**9)
    with pytest.raises(native.RegionDecodeError, match="500x375 is over the pixel limit"):
        native.decode_region(data, 1, 0, 0, 10, 10, 1000)


def test_refused_jpegs_are_decoded_by_pillow_with_its_rules(jpegs):
    """CMYK converts as Pillow does; a JPEG cut short is an error whatever the crop."""
    cmyk = photo(200, 150).convert("CMYK")
    plan = TrainCrop(64).sample(200, 150, np.random.default_rng(0))
    region, whole = both_paths(encode(cmyk), plan)
    assert np.array_equal(region, whole)
    data = jpegs["4:2:0"]
    cut = data[: len(data) * 3 // 4]
    top_left = CropPlan(box=(0, 0, 40, 40), out_size=(32, 32), crop_first=True)
    for plan in (top_left, EvalCrop(32).sample(500, 375)):
        with pytest.raises(CorruptRecordError, match="truncated"):
            decode_crop(cut, plan, where="r")


DAMAGE = {"cut": st.integers(0, 200), "seed": st.integers(0, 2**16),
          "flips": st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3)}


def check_damaged(jpeg: bytes, cut: int, flips: list[tuple[int, int]], seed: int) -> None:
    """``jpeg`` (500x375) damaged: a crop gives Pillow's pixels or CorruptRecordError."""
    data = bytearray(jpeg)
    for position, value in flips:
        data[position % len(data)] = value
    data = bytes(data[: len(data) - cut])
    plan = TrainCrop(64).sample(500, 375, np.random.default_rng(seed))
    try:
        region = decode_crop(data, plan, where="r")
    except CorruptRecordError:
        return  # the documented error; never another exception, never a crash
    try:
        whole = decode_crop(data, plan, where="r", region=False)
    except CorruptRecordError:
        # Damage only in rows under the crop (or, with restart markers, outside its intervals)
        # is never decoded: the crop's pixels are right. `fastload verify --decode` decodes
        # every record whole.
        return
    assert np.array_equal(region, whole)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(**DAMAGE)
def test_damaged_jpegs_give_pillows_pixels_or_a_corrupt_record_error(jpegs, cut, flips, seed):
    check_damaged(jpegs["4:2:0"], cut, flips, seed)


def test_a_box_from_a_damaged_index_is_the_documented_error(jpegs):
    """A width past C's int range goes to Pillow's path, which names the mismatch."""
    plan = CropPlan(box=(0, 0, 2**33, 40), out_size=(8, 8), crop_first=True)
    with pytest.raises(CorruptRecordError, match="the index does not match the record"):
        decode_crop(jpegs["4:2:0"], plan, where="r")


# --- the native resize: Pillow's bilinear arithmetic, to the bit -------------------------------


@settings(max_examples=300, deadline=None)
@given(size=st.tuples(st.integers(1, 90), st.integers(1, 90)),
       out=st.tuples(st.integers(1, 90), st.integers(1, 90)),
       corners=st.tuples(*[st.floats(0, 1) for _ in range(4)]),
       whole=st.booleans(), flip=st.booleans(), grey=st.booleans(), seed=st.integers(0, 2**16))
def test_resize_into_gives_pillows_bytes(size, out, corners, whole, flip, grey, seed):
    """Shrinking and enlarging, in either pass order (Pillow picks it from the sizes), whole and
    fractional boxes, RGB and grey, flipped or not, into HWC and CHW layouts: the bytes of
    Pillow's resize."""
    from fastload.decode._jpeg_region import resize_into

    width, height = size
    rng = np.random.default_rng(seed)
    image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    image = image.convert("L") if grey else image
    a, b, c, d = corners
    x0, x1 = sorted((a * width, c * width))
    y0, y1 = sorted((b * height, d * height))
    if whole:
        x0, y0, x1, y1 = (float(int(v)) for v in (x0, y0, x1 + 1, y1 + 1))
        x1, y1 = min(x1, width), min(y1, height)
    if x1 - x0 < 1e-3 or y1 - y0 < 1e-3:
        return
    if whole:
        expected = image.crop((int(x0), int(y0), int(x1), int(y1))).resize(out, Image.BILINEAR)
    else:
        expected = image.resize(out, Image.BILINEAR, box=(x0, y0, x1, y1))
    expected = np.asarray(expected.convert("RGB"))
    expected = expected[:, ::-1] if flip else expected
    got = np.zeros((out[1], out[0], 3), np.uint8)
    resize_into(np.asarray(image), x0, y0, x1, y1, whole, flip, got)
    assert np.array_equal(got, expected)
    planes = np.zeros((3, out[1], out[0]), np.uint8)  # a CHW slot: the loader's layout
    resize_into(np.asarray(image), x0, y0, x1, y1, whole, flip, planes.transpose(1, 2, 0))
    assert np.array_equal(planes.transpose(1, 2, 0), expected)


def test_crops_land_in_any_strided_slot(jpegs, native):
    data = jpegs["4:2:0"]
    plan = TrainCrop(64).sample(500, 375, np.random.default_rng(4))
    expected = decode_crop(data, plan, draft=False)  # at full scale, as the calls below
    batch = np.zeros((2, 3, 64, 64), np.uint8)  # a CHW batch, as the loader fills it
    box = (plan.box[0], plan.box[1], plan.box[0] + plan.box[2], plan.box[1] + plan.box[3])
    native.decode_crop_into(data, 1, *box, True, plan.flip, batch[1].transpose(1, 2, 0), 10**9)
    assert np.array_equal(batch[1].transpose(1, 2, 0), expected) and not batch[0].any()
    wide = np.zeros((64, 128, 3), np.uint8)[:, ::2]  # every other column
    whole = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    native.resize_into(whole, *box, True, plan.flip, wide)
    assert np.array_equal(wide, expected)


def test_the_native_calls_refuse_bad_arguments(jpegs, native):
    data = jpegs["4:2:0"]
    pixels_ = np.zeros((30, 40, 3), np.uint8)
    for bad_out in (np.zeros((8, 8, 4), np.uint8), np.zeros((8, 8, 3), np.float32),
                    np.zeros((8, 8), np.uint8)):
        with pytest.raises(ValueError, match="out must be a writable uint8 array"):
            native.resize_into(pixels_, 0, 0, 10, 10, True, False, bad_out)
        with pytest.raises(ValueError, match="out must be a writable uint8 array"):
            native.decode_crop_into(data, 1, 0, 0, 10, 10, True, False, bad_out, 10**9)
    read_only = np.zeros((8, 8, 3), np.uint8)
    read_only.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        native.resize_into(pixels_, 0, 0, 10, 10, True, False, read_only)
    with pytest.raises(ValueError, match="pixels must be a uint8 array"):
        native.resize_into(np.zeros((30, 40, 2), np.uint8), 0, 0, 10, 10, True, False,
                           np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match="outside the 40x30 image"):
        native.resize_into(pixels_, 0, 0, 41, 10, True, False, np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(native.RegionDecodeError, match="reaches past the 500x375 image"):
        native.decode_crop_into(data, 1, 0, 0, 502, 10, True, False, np.zeros((8, 8, 3), np.uint8),
                                10**9)
    with pytest.raises(ValueError, match="bad scale 3"):
        native.decode_crop_into(data, 3, 0, 0, 10, 10, True, False, np.zeros((8, 8, 3), np.uint8),
                                10**9)


_GUARD_PAGE = """
import ctypes, mmap, numpy as np
from PIL import Image
from fastload.decode._jpeg_region import resize_into
libc = ctypes.CDLL(None)
page = mmap.PAGESIZE
area = mmap.mmap(-1, 2 * page)
address = ctypes.addressof(ctypes.c_char.from_buffer(area))
assert libc.mprotect(ctypes.c_void_p(address + page), page, 0) == 0  # the next page: no access
height, width = 5, 60  # 900 bytes that end where the guard page starts
pixels = np.frombuffer(area, np.uint8, 3 * width * height, page - 3 * width * height)
pixels = pixels.reshape(height, width, 3)
pixels[:] = np.random.default_rng(0).integers(0, 256, pixels.shape, dtype=np.uint8)
out = np.zeros((3, 17, 3), np.uint8)
resize_into(pixels, 20.0, 2.0, 60.0, 5.0, True, False, out)
expected = Image.fromarray(np.array(pixels)).crop((20, 2, 60, 5)).resize((17, 3), Image.BILINEAR)
print(int(np.array_equal(out, np.asarray(expected))))
"""


def test_the_fast_row_pass_never_reads_past_a_callers_array():
    """Its 8-byte loads step aside near the end of memory the caller owns: an image that ends
    where an inaccessible page starts is resized (a read past it would kill the process)."""
    out = subprocess.run([sys.executable, "-c", _GUARD_PAGE], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"
