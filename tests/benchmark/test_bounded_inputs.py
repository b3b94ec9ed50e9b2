"""bench and doctor read a source file as the packer does: a file over ``--max-file-size``'s default
is left out and named, never read (an 8 GB sparse .jpg costs no memory and no disk)."""

from __future__ import annotations

import pytest

from tests.benchmark.conftest import photo_files
from tests.benchmark.test_cli_bench import BENCH, QUICK, flat
from tests.conftest import write_tree

HUGE = "c0/huge.jpg"


@pytest.fixture
def with_huge(tmp_path):
    """A small photo folder holding one sparse 8 GB .jpg."""
    src = tmp_path / "images"
    write_tree(src, photo_files(2))
    with open(src / HUGE, "wb") as f:
        f.truncate(8 * 10**9)
    return src


NOTE = f"skipped 1 file that cannot be decoded: {HUGE} (cannot be read (8000000000 bytes, over the limit of"


def test_doctor_leaves_out_a_file_over_the_size_bound_unread(cli, with_huge) -> None:
    result = cli("doctor", with_huge, *QUICK, "--num-workers", "1")
    assert result.rc == 0, result.out + result.err
    assert NOTE in flat(result.out)


def test_bench_leaves_out_a_file_over_the_size_bound_unread(cli, with_huge, tmp_path) -> None:
    result = cli("bench", with_huge, *BENCH, "--no-dali", "--torch-workers", "1", "--work", tmp_path)
    assert result.rc == 0, result.out + result.err
    assert NOTE in flat(result.out)
