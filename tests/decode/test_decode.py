"""Decode: bytes to RGB uint8 pixels, reduced-scale JPEG decode, every mode, corrupt input."""

from __future__ import annotations

import io
import struct
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFilter

from fastload.decode.crops import decode_crop, draft_scale
from fastload.decode.images import MAX_PIXELS, decode_rgb, image_size
from fastload.errors import CorruptRecordError
from fastload.decode.pipeline import ThreadDecoder
from fastload.decode.transforms import CropPlan, EvalCrop, TrainCrop


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A photo-like RGB image: smooth colour gradients, a dozen flat shapes, slight blur."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    r = 127 + 100 * np.sin(x / width * 3.1 + 0.5) * np.cos(y / height * 2.3)
    g = 127 + 100 * np.cos((x + y) / (width + height) * 5.0)
    b = 60 + 150 * (y / height)
    img = Image.fromarray(np.clip(np.stack([r, g, b], -1), 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        side = int(rng.integers(max(1, min(width, height) // 20), max(2, min(width, height) // 4)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape([x0, y0, x0 + side, y0 + side], fill=colour)
    return img.filter(ImageFilter.GaussianBlur(1.0))


def encode(img: Image.Image, fmt: str = "JPEG", **kwargs) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kwargs)
    return buf.getvalue()


@pytest.fixture(scope="module")
def small_jpeg() -> bytes:
    return encode(photo(500, 375, seed=1), quality=90)


@pytest.fixture(scope="module")
def large_jpeg() -> bytes:
    return encode(photo(2000, 1500, seed=2), quality=90)


def reference_eval(data: bytes, size: int = 224, ratio: float = 0.875) -> np.ndarray:
    """The plain torchvision-style eval path: full decode, Resize(shorter side), CenterCrop."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    width, height = img.size
    short = round(size / ratio)
    if width <= height:
        new = (short, int(short * height / width))
    else:
        new = (int(short * width / height), short)
    img = img.resize(new, Image.BILINEAR)
    left, top = int(round((new[0] - size) / 2)), int(round((new[1] - size) / 2))
    return np.asarray(img.crop((left, top, left + size, top + size)))


def test_image_size_reads_only_the_header(large_jpeg):
    assert image_size(large_jpeg) == (2000, 1500)
    # The first kilobyte holds the header and no pixel data.
    assert image_size(large_jpeg[:1024]) == (2000, 1500)
    assert image_size(encode(photo(31, 17), "PNG")) == (31, 17)


def test_eval_decode_without_reduction_matches_pillow_reference(small_jpeg):
    """500x375 to 224: the box is 328 px, under 2x the output, so no draft; the one resize
    over the box uses the same filter as resize-then-crop. Measured: mean 0.000, max 1
    (float round-off of the box); tolerance mean <= 0.05, max <= 1."""
    plan = EvalCrop(224).sample(*image_size(small_jpeg))
    assert draft_scale(plan.box, plan.out_size) == 1
    diff = np.abs(decode_crop(small_jpeg, plan).astype(int) - reference_eval(small_jpeg))
    assert diff.mean() <= 0.05 and diff.max() <= 1


def test_eval_decode_with_reduction_is_close_to_pillow_reference(large_jpeg):
    """2000x1500 to 224: libjpeg decodes at 1/4, then one bilinear resize. The DCT-domain
    reduction is a different (sharper) low-pass filter than Pillow's wide bilinear one, so
    pixels differ near edges. Measured on this image: mean 0.17, 99th percentile 2, max 5;
    on real photo wallpapers mean 0.3-2.8, p99 3-13 (busier images differ more). Tolerance:
    mean <= 1.0, 99th percentile <= 6."""
    plan = EvalCrop(224).sample(*image_size(large_jpeg))
    assert draft_scale(plan.box, plan.out_size) == 4
    diff = np.abs(decode_crop(large_jpeg, plan).astype(int) - reference_eval(large_jpeg))
    assert diff.mean() <= 1.0 and np.percentile(diff, 99) <= 6


def test_reduced_decode_is_what_decode_crop_does(large_jpeg):
    plan = CropPlan(box=(100.0, 60.0, 1600.0, 1200.0), out_size=(224, 224))
    assert draft_scale(plan.box, plan.out_size) == 4
    img = Image.open(io.BytesIO(large_jpeg))
    img.draft("RGB", (2000 // 4, 1500 // 4))
    assert img.size == (500, 375)
    by_hand = img.resize((224, 224), Image.BILINEAR, box=(25.0, 15.0, 425.0, 315.0))
    assert np.array_equal(decode_crop(large_jpeg, plan), np.asarray(by_hand))
    # Full-size decode gives different (if close) pixels, so the reduction really happened.
    assert not np.array_equal(decode_crop(large_jpeg, plan, draft=False), np.asarray(by_hand))


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("in_thread", [False, True], ids=["main thread", "decode thread"])
def test_whole_pixel_boxes_are_cut_out_then_resized_by_pillows_arithmetic(mode, flip, in_thread):
    """Train boxes with whole-pixel corners are cut out first (edge pixels see only the box, as
    torchvision's resized_crop), then resized: the very bytes of Pillow's crop + resize, in any
    thread, for shrinking, the whole image, and enlarging."""
    data = encode(photo(480, 360, seed=5).convert(mode), quality=92)
    full = Image.open(io.BytesIO(data)).convert("RGB")
    for box, out_size in [((40, 30, 300, 250), (224, 224)), ((0, 0, 480, 360), (96, 128)),
                          ((200, 100, 60, 50), (224, 224)), ((10, 20, 400, 90), (224, 224))]:
        plan = CropPlan(box=box, out_size=out_size, flip=flip, crop_first=True)
        left, top, w, h = box
        ref = full.crop((left, top, left + w, top + h)).resize(out_size[::-1], Image.BILINEAR)
        ref = np.asarray(ref.transpose(Image.FLIP_LEFT_RIGHT) if flip else ref)
        if in_thread:
            with ThreadPoolExecutor(1) as decode_thread:
                got = decode_thread.submit(decode_crop, data, plan, draft=False).result()
        else:
            got = decode_crop(data, plan, draft=False)
        assert np.array_equal(got, ref), box


def test_camera_jpegs_with_a_preview_are_reduced_too():
    """Pillow opens camera JPEGs that carry a preview (MPO) as format "MPO"."""
    img = photo(2000, 1500, seed=2)
    data = encode(img, "MPO", save_all=True, append_images=[img.resize((160, 120))])
    by_hand = Image.open(io.BytesIO(data))
    assert by_hand.format == "MPO"
    by_hand.draft("RGB", (500, 375))
    # A box that is fractional at 1/4 scale: Pillow's resize(box=), exactly.
    by_hand = by_hand.resize((224, 224), Image.BILINEAR, box=(25.25, 15.25, 425.25, 315.25))
    plan = CropPlan(box=(101.0, 61.0, 1600.0, 1200.0), out_size=(224, 224))
    assert np.array_equal(decode_crop(data, plan), np.asarray(by_hand))


@pytest.mark.parametrize(
    "box_side,out,expected",
    [(1600, 224, 4), (1792, 224, 8), (1791, 224, 4), (447, 224, 1), (448, 224, 2),
     (100, 224, 1), (2000, 100, 8)],
)
def test_draft_scale_keeps_at_least_the_output_resolution(box_side, out, expected):
    scale = draft_scale((0.0, 0.0, float(box_side), float(box_side)), (out, out))
    assert scale == expected
    assert scale == 1 or box_side / scale >= out


def test_draft_scale_uses_the_tighter_side():
    assert draft_scale((0.0, 0.0, 1800.0, 500.0), (224, 224)) == 2
    # out_size is (height, width): 125 rows at 1/4 still cover 100, 450 columns cover 400.
    assert draft_scale((0.0, 0.0, 1800.0, 500.0), (100, 400)) == 4
    assert draft_scale((0.0, 0.0, 1800.0, 500.0), (300, 100)) == 1


@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_pillow_draft_picks_the_largest_reduction_at_least_the_request(large_jpeg, scale):
    """What decode_crop relies on: asking for (W // s, H // s) gives exactly 1/s, and asking
    one pixel more gives the next smaller reduction."""
    img = Image.open(io.BytesIO(large_jpeg))
    img.draft("RGB", (2000 // scale, 1500 // scale))
    assert img.size == (-(-2000 // scale), -(-1500 // scale))
    if scale > 1:
        img = Image.open(io.BytesIO(large_jpeg))
        img.draft("RGB", (2000 // scale + 1, 1500 // scale))
        half = scale // 2
        assert img.size == (-(-2000 // half), -(-1500 // half))


def test_train_crop_flip_mirrors_the_unflipped_pixels(small_jpeg):
    plan = TrainCrop(64).sample(500, 375, np.random.default_rng(3))
    plain = decode_crop(small_jpeg, CropPlan(plan.box, plan.out_size, flip=False))
    flipped = decode_crop(small_jpeg, CropPlan(plan.box, plan.out_size, flip=True))
    assert np.array_equal(flipped, plain[:, ::-1])


def test_output_shape_follows_height_width_order(small_jpeg):
    out = decode_crop(small_jpeg, EvalCrop((96, 160)).sample(500, 375))
    assert out.shape == (96, 160, 3) and out.dtype == np.uint8


def test_decode_into_a_preallocated_batch(small_jpeg, large_jpeg):
    plan = EvalCrop(64).sample(500, 375)
    expected = decode_crop(small_jpeg, plan)
    nhwc = torch.zeros(2, 64, 64, 3, dtype=torch.uint8)
    returned = decode_crop(small_jpeg, plan, out=nhwc[1].numpy())
    assert np.shares_memory(returned, nhwc.numpy())
    assert np.array_equal(nhwc[1].numpy(), expected) and not nhwc[0].any()
    assert nhwc.permute(0, 3, 1, 2).shape == (2, 3, 64, 64)
    # A channels-first slice, seen as HWC, works too.
    nchw = torch.zeros(2, 3, 64, 64, dtype=torch.uint8)
    decode_crop(small_jpeg, plan, out=nchw[0].permute(1, 2, 0).numpy())
    assert np.array_equal(nchw[0].permute(1, 2, 0).numpy(), expected)


def test_a_wrong_out_array_is_refused(small_jpeg):
    plan = EvalCrop(64).sample(500, 375)
    with pytest.raises(ValueError, match="out must be"):
        decode_crop(small_jpeg, plan, out=np.zeros((3, 64, 64), np.uint8))
    with pytest.raises(ValueError, match="out must be"):
        decode_crop(small_jpeg, plan, out=np.zeros((64, 64, 3), np.float32))


def test_decode_rgb_is_the_full_image(small_jpeg):
    img = decode_rgb(small_jpeg)
    assert img.mode == "RGB" and img.size == (500, 375)
    assert np.array_equal(np.asarray(img), np.asarray(Image.open(io.BytesIO(small_jpeg))))


def sixteen_bit_png() -> bytes:
    grey = (np.asarray(photo(40, 30).convert("L")).astype(np.uint16) * 257).astype(np.uint16)
    img = Image.fromarray(grey)
    assert img.mode.startswith("I;16")
    return encode(img, "PNG")


SOURCES = {
    "grey JPEG": lambda: encode(photo(40, 30).convert("L")),
    "CMYK JPEG": lambda: encode(photo(40, 30).convert("CMYK")),
    "RGB PNG": lambda: encode(photo(40, 30), "PNG"),
    "RGBA PNG": lambda: encode(photo(40, 30).convert("RGBA"), "PNG"),
    "LA PNG": lambda: encode(photo(40, 30).convert("LA"), "PNG"),
    "palette PNG": lambda: encode(photo(40, 30).convert("P"), "PNG"),
    "1-bit PNG": lambda: encode(photo(40, 30).convert("1"), "PNG"),
    "16-bit grey PNG": sixteen_bit_png,
    "GIF": lambda: encode(photo(40, 30), "GIF"),
    "WebP": lambda: encode(photo(40, 30), "WEBP"),
}


@pytest.mark.parametrize("name", list(SOURCES))
def test_every_mode_gives_three_channel_uint8(name):
    data = SOURCES[name]()
    crop = decode_crop(data, TrainCrop(24).sample(40, 30, np.random.default_rng(0)))
    assert crop.shape == (24, 24, 3) and crop.dtype == np.uint8
    full = decode_rgb(data)
    assert full.mode == "RGB" and full.size == (40, 30)


def test_sixteen_bit_grey_is_scaled_not_clipped():
    expected = np.asarray(photo(40, 30).convert("L"))
    got = np.asarray(decode_rgb(sixteen_bit_png()))
    assert np.array_equal(got[..., 0], expected) and np.array_equal(got[..., 2], expected)


def test_grey_jpeg_keeps_its_grey_levels():
    data = encode(photo(40, 30).convert("L"))
    crop = decode_crop(data, EvalCrop(16).sample(40, 30))
    assert np.array_equal(crop[..., 0], crop[..., 1]) and np.array_equal(crop[..., 1], crop[..., 2])


def corrupt_inputs(jpeg: bytes) -> dict[str, bytes]:
    png = encode(photo(64, 48), "PNG")
    return {
        "empty": b"",
        "text": b"this is not an image, it is a note about one\n" * 4,
        "half a JPEG": jpeg[: len(jpeg) // 2],
        "JPEG without its last bytes": jpeg[:-200],
        "JPEG header only": jpeg[:600],
        "half a PNG": png[: len(png) // 2],
        "JPEG with a zeroed body": jpeg[:700] + bytes(len(jpeg) - 700),
    }


@pytest.mark.parametrize("case", list(corrupt_inputs(b"\xff" * 2000)))
def test_corrupt_bytes_raise_corrupt_record_error(small_jpeg, case):
    data = corrupt_inputs(small_jpeg)[case]
    plan = EvalCrop(32).sample(500, 375)
    with pytest.raises(CorruptRecordError, match=r"^shard-0003 record 17: ") as info:
        decode_crop(data, plan, where="shard-0003 record 17")
    assert isinstance(info.value, ValueError)
    with pytest.raises(CorruptRecordError):
        decode_rgb(data)


def test_messages_without_where_name_the_record_size():
    with pytest.raises(CorruptRecordError, match=r"^5-byte record: not a readable image"):
        decode_rgb(b"hello")


def test_pixel_limit_is_checked_before_decoding(small_jpeg):
    with pytest.raises(CorruptRecordError, match="187500 pixels is over the limit of 100000"):
        decode_crop(small_jpeg, EvalCrop(32).sample(500, 375), max_pixels=100_000)
    with pytest.raises(CorruptRecordError, match="limit"):
        image_size(small_jpeg, max_pixels=100_000)
    assert decode_rgb(small_jpeg, max_pixels=187_500).size == (500, 375)


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares its size and holds almost no pixel data."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + body))
        return struct.pack(">I", len(body)) + kind + body + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64))


def test_decompression_bomb_is_refused_from_its_header():
    assert 30_000 * 30_000 > MAX_PIXELS
    with pytest.raises(CorruptRecordError, match="decompression bomb|refused by Pillow"):
        decode_rgb(png_header(30_000, 30_000))
    with pytest.raises(CorruptRecordError, match="over the limit"):
        decode_rgb(png_header(5_000, 5_000), max_pixels=1_000_000)


def test_thread_decoder_runs_every_sample_and_raises_the_lowest_failure():
    decoder = ThreadDecoder(2)
    ran: list[tuple[int, str]] = []

    def one(k: int) -> None:
        ran.append((k, threading.current_thread().name))
        if k in (7, 3):
            raise ValueError(f"sample {k}")

    for _ in range(3):  # the pool is kept between batches
        ran.clear()
        with pytest.raises(ValueError, match="sample 3"):
            decoder.map(one, 10)
        assert sorted(k for k, _ in ran) == list(range(10))
        assert all(name.startswith("fastload-decode") for _, name in ran)
