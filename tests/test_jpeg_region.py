"""Native JPEG region decode: only the crop's rows and columns, the same pixels as Pillow's path."""

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

from fastload.decode import REGION_DECODE, decode_crop, draft_scale, jpeg_decoder
from fastload.errors import CorruptRecordError
from fastload.transforms import CropPlan, EvalCrop, TrainCrop
from tests.test_decode import encode, photo

HEADERS = Path("/usr/include/jpeglib.h").exists()
pytestmark = pytest.mark.skipif(not (REGION_DECODE or HEADERS),
                                reason="no libjpeg headers here, so no native decoder to test")


def test_the_native_decoder_is_built_where_libjpeg_headers_exist():
    # setup.py marks the extension optional; this catches a build that broke quietly.
    assert REGION_DECODE, "fastload._jpeg_region did not build; see the pip install log"
    assert jpeg_decoder().startswith("region decode (libjpeg")


@pytest.mark.parametrize("value, expected", [
    ("pillow", "False Pillow, whole images (FASTLOAD_JPEG_DECODER=pillow)"),
    ("region", "True region decode (libjpeg"),
])
def test_the_environment_can_ask_for_pillow(value, expected):
    code = "from fastload.decode import REGION_DECODE, jpeg_decoder; print(REGION_DECODE, jpeg_decoder())"
    env = {**os.environ, "FASTLOAD_JPEG_DECODER": value}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.startswith(expected)


def test_a_bad_decoder_name_in_the_environment_is_an_error():
    env = {**os.environ, "FASTLOAD_JPEG_DECODER": "turbo"}
    out = subprocess.run([sys.executable, "-c", "import fastload.decode"], env=env, capture_output=True,
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
    """Main-thread crops resize with Pillow, decode threads with torch's kernel."""
    data = jpegs[kind]
    width, height = Image.open(io.BytesIO(data)).size
    rng = np.random.default_rng(0)
    plans = [TrainCrop(224).sample(width, height, rng) for _ in range(24)]
    plans += [TrainCrop(32).sample(width, height, rng) for _ in range(8)]  # small outputs: 1/8 scale
    plans += [EvalCrop(224).sample(width, height), EvalCrop(64).sample(width, height)]

    def check(plan) -> None:
        region, whole = both_paths(data, plan)
        assert region.shape == whole.shape == (*plan.out_size, 3)
        differ = region != whole
        if plan.crop_first and all(float(v / draft_scale(plan.box, plan.out_size)).is_integer()
                                   for v in plan.box):
            assert not differ.any(), plan  # a whole-pixel box: the very pixels
        else:
            # A fractional box is resized in place from a region, not from the whole image:
            # Pillow's filter weights, computed from the box's offset, round differently.
            assert np.abs(region.astype(int) - whole).max() <= 1 and differ.mean() < 0.01, plan

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
    with ThreadPoolExecutor(1) as pool:  # decode threads resize with torch, the main thread with Pillow
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
    assert np.abs(region.astype(int) - whole).max() <= 1
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
    assert np.abs(region.astype(int) - whole).max() <= 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**DAMAGE)
def test_damaged_jpegs_give_pillows_pixels_or_a_corrupt_record_error(jpegs, cut, flips, seed):
    check_damaged(jpegs["4:2:0"], cut, flips, seed)


def test_a_box_from_a_damaged_index_is_the_documented_error(jpegs):
    """A width past C's int range goes to Pillow's path, which names the mismatch."""
    plan = CropPlan(box=(0, 0, 2**33, 40), out_size=(8, 8), crop_first=True)
    with pytest.raises(CorruptRecordError, match="the index does not match the record"):
        decode_crop(jpegs["4:2:0"], plan, where="r")
