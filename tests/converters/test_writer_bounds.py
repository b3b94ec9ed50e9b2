"""The Writer bounds a field before it copies or encodes it (issue 37): an array's bytes against
``max_file_size`` by its ``nbytes`` (not after ``np.save`` has copied it and LMDB refused it), an
image or mask array against ``max_pixels`` by its shape (not after a minute of PNG encoding)."""

from __future__ import annotations

import numpy as np
import pytest

import fastload
from fastload.errors import SourceError
from tests.conftest import make_jpeg


def _write(out, samples, **options):
    with fastload.Writer(out, **options) as w:
        for s in samples:
            w.write(s)
    return w.report


def test_an_array_over_max_file_size_is_refused_by_its_nbytes(tmp_path):
    huge = np.broadcast_to(np.float64(1.5), (20_000, 20_000))  # 3.2 GB by its nbytes; one element in memory
    good = {"image": make_jpeg(8, 8), "depth": np.zeros((4, 4))}
    with pytest.raises(SourceError, match=r"sample 1 .*field 'depth' is a float64 array of shape \(20000, 20000\) "
                                          r"\(3200000000 bytes\), over the 1048576 limit \(max_file_size\)"):
        _write(tmp_path / "a.fl", [good, {"image": make_jpeg(8, 8), "depth": huge}], max_file_size="1MiB")
    report = _write(tmp_path / "b.fl", [good, {"image": make_jpeg(8, 8), "depth": np.zeros((1000, 1000))}],
                    max_file_size="1MiB", on_error="skip")
    assert report.num_records == 1 and report.skipped == 1


def test_bytes_over_max_file_size_are_refused(tmp_path):
    with pytest.raises(SourceError, match=r"field 'blob' holds 2048 bytes, over the 1024 limit"):
        _write(tmp_path / "a.fl", [{"image": make_jpeg(8, 8), "blob": bytes(2048)}], max_file_size=1024,
               fields={"blob": "file"})


@pytest.mark.parametrize("field", ["image", "mask"])
def test_an_image_array_over_max_pixels_is_refused_before_it_is_encoded(tmp_path, field):
    big = np.broadcast_to(np.uint8(7), (20_000, 20_000) if field == "mask" else (20_000, 20_000, 3))
    sample = {"image": big} if field == "image" else {"image": make_jpeg(8, 8), "mask": big}
    with pytest.raises(SourceError, match=rf"field '{field}' is 20000x20000, 400000000 pixels, over the 10000 limit "
                                          r"\(max_pixels; not encoded\)"):
        _write(tmp_path / "a.fl", [sample], max_pixels=10_000, **({"mask_storage": "file"} if field == "mask" else {}))
