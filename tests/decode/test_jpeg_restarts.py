"""Restart markers: the lossless rewrite at pack time, and crops decoded from their intervals alone."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from PIL import Image

from fastload.decode.crops import REGION_DECODE, decode_crop
from fastload.decode.transforms import EvalCrop, TrainCrop
from tests.decode.test_decode import encode, photo
from tests.decode.test_jpeg_region import DAMAGE, HEADERS, KINDS, check_damaged, pixels

pytestmark = pytest.mark.skipif(not (REGION_DECODE or HEADERS),
                                reason="no libjpeg headers here, so no native decoder to test")


def grainy(img: Image.Image) -> Image.Image:
    """Sensor-like noise: real photos spend ~150 bytes on a 16x16 block, the smooth ones 5."""
    noise = np.random.default_rng(0).normal(0, 16, (img.height, img.width, 3))
    return Image.fromarray(np.clip(np.asarray(img) + noise, 0, 255).astype(np.uint8))


@pytest.fixture(scope="module")
def originals() -> dict[str, bytes]:
    kinds = {name: make() for name, make in KINDS.items()}
    # 29 MCUs a row (a prime): intervals of one MCU where a photo's grain makes MCUs dense, of
    # the whole row where a smooth image would spend more on markers than on pixels. And a file
    # with its own restart markers every 3 MCUs in rows of 25: its intervals run across rows.
    kinds["prime width"] = encode(grainy(photo(464, 300, seed=9)), quality=95)
    kinds["prime width, smooth"] = encode(photo(464, 300, seed=9), quality=90)
    kinds["intervals across rows"] = encode(photo(400, 300, seed=10), quality=90, restart_marker_blocks=3)
    kinds["one interval a row"] = encode(photo(380, 290, seed=11), quality=90, restart_marker_rows=1)
    return kinds


@pytest.fixture(scope="module")
def rewritten(native, originals) -> dict[str, bytes]:
    return {name: native.add_restart_markers(data)[0] for name, data in originals.items()}


def segments(data: bytes) -> list[tuple[int, bytes]]:
    """``(marker, body)`` of every header segment up to and including SOS."""
    found, pos = [], 2
    while True:
        marker, length = data[pos + 1], int.from_bytes(data[pos + 2:pos + 4], "big")
        found.append((marker, data[pos + 4:pos + 2 + length]))
        if marker == 0xDA:
            return found
        pos += 2 + length


def layout(data: bytes) -> tuple[int, int, int]:
    """``(MCUs in a row, MCU width, restart interval)`` from a baseline JPEG's headers."""
    heads = dict(segments(data))
    frame = heads.get(0xC0, heads.get(0xC1))
    width, count = int.from_bytes(frame[3:5], "big"), frame[5]
    mcu = 8 if count == 1 else 8 * max(frame[7 + 3 * i] >> 4 for i in range(count))
    interval = int.from_bytes(heads[0xDD][:2], "big") if 0xDD in heads else 0
    return -(-width // mcu), mcu, interval


def rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


# --- the rewrite ---------------------------------------------------------------------------


def test_the_rewrite_is_lossless_and_tiles_every_row(originals, rewritten):
    for name, data in originals.items():
        assert np.array_equal(rgb(rewritten[name]), rgb(data)), name
        per_row, mcu, interval = layout(rewritten[name])
        assert per_row % interval == 0, (name, per_row, mcu, interval)
        # Optimised Huffman tables pay for the markers: never much larger than the source.
        assert len(rewritten[name]) < 1.05 * len(data), name
    assert layout(rewritten["prime width"])[2] == 1
    assert layout(rewritten["prime width, smooth"])[2] == 29


def test_progressive_files_become_baseline(rewritten):
    assert 0xC2 not in dict(segments(rewritten["progressive"]))


def test_exif_icc_and_comments_are_kept_once(native):
    exif, icc = Image.Exif(), b"ICC-profile-bytes" * 10
    exif[0x010F] = "fastload camera"
    data = encode(photo(200, 150), quality=90, exif=exif.tobytes(), icc_profile=icc)
    data = data[:2] + b"\xff\xfe\x00\x07hello" + data[2:]
    out, _ = native.add_restart_markers(data)
    img = Image.open(io.BytesIO(out))
    assert img.info["icc_profile"] == icc
    assert img.getexif()[0x010F] == "fastload camera"
    assert out.count(b"hello") == 1 and out.count(b"JFIF\x00") == data.count(b"JFIF\x00")


def test_cmyk_is_rewritten_too(native):
    data = encode(photo(96, 64).convert("CMYK"), quality=90)
    out, _ = native.add_restart_markers(data)
    assert np.array_equal(rgb(out), rgb(data))


@pytest.mark.parametrize("bad, message", [
    (b"", "libjpeg: "), (b"not a jpeg", "libjpeg: Not a JPEG file"),
    (encode(photo(64, 48), "PNG"), "libjpeg: Not a JPEG file"),
])
def test_what_cannot_be_rewritten_raises_with_libjpegs_reason(native, bad, message):
    with pytest.raises(native.RegionDecodeError, match=message):
        native.add_restart_markers(bad)


def test_damaged_scan_data_is_refused_not_rewritten(native, originals):
    data = originals["4:2:0"]
    with pytest.raises(native.RegionDecodeError, match="libjpeg: Premature end of JPEG file"):
        native.add_restart_markers(data[: len(data) // 2])


# --- crops cut from their intervals -------------------------------------------------------


@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_a_cut_decode_gives_the_very_pixels_of_a_whole_decode(native, originals, rewritten, scale):
    for name, data in rewritten.items():
        whole = pixels(native.decode_region(data, scale, 0, 0, 10**6, 10**6, 10**9))
        assert np.array_equal(whole, pixels(native.decode_region(originals[name], scale, 0, 0, 10**6,
                                                                 10**6, 10**9))), name
        height, width = whole.shape[:2]
        rng = np.random.default_rng(scale)
        for _ in range(12):
            left, top = int(rng.integers(0, width - 1)), int(rng.integers(0, height - 1))
            right = int(rng.integers(left + 1, width + 1))
            bottom = int(rng.integers(top + 1, height + 1))
            for source in (data, originals[name]):
                result = native.decode_region(source, scale, left, top, right, bottom, 10**9, True)
                assert result[1:] == (left, top, right - left, bottom - top), name
                assert np.array_equal(pixels(result), whole[top:bottom, left:right]), (name, left, top)


def first_interval(data: bytes) -> tuple[int, int]:
    """Where the scan's first restart interval starts and ends."""
    start = data.index(b"\xff\xda")
    start += 2 + int.from_bytes(data[start + 2:start + 4], "big")
    return start, data.index(b"\xff\xd0", start)


def test_intervals_outside_the_box_are_never_read(native, rewritten):
    """A damaged top-left interval: the whole-scan path hits it, the cut never does."""
    data = rewritten["4:2:0"]
    start, end = first_interval(data)
    damaged = data[:start] + data[start:start + (end - start) // 3] + data[end:]
    box = (300, 250, 480, 360)  # far from the top-left corner
    with pytest.raises(native.RegionDecodeError, match="libjpeg: Corrupt JPEG data"):
        native.decode_region(damaged, 1, *box, 10**9)
    cut = native.decode_region(damaged, 1, *box, 10**9, True)
    assert np.array_equal(pixels(cut), pixels(native.decode_region(data, 1, *box, 10**9)))


def test_the_pixel_limit_holds_for_cut_decodes(native, rewritten):
    with pytest.raises(native.RegionDecodeError, match="500x375 is over the pixel limit"):
        native.decode_region(rewritten["4:2:0"], 1, 0, 0, 10, 10, 1000, True)


@pytest.mark.parametrize("name", ["4:2:0", "grey", "progressive", "odd size", "prime width"])
def test_train_and_eval_crops_of_a_rewritten_file_equal_the_originals(originals, rewritten, name):
    width, height = Image.open(io.BytesIO(originals[name])).size
    rng = np.random.default_rng(1)
    plans = [TrainCrop(224).sample(width, height, rng) for _ in range(16)]
    plans += [TrainCrop(32).sample(width, height, rng) for _ in range(4)]
    plans += [EvalCrop(224).sample(width, height)]
    for plan in plans:
        from_cut = decode_crop(rewritten[name], plan)
        assert np.array_equal(from_cut, decode_crop(rewritten[name], plan, cut=False)), plan
        assert np.array_equal(from_cut, decode_crop(originals[name], plan)), plan


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(**DAMAGE)
def test_damaged_rewritten_jpegs_give_pillows_pixels_or_a_corrupt_record_error(rewritten, cut, flips,
                                                                                 seed):
    check_damaged(rewritten["4:2:0"], cut, flips, seed)
