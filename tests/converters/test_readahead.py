"""Reading source files in order: kernel read-ahead and the ordered thread-pool map."""

from __future__ import annotations

import errno
from concurrent.futures import ThreadPoolExecutor

import pytest

from fastload.converters.packing.readahead import map_in_order, read_in_order


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
    got = list(read_in_order(paths, depth, limit=2**30))
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
    reader = read_in_order(paths, depth=8, limit=2**30)
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


@pytest.mark.timeout(20)
def test_read_in_order_refuses_fifos_devices_and_files_over_the_limit_without_reading_them(tmp_path):
    import os

    os.mkfifo(tmp_path / "fifo.jpg")  # opening it for reading would wait for a writer forever
    os.symlink("/dev/zero", tmp_path / "zero.jpg")  # reads without end
    with open(tmp_path / "sparse.jpg", "wb") as f:
        f.truncate(3 * 2**30)  # 3 GB on paper, no disk
    (tmp_path / "small.jpg").write_bytes(b"abc")
    paths = [str(tmp_path / n) for n in ("fifo.jpg", "zero.jpg", "sparse.jpg", "small.jpg")]
    got = list(read_in_order(paths, depth=4, limit=2**20))
    assert [type(g) for g in got[:3]] == [OSError] * 3
    assert got[0].strerror == "not a regular file (a FIFO)"
    assert got[1].strerror == "not a regular file (a character device)"
    assert got[2].strerror == f"{3 * 2**30} bytes, over the limit of {2**20} bytes"
    assert got[3] == b"abc"


def test_pixel_budget_bounds_pixels_in_flight_and_lets_an_oversized_image_run_alone():
    import threading
    import time

    from fastload.converters.packing.readahead import PixelBudget

    budget = PixelBudget(100)
    peak, now, lock = [0], [0], threading.Lock()

    def decode(pixels: int) -> None:
        with budget.hold(pixels):
            with lock:
                now[0] += pixels
                peak[0] = max(peak[0], now[0])
            time.sleep(0.005)
            with lock:
                now[0] -= pixels

    sizes = [40] * 12 + [250] + [30] * 6
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(decode, sizes))
    assert peak[0] == 250  # the oversized one ran alone; otherwise at most 100 at once
    budget_small = PixelBudget(100)
    seen = []

    def small(pixels: int) -> None:
        with budget_small.hold(pixels):
            seen.append(budget_small.in_flight)
            time.sleep(0.002)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(small, [40] * 16))
    assert max(seen) <= 80 and budget_small.in_flight == 0
