"""JPEG/PNG structure walks: sizes agree with Pillow, every cut file is caught, garbage raises only BadHeader."""

from __future__ import annotations

import io

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image

from fastload.converters.packing.checks import InvalidFile, check_image
from fastload.converters.packing.headers import BadHeader, jpeg_header, png_header
from tests.conftest import make_image, make_jpeg, make_png


def _encode(img: Image.Image, fmt: str, **options: object) -> bytes:
    out = io.BytesIO()
    img.save(out, fmt, **options)
    return out.getvalue()


def _with_app1(jpeg: bytes, payload: bytes) -> bytes:
    """``jpeg`` with an APP1 (EXIF-style) segment holding ``payload`` right after SOI."""
    segment = b"\xff\xe1" + (len(payload) + 8).to_bytes(2, "big") + b"Exif\0\0" + payload
    return jpeg[:2] + segment + jpeg[2:]


JPEGS = {
    "baseline 4:2:0": lambda: make_jpeg(97, 61, seed=1),
    "progressive": lambda: _encode(make_image(80, 120, seed=2), "JPEG", progressive=True, quality=85),
    "grayscale": lambda: _encode(make_image(33, 17, seed=3).convert("L"), "JPEG"),
    "CMYK": lambda: _encode(make_image(40, 30, seed=4).convert("CMYK"), "JPEG"),
    "restart markers": lambda: _encode(make_image(64, 64, seed=5), "JPEG", restart_marker_blocks=1),
    "EXIF thumbnail": lambda: _with_app1(make_jpeg(70, 50, seed=6), make_jpeg(16, 12, seed=7)),
}


@pytest.mark.parametrize("case", JPEGS)
def test_jpeg_size_matches_pillow(case: str) -> None:
    data = JPEGS[case]()
    size = jpeg_header(data)
    assert (size.width, size.height) == Image.open(io.BytesIO(data)).size


@pytest.mark.parametrize("case", JPEGS)
def test_every_cut_of_a_jpeg_is_caught(case: str) -> None:
    data = JPEGS[case]()
    end = data.rindex(b"\xff\xd9") + 2
    for cut in range(2, end - 1):
        with pytest.raises(BadHeader):
            jpeg_header(data[:cut])


def test_a_cut_jpeg_with_an_intact_thumbnail_is_caught() -> None:
    # The thumbnail's own end-of-image marker survives the cut: a tail search would pass this file.
    data = _with_app1(make_jpeg(120, 90, seed=8), make_jpeg(16, 12, seed=9))
    with pytest.raises(InvalidFile, match="truncated JPEG"):
        check_image(data[: len(data) - 200])


def test_stray_bytes_between_segments_are_skipped_as_pillow_does() -> None:
    data = make_jpeg(50, 40, seed=12)
    first_end = 4 + int.from_bytes(data[4:6], "big")  # after SOI and the first segment (APP0)
    padded = data[:first_end] + b"\0\0\0" + data[first_end:]  # padding before the next marker
    assert Image.open(io.BytesIO(padded)).size == (50, 40)
    assert (check_image(padded).width, check_image(padded).height) == (50, 40)


def test_trailing_bytes_after_the_end_marker_are_allowed() -> None:
    data = make_jpeg(50, 40, seed=10) + b"\0trailer" * 1000  # 8 KB after EOI
    assert check_image(data).width == 50


def test_png_size_and_cuts() -> None:
    data = make_png(91, 37, seed=11)
    size = png_header(data)
    assert (size.width, size.height) == (91, 37)
    for cut in range(0, len(data) - 1):
        with pytest.raises(BadHeader):
            png_header(data[:cut])


def test_check_image_uses_pillow_for_other_formats() -> None:
    header = check_image(_encode(make_image(21, 13), "GIF"))
    assert (header.format, header.width, header.height) == ("GIF", 21, 13)


def test_decompression_bomb_is_refused_from_the_header() -> None:
    with pytest.raises(InvalidFile, match="decompression bomb guard"):
        check_image(make_jpeg(64, 48), max_pixels=64 * 48 - 1)


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=300))
@example(body=b"\xff\xff")  # cut inside fill bytes
@example(body=b"\xff")
def test_garbage_after_a_jpeg_start_raises_only_bad_header(body: bytes) -> None:
    try:
        jpeg_header(b"\xff\xd8" + body)
    except BadHeader:
        pass


@settings(max_examples=300, deadline=None)
@given(cut=st.integers(min_value=2), flip=st.integers(min_value=0), value=st.integers(0, 255))
def test_a_damaged_jpeg_raises_only_bad_header(cut: int, flip: int, value: int) -> None:
    data = bytearray(JPEGS["progressive"]())
    data[flip % len(data)] = value
    try:
        jpeg_header(bytes(data[: max(2, cut % (len(data) + 1))]))
    except BadHeader:
        pass
