"""What the verdict is drawn from: the stage timings, the loader's run and the machine's facts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from fastload.benchmark.capacity import StageLike


@dataclass(frozen=True)
class Evidence:
    """What the verdict is drawn from.

    Attributes:
        stages: per-stage seconds per sample on one thread (the median of its timing rounds; a
            stage's ``low`` and ``high``, when it has them, the fastest and slowest round), and
            how many the loader runs at once.
        cores: cores available to the loader.
        batch_size: samples per batch (turns a model step into samples/s).
        source: ``"folder"`` (small files) or ``"packed"`` (fastload shards).
        loader_rate: samples/s the loader delivered end to end (None: not run); under a step, the
            training loop's rate.
        wait_fraction: share of the loop's time spent waiting for data, measured with the step.
        model_step_s: the training step's time per batch in the loop (None: none given).
        headspace_rate: samples/s of the step alone on batches already on its device (None: not
            measured; a slept stand-in's is ``batch_size / model_step_s``).
        reduced_decode: the loader already decodes JPEGs at reduced scale.
        reduced_decode_s: seconds per sample of fastload's reduced-scale decode + crop on these
            images (None: not measured); advised only when faster than decode + transform now.
        pinned: the loader pins batches (None: no CUDA, transfer not measured).
        dali_installed: ``import nvidia.dali`` works here, so DALI advice needs no install hint.
        store_bound: the data is in an object store whose round trips (``"latency"``) or bytes
            (``"bandwidth"``) limit the reads (None: not in a store).
        store_latency_s, store_mb_s: one request's latency and the store's bandwidth here.
        cached: a dataset in a store is read through a node cache.
        dataset_bytes: the data's size (what a cache needs to hold it all).
        cache_limit: the bytes the node cache may hold (None: no cache, or not in a store).
        cuda: a CUDA device is here (GPU decode is advice only then).
        nvimgcodec_installed: nvImageCodec imports here: GPU decode is ``backend='nvimgcodec'``.
        pixel_cache: a packed dataset's ``(bytes its pixel cache would take, bytes free there, side)``.
        machine_busy: other processes took a share of the cores while this was measured
            (:class:`~.machine_load.MachineLoad`): a verdict is then a hint.
    """

    stages: Sequence[StageLike]
    cores: int
    batch_size: int
    source: Literal["folder", "packed"] = "folder"
    loader_rate: float | None = None
    wait_fraction: float | None = None
    model_step_s: float | None = None
    headspace_rate: float | None = None
    reduced_decode: bool = False
    reduced_decode_s: float | None = None
    pinned: bool | None = None
    dali_installed: bool = False
    store_bound: Literal["latency", "bandwidth"] | None = None
    store_latency_s: float | None = None
    store_mb_s: float | None = None
    cached: bool = True
    dataset_bytes: int | None = None
    cache_limit: int | None = None
    cuda: bool = False
    nvimgcodec_installed: bool = False
    pixel_cache: tuple[int, int, int] | None = None
    machine_busy: bool = False
