"""A pack's progress bar and its summary say the same rate, in a unit that shows it (issue 47 item 7:
a bar that ended on 3.94 MB/s beside a summary of 1 MB/s; small packs printed "0 MB/s")."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastload.converters.packing.report import PackReport, progress_bar


class Clock:
    """A clock the test moves: the bar's notion of now."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_bar_ends_on_the_average_rate_the_summary_gives(capsys):
    clock = Clock()
    bar = progress_bar(4_000_000, True)
    bar._time = clock  # tqdm reads its clock through this attribute
    bar.start_t = bar.last_print_t = clock.now
    for _ in range(10):  # slow reads first: 0.1 MB a second
        clock.now += 1.0
        bar.update(100_000)
    for _ in range(10):  # then the reads ahead drain in a burst: 30 MB/s
        clock.now += 0.01
        bar.update(300_000)
    shown = bar.format_dict
    rate = shown["rate"] if shown["rate"] is not None else shown["n"] / shown["elapsed"]
    bar.close()
    report = PackReport(out=Path("x.fl"), storage="lmdb", num_records=20, total_bytes=shown["n"],
                        elapsed_s=shown["elapsed"])
    assert rate == pytest.approx(4_000_000 / 10.1)  # the average, not the last burst's
    assert report.rate() == "396.04 KB/s" and report.mb_per_s * 1e6 == pytest.approx(rate)
    assert "396kB/s" in capsys.readouterr().err.replace("\r", "\n").splitlines()[-1].replace(" ", "")


@pytest.mark.parametrize(("nbytes", "seconds", "shown"), [(420_000, 1.0, "420.00 KB/s"), (25_320_000, 0.5, "50.64 MB/s"),
                                                         (3_000, 2.0, "1.50 KB/s")])
def test_a_small_packs_rate_is_never_zero(nbytes, seconds, shown):
    report = PackReport(out=Path("x.fl"), storage="lmdb", num_records=3, total_bytes=nbytes, elapsed_s=seconds)
    assert report.summary().endswith(f"; {seconds:.1f}s; {shown}") and "0 MB/s" not in report.summary()
