"""A .npy header may claim any shape in a few bytes: its size is checked against the bytes present
before anything is allocated, at read (a CorruptRecordError that ``on_error="skip"`` counts) and at
pack (the record refused, or skipped and reported)."""

from __future__ import annotations

import io

import numpy as np
import pytest

import fastload
from fastload.converters import pack
from fastload.decode.files import decode_npy
from fastload.errors import CorruptRecordError, SkippedRecordWarning, SourceError
from fastload.samples.file_fields import decode_file_field
from tests.conftest import make_jpeg

HUGE = (100_000, 1_000_000)  # float64: 745 GiB claimed


def lying_npy(shape: tuple[int, ...] = HUGE, body: bytes = bytes(16)) -> bytes:
    """A .npy header claiming ``shape`` of float64, followed by only ``body``."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": "<f8", "fortran_order": False, "shape": shape})
    return out.getvalue() + body


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def test_a_header_claiming_more_than_the_file_holds_is_a_corrupt_record() -> None:
    with pytest.raises(CorruptRecordError, match=r"rec 3: its header claims an array of shape \(100000, 1000000\) "
                                                 r"and dtype float64 \(800000000000 bytes\), but 16 bytes follow"):
        decode_npy(lying_npy(), "rec 3")
    with pytest.raises(CorruptRecordError, match=r"rec 3: .*shape \(2, 2\).*32 bytes\), but 31 bytes follow"):
        decode_npy(npy(np.zeros((2, 2)))[:-1], "rec 3")
    with pytest.raises(CorruptRecordError, match=r"rec 4: its header claims a negative dimension"):
        decode_npy(lying_npy((-1, 4)), "rec 4")
    assert decode_npy(npy(np.arange(6.0).reshape(2, 3)), "ok").tolist() == [[0, 1, 2], [3, 4, 5]]


def test_a_file_field_claiming_a_huge_array_is_a_corrupt_record() -> None:
    with pytest.raises(CorruptRecordError, match=r"record 7 depth: its header claims an array of shape"):
        decode_file_field("npy", lying_npy(), None, where="record 7 depth", max_pixels=10**6)


def test_on_error_skip_counts_an_array_whose_header_lies(tmp_path) -> None:
    src = tmp_path / "arrays"
    src.mkdir()
    for i in range(4):
        (src / f"{i}.npy").write_bytes(npy(np.full(3, i, dtype=np.float64)))
    (src / "2.npy").write_bytes(lying_npy())
    pack(src, tmp_path / "a.fl", extensions=[".npy"], progress=False)
    ds = fastload.PackedDataset(tmp_path / "a.fl", decode="npy", on_error="skip")
    loader = fastload.DataLoader(ds, batch_size=4, collate_fn=list, num_workers=0)
    with pytest.warns(SkippedRecordWarning, match=r"2\.npy.*claims an array"):
        (batch,) = list(loader)
    assert sorted(int(x[0]) for x, _ in batch) == [0, 1, 3] and loader.stats()["skipped"] == 1


@pytest.fixture
def listed(tmp_path):
    """A CSV of 3 images with a ``depth`` .npy column; the second row's .npy header lies."""
    rows = ["path,label,depth"]
    for i in range(3):
        (tmp_path / f"{i}.jpg").write_bytes(make_jpeg(20, 10, seed=i))
        (tmp_path / f"{i}.npy").write_bytes(lying_npy() if i == 1 else npy(np.zeros((10, 20), np.float32)))
        rows.append(f"{i}.jpg,0,{i}.npy")
    (tmp_path / "list.csv").write_text("\n".join(rows) + "\n")
    return tmp_path / "list.csv"


def test_pack_refuses_or_skips_a_file_field_whose_header_lies(listed, tmp_path) -> None:
    with pytest.raises(SourceError, match=r"1\.jpg: its depth file 1\.npy: its header claims an array of shape "
                                          r"\(100000, 1000000\)"):
        pack(listed, tmp_path / "a.fl", file_columns=("depth",), progress=False)
    report = pack(listed, tmp_path / "b.fl", file_columns=("depth",), on_error="skip", progress=False)
    assert report.num_records == 2 and [s.rel for s in report.skipped_files] == ["1.jpg"]
