"""--max-pixels is the one pixel bound of a pack: the header check, --check decode and --max-side
re-encoding all follow it (not Pillow's own process-wide limit), and a very thin image's rows count
toward it (decoding one costs memory per row, not only per pixel)."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from fastload.converters import pack
from fastload.errors import SourceError
from tests.conftest import make_jpeg, make_png, write_tree


def thin_png(height: int) -> bytes:
    """A 1-pixel-wide grey PNG ``height`` rows tall (a few hundred bytes for 100,000 rows)."""
    out = io.BytesIO()
    Image.new("L", (1, height), 90).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture
def pillow_limit_1000(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pillow's own bomb limit far below --max-pixels (as its default, 89 Mpx, is below a
    --max-pixels of 400 Mpx): a step that asks Pillow alone refuses a 100x100 image."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)


@pytest.mark.parametrize("options", [{"check": "decode"}, {"max_side": 50}, {"max_side": 50, "check": "decode"}])
def test_decode_and_reencode_follow_max_pixels_not_pillows_limit(pillow_limit_1000, options, tmp_path) -> None:
    write_tree(tmp_path / "src", {"a/0.png": make_png(100, 100), "a/1.jpg": make_jpeg(100, 100)})
    report = pack(tmp_path / "src", tmp_path / "out", max_pixels=50_000, progress=False, **options)
    assert report.num_records == 2


@pytest.mark.parametrize("options", [{}, {"check": "decode"}, {"max_side": 50}])
def test_a_very_thin_image_counts_its_rows(options, tmp_path) -> None:
    write_tree(tmp_path / "src", {"a/thin.png": thin_png(100_000), "a/ok.png": make_png(100, 100)})
    with pytest.raises(SourceError, match=r"a/thin.png: image too large: 1x100000 = 100000 pixels, which cost as much "
                                          r"to decode as 400000 \(a row counts as at least 4 pixels\), "
                                          r"exceeds the limit of 350000"):
        pack(tmp_path / "src", tmp_path / "out", max_pixels=350_000, progress=False, **options)
    report = pack(tmp_path / "src", tmp_path / "out2", max_pixels=400_000, progress=False, **options)
    assert report.num_records == 2
