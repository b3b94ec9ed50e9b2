"""Timed runs: bounds, warm-up, failures, and Ctrl-C keeping what was measured."""

from __future__ import annotations

import pytest
import torch

from fastload.benchmark.runs import Limits, RunResult, RunSpec, run_all, timed_run


class Batches:
    """``count`` batches of ``size`` samples per epoch; optionally raises at batch ``fail_at``."""

    def __init__(self, count: int = 10, size: int = 4, fail_at: int | None = None) -> None:
        self.count, self.size, self.fail_at, self.epochs = count, size, fail_at, 0

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        self.epochs += 1
        for k in range(self.count):
            if k == self.fail_at:
                raise RuntimeError("disk on fire")
            yield torch.zeros(self.size, 3), torch.zeros(self.size)


def spec(loader, name: str = "row", **kw) -> RunSpec:
    return RunSpec(name, "baseline", "folder", lambda: loader, "settings text", 1000.0, **kw)


def test_samples_bound_the_run_and_the_warmup_is_not_counted():
    loader = Batches(count=10, size=4)
    r = timed_run(spec(loader), Limits(duration=60, samples=12, warmup=2))
    assert r.status == "ok" and r.note is None
    assert r.samples == 12 and r.batches == 3 and r.settings == "settings text"
    assert r.samples_per_s > 0 and r.mb_per_s == pytest.approx(r.samples_per_s * 1000 / 1e6)
    assert 0 <= r.wait_fraction <= 1


def test_a_run_goes_on_into_the_next_epoch_unless_one_epoch():
    loader = Batches(count=3, size=2)
    r = timed_run(spec(loader), Limits(duration=60, samples=10, warmup=1))
    assert r.samples == 10 and loader.epochs == 2  # 2 timed after the warm-up, then 3 more
    cold = Batches(count=3, size=2)
    r = timed_run(spec(cold), Limits(duration=60, samples=10, warmup=1, one_epoch=True))
    assert r.samples == 4 and cold.epochs == 1


def test_a_short_epoch_keeps_half_of_it_for_timing_when_one_pass():
    r = timed_run(spec(Batches(count=2, size=5)), Limits(duration=60, warmup=2, one_epoch=True))
    assert r.status == "ok" and r.samples == 5  # one warm-up batch, one timed


def test_too_little_data_fails_with_a_reason():
    r = timed_run(spec(Batches(count=1)), Limits(duration=60, warmup=2, one_epoch=True))
    assert r.status == "failed" and "too few records" in r.note


def test_a_loader_that_cannot_be_built_is_skipped_and_one_that_raises_failed():
    def cannot():
        raise ImportError("no DALI here")
    skipped = timed_run(RunSpec("dali", "dali", "lmdb", cannot), Limits(duration=1))
    assert skipped.status == "skipped" and skipped.note == "ImportError: no DALI here"
    failed = timed_run(spec(Batches(fail_at=5)), Limits(duration=60, warmup=1))
    assert failed.status == "failed" and failed.note == "RuntimeError: disk on fire"
    assert failed.samples == 16  # batches 1-4 were timed before the failure


def test_ctrl_c_keeps_the_partial_row_and_stops_the_series():
    seen = []

    def step(batch):
        seen.append(batch)
        if len(seen) == 5:
            raise KeyboardInterrupt

    specs = [spec(Batches(count=100), "first"), spec(Batches(count=100), "never")]
    results, interrupted = run_all(specs, Limits(duration=60, warmup=1), model_step=step)
    assert interrupted
    assert [r.name for r in results] == ["first"]
    assert results[0].status == "partial" and results[0].note == "interrupted"
    assert results[0].samples == 16 and results[0].samples_per_s > 0
    assert results[0].loader is None  # released


def test_ctrl_c_between_rows_keeps_the_finished_ones():
    def prepare():
        raise KeyboardInterrupt
    specs = [spec(Batches(), "done"), spec(Batches(), "cut", prepare=prepare)]
    results, interrupted = run_all(specs, Limits(duration=60, samples=8, warmup=1))
    assert interrupted and [r.status for r in results] == ["ok", "skipped"]
    assert results[1].note == "interrupted before it started"


def test_a_model_step_in_seconds_is_waited_and_the_wait_fraction_falls():
    r = timed_run(spec(Batches(count=20)), Limits(duration=60, samples=12, warmup=1), model_step=0.02)
    assert r.seconds >= 3 * 0.02 and r.wait_fraction < 0.5


def test_results_serialise_without_the_loader():
    r = RunResult("x", "raw", "lmdb", loader=object())
    assert "loader" not in r.as_dict() and r.as_dict()["name"] == "x"


def test_repeats_run_interleaved_and_each_row_shows_median_and_range():
    order = []

    class Logged(Batches):
        def __init__(self, name):
            super().__init__(count=10, size=4)
            self.name = name

        def __iter__(self):
            order.append(self.name)
            return super().__iter__()

    specs = [RunSpec(n, "baseline", "folder", lambda n=n: Logged(n), "", 1000.0) for n in ("A", "B", "C")]
    results, interrupted = run_all(specs, Limits(duration=60, samples=8, warmup=1), repeats=3)
    assert not interrupted and order == ["A", "B", "C"] * 3
    for r in results:
        assert r.status == "ok" and len(r.per_repeat) == 3 and r.samples == 24
        assert r.min <= r.median <= r.max and r.median == r.samples_per_s
        assert r.min == min(r.per_repeat) and r.max == max(r.per_repeat)


def test_a_row_that_cannot_start_is_not_retried_and_a_failure_in_any_repeat_shows():
    built = []

    def cannot():
        built.append(1)
        raise ImportError("no DALI here")

    flaky = iter([Batches(), Batches(fail_at=2), Batches()])
    specs = [RunSpec("dali", "dali", "lmdb", cannot), spec(None, "flaky")]
    specs[1].make = lambda: next(flaky)
    results, _ = run_all(specs, Limits(duration=60, samples=8, warmup=1), repeats=3)
    assert len(built) == 1 and results[0].status == "skipped"
    assert results[1].status == "failed" and results[1].note == "RuntimeError: disk on fire"


def test_paired_ratios_are_the_median_of_each_repeats_own_ratio():
    from fastload.benchmark.repeats import combine, paired_ratio

    def row(rates):
        return combine([RunResult("r", "fastload", "lmdb", samples=10, seconds=1.0, samples_per_s=x,
                                  mb_per_s=x / 10, median=x, min=x, max=x, per_repeat=[x], per_repeat_mb_s=[x / 10])
                        for x in rates])

    # the machine slowed down in repeat 2 for both rows: paired, the ratio stays 2
    fast, slow = row([200.0, 20.0, 220.0]), row([100.0, 10.0, 110.0])
    assert fast.median == 200.0 and (fast.min, fast.max) == (20.0, 220.0)
    assert paired_ratio(fast, slow) == pytest.approx(2.0)
    assert paired_ratio(fast, slow, "mb_per_s") == pytest.approx(2.0)


def test_a_raw_read_row_of_one_epoch_is_timed_over_that_pass_only():
    from fastload.benchmark.contenders import RawReads, raw_batch_bytes

    reads = RawReads(lambda indices: [bytes(i) for i in indices], 40, 4, threads=1, epochs=1)
    row = RunSpec("cold", "raw", "lmdb", lambda: reads, batch_bytes=raw_batch_bytes)
    result = timed_run(row, Limits(duration=30.0, warmup=2))
    # 10 batches, 2 of them warm-up: the run ends with the pass, never reading it again (warm)
    assert result.status == "ok" and result.samples == 32
    assert list(reads) == [] and reads.epoch == 1
