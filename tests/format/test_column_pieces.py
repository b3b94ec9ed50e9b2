"""A column written piece by piece (a Ray pack's finalize) is the file, digest and manifest entry
``write_columns`` gives for the joined column; pieces that do not add up to the length are refused."""

from __future__ import annotations

import numpy as np
import pytest

from fastload.format import write_column_pieces, write_columns


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8", "float64", "uint64"])
def test_pieces_write_the_bytes_of_the_joined_column(tmp_path, dtype):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    rng = np.random.default_rng(3)
    pieces = [(rng.random(n) * 200).astype(dtype) for n in (5, 0, 1, 70_000, 3)]
    joined = write_columns(tmp_path / "a", {"col": np.concatenate(pieces)})["col"]
    streamed = write_column_pieces(tmp_path / "b", "col", np.dtype(dtype), sum(map(len, pieces)), iter(pieces))
    assert streamed == joined
    assert (tmp_path / "a" / joined.file).read_bytes() == (tmp_path / "b" / streamed.file).read_bytes()
    assert np.array_equal(np.load(tmp_path / "b" / streamed.file), np.concatenate(pieces))


def test_pieces_short_of_the_length_are_refused_and_leave_no_file(tmp_path):
    with pytest.raises(ValueError, match="index/col.npy: pieces hold 16 bytes, not the 3 values"):
        write_column_pieces(tmp_path, "col", np.dtype("int64"), 3, [np.arange(2)])
    assert not (tmp_path / "index" / "col.npy").exists() and not list((tmp_path / "index").glob("*.tmp"))
