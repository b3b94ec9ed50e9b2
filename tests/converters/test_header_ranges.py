"""Every size a header gives is range-checked where it enters the pack: 1..2**31-1 each way (the
index stores int32), whatever the format, so a bad one is a skipped or refused file, never a crash
in finalize after every shard is written."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.converters import pack
from fastload.converters.packing.checks import MAX_SIDE, InvalidFile, check_image
from fastload.errors import SourceError
from fastload.format.layout import COLUMNS
from tests.conftest import make_jpeg, write_tree
from tests.reliability.test_hostile import png_header


@pytest.fixture(autouse=True)
def pillow_limit(monkeypatch):
    """Pillow's process-wide limit at its default, put back after each test (a large max_pixels
    raises it for the rest of the process)."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 89_478_485)


@pytest.mark.parametrize("width, height, name, value", [
    (2**31, 1, "width", 2**31),
    (2**32 - 1, 1, "width", 2**32 - 1),
    (1, 2**31, "height", 2**31),
    (0, 5, "width", 0),
    (5, 0, "height", 0),
    (2**31, 0, "width", 2**31),  # 2**31 x 0 = 0 pixels: under any max_pixels
])
def test_a_png_size_outside_int32_or_under_1_is_an_invalid_file(width, height, name, value):
    with pytest.raises(InvalidFile) as err:
        check_image(png_header(width, height), max_pixels=10**20)
    assert err.value.reason == f"PNG header says {name} {value}, outside 1..2147483647"


def test_the_largest_side_the_index_holds_is_accepted():
    assert MAX_SIDE == np.iinfo(COLUMNS["width"]).max == np.iinfo(COLUMNS["height"]).max
    header = check_image(png_header(MAX_SIDE, 1), max_pixels=10**20)
    assert (header.width, header.height) == (MAX_SIDE, 1)


def _tiff_with_width(width: int) -> bytes:
    """A real 2x2 TIFF whose ImageWidth tag is rewritten as a LONG holding ``width``."""
    buf = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buf, "TIFF")
    data = bytearray(buf.getvalue())
    ifd = struct.unpack_from("<I", data, 4)[0]
    for k in range(struct.unpack_from("<H", data, ifd)[0]):
        at = ifd + 2 + 12 * k
        if struct.unpack_from("<H", data, at)[0] == 256:  # ImageWidth
            struct.pack_into("<HHII", data, at, 256, 4, 1, width)
            return bytes(data)
    raise AssertionError("no ImageWidth tag")


def test_sizes_pillow_reads_are_checked_the_same_way():
    with pytest.raises(InvalidFile, match=r"^TIFF header says width 4294967295, outside 1\.\.2147483647$"):
        check_image(_tiff_with_width(2**32 - 1), max_pixels=10**20)


@pytest.mark.parametrize("size", [(2**31, 0), (0, 7)])
def test_pack_refuses_or_skips_the_file_instead_of_crashing_in_finalize(tmp_path, size):
    write_tree(tmp_path / "src", {"a.jpg": make_jpeg(seed=1), "bad.png": png_header(*size)})
    field, value = ("width", size[0]) if not 1 <= size[0] < 2**31 else ("height", size[1])
    reason = f"PNG header says {field} {value}, outside 1..2147483647"
    with pytest.raises(SourceError) as err:
        pack(tmp_path / "src", tmp_path / "failed", progress=False)
    bad = tmp_path / "src" / "bad.png"
    assert str(err.value) == f"{bad}: {reason}; fix or remove it, or pass --on-error skip"
    assert isinstance(err.value, ValueError)

    report = pack(tmp_path / "src", tmp_path / "ds", on_error="skip", max_pixels=10**12, progress=False)
    assert report.num_records == 1 and report.skipped == 1
    assert [(s.rel, s.reason) for s in report.skipped_files] == [("bad.png", reason)]
    ds = fastload.PackedDataset(tmp_path / "ds")
    assert len(ds) == 1 and ds.record(0)["path"] == "a.jpg"
