"""Timed loader runs: iterate a loader for a bounded time, count what arrives, keep partial results.

Every contender of ``fastload bench`` (and the loader ``fastload doctor`` diagnoses) goes through
``timed_run``: a few untimed warm-up batches (worker start, thread pools, first file opens), then
batches until ``duration`` seconds or ``samples`` samples, re-iterating the loader for another
epoch when it ends (never with a cold cache: a second pass would be warm). Time spent inside
``next()`` is the data wait; an optional model step runs after each batch. ``run_all`` runs a
series of contenders, ``repeats`` times interleaved (A, B, C, A, B, C, ...), so a burst of load
from elsewhere hits one repeat of every row, not every repeat of one; :mod:`.repeats` turns a
row's repeats into its median and range.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from fastload.benchmark.monitor import MemoryPeak, Progress
from fastload.benchmark.repeats import combine
from fastload.benchmark.result import RunKind, RunResult, Status
from fastload.loading.stats import batch_size_of

__all__ = ["Limits", "ModelStep", "RunKind", "RunResult", "RunSpec", "Status", "run_all", "timed_run"]

ModelStep = Callable[[Any], None] | float | None
"""A training step run after each decoded batch: seconds to sleep (a stand-in: a GPU step leaves
the CPU free), or a callable given the batch (a :class:`~.training.TrainStep` runs a real one)."""


@dataclass(frozen=True)
class Limits:
    """How long one run lasts: ``duration`` timed seconds, at most ``samples`` samples, after
    ``warmup`` untimed batches; ``one_epoch`` stops at the end of the data (cold cache runs)."""

    duration: float = 5.0
    samples: int | None = None
    warmup: int = 2
    one_epoch: bool = False


@dataclass
class RunSpec:
    """One contender: how to build its loader (an iterable of batches), and what to call it."""

    name: str
    kind: RunKind
    source: str  # "folder", "lmdb", "hdf5"
    make: Callable[[], Iterable[Any]]
    settings: Callable[[Any], str] | str = ""  # from the built loader, or fixed text
    bytes_per_sample: float = 0.0  # mean record size: MB/s of a pipeline run
    batch_bytes: Callable[[Any], int] | None = None  # exact bytes of a raw-read batch
    prepare: Callable[[], None] | None = None  # before building (drop the page cache)


def run_model_step(step: ModelStep, batch: Any) -> None:
    if callable(step):
        step(batch)
    elif step:
        time.sleep(step)


def timed_run(spec: RunSpec, limits: Limits, *, model_step: ModelStep = None,
              progress: Progress | None = None, into: RunResult | None = None) -> RunResult:
    """Build and time one contender, filling ``into`` (or a new result) as it goes.

    KeyboardInterrupt propagates after the result holds what was measured (status ``partial``):
    ``run_all`` catches it and keeps the result.
    """
    result = into if into is not None else RunResult(spec.name, spec.kind, spec.source)
    try:
        if spec.prepare is not None:
            spec.prepare()
        loader = spec.make()
        result.settings = spec.settings(loader) if callable(spec.settings) else spec.settings
    except KeyboardInterrupt:
        result.status, result.note = "skipped", "interrupted before it started"
        raise
    except Exception as exc:  # a backend that is not there, a dataset that cannot open
        result.status, result.note = "skipped", f"{type(exc).__name__}: {exc}"
        return result
    memory = MemoryPeak()
    clock = _Clock(_fit_warmup(limits, loader))
    clock.stepping = bool(model_step)
    nbytes = 0
    try:
        while not clock.done():
            started = time.perf_counter()
            it = iter(loader)  # a new epoch: workers restart, the loop waits for it too
            clock.waited(time.perf_counter() - started)
            got_any = False
            for batch in _timed(it, clock):
                got_any = True
                if clock.timing:
                    n = batch_size_of(batch)
                    nbytes += spec.batch_bytes(batch) if spec.batch_bytes else int(n * spec.bytes_per_sample)
                    clock.count(n)
                started = time.perf_counter()
                run_model_step(model_step, batch)
                clock.step_done(time.perf_counter() - started)
                memory.sample()
                if progress is not None:
                    progress.update(spec.name, clock)
                if clock.done():
                    break
            del it
            if not got_any or limits.one_epoch:
                break
    except KeyboardInterrupt:
        _fill(result, clock, nbytes, memory, "partial", "interrupted")
        raise
    except Exception as exc:
        _fill(result, clock, nbytes, memory, "failed", f"{type(exc).__name__}: {exc}")
        return result
    finally:
        result.loader = loader
    note = None if clock.samples else "no batch after the warm-up: too few records for this run"
    _fill(result, clock, nbytes, memory, "ok" if clock.samples else "failed", note)
    return result


def run_all(specs: Iterable[RunSpec], limits: Limits | Callable[[RunSpec], Limits], *,
            model_step: ModelStep = None, progress: Progress | None = None,
            keep_loaders: bool = False, repeats: int = 1) -> tuple[list[RunResult], bool]:
    """Run each contender in turn, ``repeats`` times interleaved; Ctrl-C stops the series and
    keeps every result so far. A contender that was skipped or failed is not run again.

    Returns one result per contender that started (its repeats combined: median and range) and
    whether the series was interrupted.
    """
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: must be at least 1")
    specs = list(specs)
    done: list[list[RunResult]] = [[] for _ in specs]
    interrupted = False
    for rep in range(repeats):
        for k, spec in enumerate(specs):
            if done[k] and done[k][-1].status in ("skipped", "failed"):
                continue
            if progress is not None:
                name = spec.name + (f" (repeat {rep + 1}/{repeats})" if repeats > 1 else "")
                progress.start(name, rep * len(specs) + k, repeats * len(specs))
            if keep_loaders and done[k]:  # only the last repeat's loader is kept: shut the one before down
                done[k][-1].loader = None
                gc.collect()
            result = RunResult(spec.name, spec.kind, spec.source, status="partial", note="interrupted")
            done[k].append(result)
            try:  # raw reads yield payload sizes, not images: no step runs on them
                timed_run(spec, limits(spec) if callable(limits) else limits,
                          model_step=None if spec.kind == "raw" else model_step, progress=progress, into=result)
            except KeyboardInterrupt:
                interrupted = True
            finally:
                if not keep_loaders:
                    result.loader = None  # shut workers down, close shards before the next run
                gc.collect()
            if interrupted:
                break
        if interrupted:
            break
    if progress is not None:
        progress.finish()
    return [combine(results) for results in done if results], interrupted


def _fit_warmup(limits: Limits, loader: Any) -> Limits:
    """A one-pass run over a short epoch keeps half of it for timing (the first batch still warms
    up: it carries worker start-up)."""
    try:
        batches = len(loader)
    except TypeError:
        return limits
    if not limits.one_epoch or batches > 2 * limits.warmup:
        return limits
    return replace(limits, warmup=max(1, min(limits.warmup, (batches - 1) // 2)))


def _fill(result: RunResult, clock: _Clock, nbytes: int, memory: MemoryPeak, status: Status,
          note: str | None) -> None:
    result.status, result.note = status, note
    result.samples, result.batches, result.seconds = clock.samples, clock.batches, clock.elapsed()
    if result.seconds > 0:
        result.samples_per_s = result.samples / result.seconds
        result.mb_per_s = nbytes / 1e6 / result.seconds
        result.wait_fraction = min(1.0, clock.wait / result.seconds)
    if clock.stepping and clock.batches:
        result.step_ms = 1e3 * clock.stepped / clock.batches
    if result.samples and result.seconds > 0:
        result.median = result.min = result.max = result.samples_per_s
        result.per_repeat, result.per_repeat_mb_s = [result.samples_per_s], [result.mb_per_s]
    result.peak_rss_mb = memory.peak_mb


def _timed(it: Any, clock: _Clock) -> Iterable[Any]:
    """The batches of ``it``, with the time spent waiting in ``next()`` charged to the clock."""
    while True:
        started = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            clock.waited(time.perf_counter() - started)
            return
        clock.waited(time.perf_counter() - started)
        yield batch


class _Clock:
    """Warm-up, then the timed part: samples, batches, data wait, and when to stop."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.warmup_left = limits.warmup
        self.t0: float | None = None if limits.warmup else time.perf_counter()
        self.last: float | None = self.t0
        self.samples = self.batches = 0
        self.wait = self.stepped = 0.0
        self.stepping = False  # a model step ran: stepped is its time

    @property
    def timing(self) -> bool:
        return self.warmup_left == 0

    def waited(self, seconds: float) -> None:
        if self.timing:
            self.wait += seconds

    def count(self, n: int) -> None:
        self.samples += n
        self.batches += 1

    def step_done(self, step_seconds: float = 0.0) -> None:
        now = time.perf_counter()
        if self.timing:
            self.stepped += step_seconds
        if self.warmup_left:
            self.warmup_left -= 1
            if not self.warmup_left:
                self.t0 = now
        self.last = now

    def elapsed(self) -> float:
        return (self.last - self.t0) if self.t0 is not None and self.last is not None else 0.0

    def done(self) -> bool:
        if not self.timing:
            return False
        limits = self.limits
        return (self.elapsed() >= limits.duration
                or (limits.samples is not None and self.samples >= limits.samples))
