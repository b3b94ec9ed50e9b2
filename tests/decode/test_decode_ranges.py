"""Read-time ranges: every decode failure of a record is that record's CorruptRecordError (so
on_error="skip" skips and counts it), and the dataset's max_pixels is the one pixel limit."""

from __future__ import annotations

import io
import math
import threading

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.converters import pack
from fastload.decode.crops import decode_crop
from fastload.decode.images import decode_rgb, image_size, pixel_limit
from fastload.errors import CorruptRecordError, SkippedRecordWarning
from fastload.format import file_digest, read_manifest
from fastload.decode.transforms import CropPlan
from tests.conftest import load_manifest_json, make_png, save_manifest_json, write_tree
from tests.reliability.test_hostile import png_header


@pytest.fixture(autouse=True)
def pillow_limit(monkeypatch):
    """Pillow's process-wide limit at its default, put back after each test (a large max_pixels
    raises it for the rest of the process)."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 89_478_485)


def tiny_png(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (width, height), (200, 40, 90)).save(buf, "PNG")
    return buf.getvalue()


# --- max_pixels: a whole number, 5e8 included, like pack's ------------------------------------------

@pytest.mark.parametrize("value, expected", [(5e8, 500_000_000), (np.int64(7), 7), (1.0, 1), (12, 12)])
def test_max_pixels_accepts_whole_numbers_given_as_floats(value, expected):
    assert pixel_limit(value) == expected and type(pixel_limit(value)) is int


@pytest.mark.parametrize("value", [0, -3, 1.5, math.nan, math.inf, "5e8", True, None])
def test_max_pixels_refuses_anything_else_naming_the_value(value):
    with pytest.raises(ValueError, match=rf"^max_pixels={value!r}: must be a positive integer \(a whole number"):
        pixel_limit(value)


# --- Pillow's process-wide limit never overrides max_pixels ------------------------------------------

@pytest.fixture
def pngs(tmp_path):
    """A dataset of two 64x48 PNGs (3072 pixels each; PNG always goes through Pillow)."""
    write_tree(tmp_path / "src", {"a/0.png": make_png(seed=1), "a/1.png": make_png(seed=2)})
    pack(tmp_path / "src", tmp_path / "ds", progress=False)
    return tmp_path / "ds"


@pytest.mark.parametrize("image_size", [None, 16])
def test_the_dataset_limit_not_pillows_decides(pngs, monkeypatch, image_size):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # Pillow refuses over 2000 pixels
    ds = fastload.PackedDataset(pngs, image_size=image_size, train=True, max_pixels=1e4)
    assert ds.max_pixels == 10_000
    image, _ = ds[0]
    assert (image.size if image_size is None else tuple(image.shape)) == ((64, 48) if image_size is None
                                                                         else (3, 16, 16))
    assert Image.MAX_IMAGE_PIXELS == 5000  # raised to half the limit, as Pillow's own default is
    # Raised, never lowered: a smaller limit is applied by fastload itself.
    small = fastload.PackedDataset(pngs, image_size=image_size, train=True, max_pixels=3000)
    with pytest.raises(CorruptRecordError, match=r"record 1 \(a/1.png\): 64x48 = 3072 pixels is over the "
                                                 r"limit of 3000 \(possible decompression bomb\)"):
        small[1]
    assert Image.MAX_IMAGE_PIXELS == 5000


def test_image_size_reads_headers_up_to_max_pixels_past_pillows_default():
    header_only = png_header(20_000, 10_000)  # 2e8 pixels: over Pillow's default 1.79e8
    assert image_size(header_only, max_pixels=5e8) == (20_000, 10_000)
    assert Image.MAX_IMAGE_PIXELS == 250_000_000 and type(Image.MAX_IMAGE_PIXELS) is int
    for width, height in ((25_000, 20_001), (40_000, 50_000)):  # just over the limit, and far over
        with pytest.raises(CorruptRecordError, match=r"^69-byte record: .*over the limit of 500000000 .*"
                                                     r"raise max_pixels if you trust this data$"):
            image_size(png_header(width, height), max_pixels=500_000_000)


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_threads_with_different_limits_each_get_their_own(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    data = make_png(seed=3)  # 3072 pixels
    results: dict[int, object] = {}

    def read(limit: int) -> None:
        for _ in range(20):
            try:
                results[limit] = image_size(data, max_pixels=limit)
            except CorruptRecordError as exc:
                results[limit] = exc

    threads = [threading.Thread(target=read, args=(limit,)) for limit in (3000, 4000, 100_000, 2500)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[4000] == results[100_000] == (64, 48)
    assert isinstance(results[3000], CorruptRecordError) and isinstance(results[2500], CorruptRecordError)
    assert Image.MAX_IMAGE_PIXELS == 50_000


# --- every decode failure is the record's error --------------------------------------------------------

@pytest.mark.parametrize("box", [(0, 0, 0, 0), (16, 0, 1, 12), (0, 12, 16, 1)])
def test_a_crop_the_image_cannot_give_is_a_record_error(box):
    data = make_png(16, 12)
    for crop_first in (True, False):
        with pytest.raises(CorruptRecordError, match=r"^shard-00001 record 9 \(x.png\): "):
            decode_crop(data, CropPlan(box, (4, 4), False, crop_first), where="shard-00001 record 9 (x.png)")


def test_a_caller_mistake_is_still_a_value_error():
    with pytest.raises(ValueError, match="out must be a uint8 array") as err:
        decode_crop(make_png(16, 12), CropPlan((0, 0, 16, 12), (4, 4), False, False),
                    out=np.empty((5, 4, 3), np.uint8))
    assert not isinstance(err.value, CorruptRecordError)


def test_sizes_under_1x1_are_record_errors():
    from fastload.decode.images import check_pixels

    for width, height in ((0, 5), (5, 0), (-1, 3)):
        with pytest.raises(CorruptRecordError, match=rf"^rec 3: the image is {width}x{height} pixels; an image "
                                                     r"is at least 1x1"):
            check_pixels(width, height, where="rec 3", max_pixels=100)
    assert decode_rgb(tiny_png(1, 1)).size == (1, 1)


def _set_index_size(dataset, record: int, width: int, height: int) -> None:
    """Rewrite record ``record``'s width and height in the index, digests made to match."""
    manifest = read_manifest(dataset)
    raw = load_manifest_json(dataset)
    for column, value in (("width", width), ("height", height)):
        path = dataset / manifest.index[column].file
        array = np.load(path).copy()
        array[record] = value
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        path.write_bytes(buf.getvalue())
        raw["index"][column]["digest"] = file_digest(buf.getvalue())
    save_manifest_json(dataset, raw)


def test_skip_skips_and_counts_a_record_whose_crop_falls_off_the_image(tmp_path):
    """A 1x1 PNG whose index says 2x1: some train crops start at x=1, past the pixel. That used to
    fail the whole batch with a bare ValueError from the resize, whatever on_error said."""
    write_tree(tmp_path / "src", {"a/0.png": tiny_png(1, 1), "a/1.png": make_png(8, 8, seed=2)})
    pack(tmp_path / "src", tmp_path / "ds", progress=False)
    _set_index_size(tmp_path / "ds", 0, 2, 1)
    ds = fastload.PackedDataset(tmp_path / "ds", image_size=4, train=True, on_error="skip", decode_threads=1)
    seed = next(s for s in range(1000) if ds.pipeline.plan(0, 0, s, 2, 1).box[0] >= 1)
    with pytest.warns(SkippedRecordWarning, match=r"record 0 \(a/0.png\): the PNG is 1x1, too small"):
        batch = ds.__getitems__([(0, 0, seed), (1, 0, seed)])
    assert batch.skipped == 1 and ds.skipped == 1 and batch.labels.tolist() == [0]
    with pytest.raises(CorruptRecordError, match=r"record 0 \(a/0.png\)"):
        fastload.PackedDataset(tmp_path / "ds", image_size=4, train=True).__getitems__([(0, 0, seed)])
