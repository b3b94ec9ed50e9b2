"""Decoded pixels are bounded at read time as at pack time: a record over the dataset's max_pixels,
a very thin one's rows counted, is a CorruptRecordError naming it, or under on_error="skip" a
counted skip; never a decode of hundreds of MB per image."""

from __future__ import annotations

import io

import pytest
from PIL import Image

import fastload
from fastload.converters import pack
from fastload.errors import CorruptRecordError, SkippedRecordWarning
from tests.conftest import make_png, write_tree


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """Three 40x30 PNGs and one 1 x 100,000 px PNG (packed under a generous --max-pixels)."""
    root = tmp_path_factory.mktemp("thin")
    thin = io.BytesIO()
    Image.new("L", (1, 100_000), 90).save(thin, format="PNG")
    write_tree(root / "src", {**{f"a/{i}.png": make_png(40, 30, seed=i) for i in range(3)},
                              "a/thin.png": thin.getvalue()})
    pack(root / "src", root / "out.fl", max_pixels=10**6, progress=False)
    return root / "out.fl"


def test_a_thin_record_costs_its_rows() -> None:
    from fastload.decode.images import decode_cost

    assert decode_cost(1, 100_000) == 400_000 and decode_cost(4000, 3000) == 12_000_000


def test_a_thin_record_over_the_bound_is_named(packed) -> None:
    ds = fastload.PackedDataset(packed, max_pixels=350_000)
    thin = [str(p) for p in ds.index.path].index("a/thin.png")
    with pytest.raises(CorruptRecordError, match=rf"record {thin} .*1x100000 = 100000 pixels, which cost as much "
                                                 r"to decode as 400000 \(a row counts as at least 4 pixels\), "
                                                 r"is over the limit of 350000"):
        ds[thin]
    assert ds[0][0].size == (40, 30)
    assert fastload.PackedDataset(packed, max_pixels=400_000)[thin][0].size == (1, 100_000)


@pytest.mark.parametrize("image_size", [None, 16])
def test_a_thin_record_is_a_counted_skip(packed, image_size) -> None:
    ds = fastload.PackedDataset(packed, max_pixels=350_000, on_error="skip", image_size=image_size, train=True)
    loader = fastload.DataLoader(ds, batch_size=4, collate_fn=list, num_workers=0)
    with pytest.warns(SkippedRecordWarning, match=r"thin\.png.*a row counts as"):
        (batch,) = list(loader)
    assert len(batch) == 3 and loader.stats()["skipped"] == 1
