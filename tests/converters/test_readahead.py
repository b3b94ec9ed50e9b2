"""Reading source files in order: kernel read-ahead and the ordered thread-pool map."""

from __future__ import annotations

import errno
from concurrent.futures import ThreadPoolExecutor

import pytest

from converters.readahead import map_in_order, read_in_order


@pytest.mark.parametrize("depth", [1, 3, 100])
def test_read_in_order_yields_every_file_or_its_error_in_place(tmp_path, depth):
    paths = []
    for i in range(10):
        path = tmp_path / f"f{i}"
        if i != 4:
            path.write_bytes(bytes([i]) * (i * 1000))  # f0 is empty
        paths.append(str(path))
    (tmp_path / "f7").unlink()
    (tmp_path / "f7").mkdir()  # opens, but reading it fails
    got = list(read_in_order(paths, depth))
    assert len(got) == 10
    for i, data in enumerate(got):
        if i == 4:
            assert isinstance(data, FileNotFoundError)
        elif i == 7:
            assert isinstance(data, OSError) and data.errno == errno.EISDIR
        else:
            assert data == bytes([i]) * (i * 1000)


def test_read_in_order_closes_files_read_ahead_when_abandoned(tmp_path):
    import os

    paths = [str(tmp_path / f"f{i}") for i in range(20)]
    for p in paths:
        open(p, "wb").write(b"x")
    before = len(os.listdir("/proc/self/fd"))
    reader = read_in_order(paths, depth=8)
    next(reader)
    assert len(os.listdir("/proc/self/fd")) > before
    reader.close()
    assert len(os.listdir("/proc/self/fd")) == before


def test_map_in_order_keeps_order_and_bounds_what_is_in_flight():
    started: list[int] = []

    def work(i: int) -> int:
        started.append(i)
        return i * i

    with ThreadPoolExecutor(4) as pool:
        results = []
        for r in map_in_order(pool, work, range(50), weight=lambda i: 10, max_items=8, max_weight=35):
            results.append(r)
            assert len(started) - len(results) <= 4  # at most 35 bytes of weight (4 items) ahead
    assert results == [i * i for i in range(50)]
