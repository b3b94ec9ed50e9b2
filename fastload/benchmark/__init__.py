"""Measuring loaders: ``fastload bench`` (side by side) and ``fastload doctor`` (which stage limits).

    resolve.py      SRC → an image folder (files that cannot be decoded left out, named) and
                    packed datasets of the same records; store_inputs.py: URLs among them
    inputs.py       what the rows run on, and the files of the baseline left out of it
    baseline.py     the ImageFolder + torch DataLoader baseline users have today
    contenders.py   each row's loader: torch defaults/tuned, raw reads, fastload, DALI
    training.py     the model step the rows run under (a torchvision model or your fn) and its
                    headspace: the step alone on a batch already on the device
    runs.py         timed runs: warm-up, bounded time, data wait, Ctrl-C keeps results
    repeats.py      a row's interleaved repeats → median, range, ratios paired repeat by repeat
    spread.py       the one rule for repeated measurements: ranges that overlap are no difference
    machine_load.py what else ran on our cores meanwhile (a busy machine makes numbers noisy)
    monitor.py      the progress line on stderr, peak memory of a run and its workers
    stages.py       each stage alone: read, decode, transform, collate
    ceilings.py     what the machine can do: decode per core × cores, memory copy, disk, host→GPU
    verdict.py      measurements → bottleneck, or "too noisy to say" (a pure function):
                    evidence.py its inputs, capacity.py the stage model, explain.py its
                    words, advice.py what to change
    report.py       the report structure and its JSON schema; text.py table; plot.py PNG
    judge.py        the loader under test (loader_under_test.py) run, its stages and the
                    machine's ceilings measured → the verdict
    suite.py        bench() and doctor(): the pipeline of the above

Imported on demand (by the CLI or the user), never by ``import fastload``.
"""

from fastload.benchmark.baseline import ImageFolderBaseline
from fastload.benchmark.report import SCHEMA, BenchReport, validate
from fastload.benchmark.runs import Limits, RunResult
from fastload.benchmark.stages import Stage
from fastload.benchmark.suite import bench, doctor
from fastload.benchmark.verdict import Evidence, Verdict, diagnose

__all__ = ["SCHEMA", "BenchReport", "Evidence", "ImageFolderBaseline", "Limits", "RunResult", "Stage",
           "Verdict", "bench", "diagnose", "doctor", "validate"]
