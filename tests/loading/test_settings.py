"""Resolved settings, device delivery without CUDA, normalisation, stats and tune()."""

from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader as TorchLoader

import fastload
import fastload.loading.transfer
from fastload import LoaderSettings

from .helpers import ID_RECORDS, Numbers, RandomNumbers, Stream, epoch, ids_and_pixels

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
ARGUMENTS = ("num_workers", "prefetch_factor", "pin_memory")


def test_settings_are_frozen_with_a_reason_for_each_argument(id_packed, monkeypatch):
    monkeypatch.setenv("FASTLOAD_CPUS", "2")  # the cores of this machine and CI, whatever runs it
    loader = fastload.DataLoader(fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True), batch_size=8)
    settings = loader.settings
    assert isinstance(settings, LoaderSettings)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.num_workers = 3  # type: ignore[misc]
    for name in ARGUMENTS:
        assert settings.reasons[name].strip(), name
        assert f"{name}: {settings.reasons[name]}" in " ".join(str(settings).split())  # wrapped at 100
    assert max(len(line) for line in str(settings).splitlines()) <= 100
    # The built-in pipeline decodes in threads: no worker processes, a background prefetch thread.
    assert (settings.mode, settings.num_workers, settings.prefetch_factor) == ("threads", 0, None)
    assert settings.prefetch_batches >= 1
    assert (loader.num_workers, loader.prefetch_factor) == (0, None)  # what torch was given


@pytest.mark.parametrize("cores", [3, 4])
def test_above_two_cores_the_pipeline_decodes_in_worker_processes(id_packed, monkeypatch, cores):
    """Decode threads would hold the GIL the training loop's own thread needs (measured on a GPU
    machine): from 3 cores up, one worker process per core, with the same batches as threads."""
    path = id_packed("lmdb")
    monkeypatch.setenv("FASTLOAD_CPUS", "2")
    threads = fastload.DataLoader(fastload.PackedDataset(path, image_size=32, train=True), batch_size=8, seed=3)
    monkeypatch.setenv("FASTLOAD_CPUS", str(cores))
    loader = fastload.DataLoader(fastload.PackedDataset(path, image_size=32, train=True), batch_size=8, seed=3)
    settings = loader.settings
    assert (settings.mode, settings.num_workers, settings.prefetch_factor) == ("processes", cores, 2)
    assert "GIL" in settings.reasons["num_workers"] and f"({cores})" in settings.reasons["num_workers"]
    assert (loader.num_workers, threads.settings.mode) == (cores, "threads")
    if cores == 4:  # one real run of 4 worker processes: the same batches as the threads
        (ids, images), (want_ids, want) = ids_and_pixels(loader), ids_and_pixels(threads)
        assert ids == want_ids and all(torch.equal(a, b) for a, b in zip(images, want))


def test_a_dataset_of_your_own_gets_torchs_default():
    """Workers would pickle the dataset and its samples (under spawn or forkserver too), which
    torch's default never asks: an IterableDataset would also be read once per worker."""
    for dataset in (Stream(), Numbers(), torch.utils.data.TensorDataset(torch.arange(8))):
        loader = fastload.DataLoader(dataset, batch_size=2)
        assert (loader.settings.num_workers, loader.settings.mode) == (0, "main")
        assert "torch's default" in loader.settings.reasons["num_workers"]
        assert epoch(loader) == epoch(TorchLoader(dataset, batch_size=2))  # each item exactly once


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_explicit_values_are_kept():
    loader = fastload.DataLoader(Numbers(), batch_size=4, num_workers=3, prefetch_factor=5, pin_memory=False)
    settings = loader.settings
    assert (settings.num_workers, settings.prefetch_factor, settings.pin_memory, settings.mode) == \
        (3, 5, False, "processes")
    assert all(settings.reasons[name] == "given" for name in ARGUMENTS)
    assert (loader.num_workers, loader.prefetch_factor, loader.pin_memory) == (3, 5, False)
    given_zero = fastload.DataLoader(Numbers(), num_workers=0, pin_memory=True).settings
    assert (given_zero.num_workers, given_zero.mode, given_zero.pin_memory) == (0, "main", True)


@no_cuda
def test_pin_memory_is_off_without_cuda(id_packed):
    for dataset in (Numbers(), fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True)):
        for device in (None, "cpu"):
            settings = fastload.DataLoader(dataset, batch_size=4, device=device).settings
            assert settings.pin_memory is False
            assert "no CUDA" in settings.reasons["pin_memory"]


def test_on_a_cuda_machine_auto_pins_what_is_bound_for_the_gpu(id_packed, monkeypatch):
    """torch's default is pin_memory=False: a Dataset of your own keeps it (torch's own test
    test_pin_memory_with_only_device asserts a batch is not pinned with pin_memory_device alone);
    the built-in pipeline's images and anything given device='cuda' are pinned. Decided from
    torch.cuda.is_available() alone, so that is all this test sets."""
    from fastload.loading.settings import resolve_settings

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    packed = fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True)
    cases = [(Numbers(), None, False), (Numbers(), "cuda", True), (Numbers(), "cpu", False),
             (packed, None, True), (packed, "cpu", False)]
    for dataset, device, want in cases:
        settings = resolve_settings(dataset, batch_size=4, num_workers="auto", prefetch_factor="auto",
                                    pin_memory="auto", device=None if device is None else torch.device(device))
        assert settings.pin_memory is want, (type(dataset).__name__, device)
    assert "torch's default" in resolve_settings(Numbers(), batch_size=4, num_workers="auto", prefetch_factor="auto",
                                                 pin_memory="auto", device=None).reasons["pin_memory"]


def _outcome(make) -> tuple[str, str]:
    try:
        make()
    except Exception as exc:  # noqa: BLE001 - the point is to compare what each raises
        return type(exc).__name__, str(exc)
    return "ok", ""


@pytest.mark.parametrize("arguments", [
    {"num_workers": -1}, {"num_workers": "many"}, {"num_workers": 0, "prefetch_factor": 2},
    {"timeout": -1}, {"num_workers": 0, "persistent_workers": True},
    {"batch_size": 0}, {"batch_size": 2, "batch_sampler": [[0, 1]]}, {"shuffle": True, "sampler": [0, 1]},
    {"num_workers": 2, "prefetch_factor": -1},
])
def test_bad_torch_arguments_raise_what_torch_raises(arguments):
    """torch's arguments are judged by torch, with its exception types and messages."""
    theirs = _outcome(lambda: TorchLoader(Numbers(), **arguments))
    ours = _outcome(lambda: fastload.DataLoader(Numbers(), **arguments))
    assert theirs[0] != "ok" and ours == theirs


def test_the_loader_is_generic_like_torchs():
    typed = fastload.DataLoader[list[torch.Tensor]]
    assert typed.__origin__ is fastload.DataLoader
    loader: fastload.DataLoader[int] = fastload.DataLoader(Numbers(), batch_size=2)
    assert isinstance(loader, TorchLoader)


class _Counted(Numbers):
    """Counts __getitem__ calls per process."""

    calls: dict[int, int] = {}

    def __getitem__(self, i: int):
        import os

        _Counted.calls[os.getpid()] = _Counted.calls.get(os.getpid(), 0) + 1
        return super().__getitem__(i)


def test_auto_never_calls_the_dataset_in_the_parent():
    import os

    _Counted.calls.clear()
    loader = fastload.DataLoader(_Counted(), batch_size=4)
    assert _Counted.calls.get(os.getpid(), 0) == 0  # constructing read nothing (it read 17 before)
    workers = fastload.DataLoader(_Counted(), batch_size=4, num_workers=2)
    assert _Counted.calls.get(os.getpid(), 0) == 0
    assert epoch(workers) == epoch(loader) == epoch(TorchLoader(Numbers(), batch_size=4))


def test_auto_is_the_same_on_every_construction(id_packed):
    for dataset in (Numbers(), RandomNumbers(), Stream(), torch.utils.data.TensorDataset(torch.arange(8)),
                    fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True)):
        seen = {str(fastload.DataLoader(dataset, batch_size=4).settings) for _ in range(20)}
        assert len(seen) == 1, seen


def test_the_environment_overrides_auto(monkeypatch):
    monkeypatch.setenv("FASTLOAD_NUM_WORKERS", "1")
    settings = fastload.DataLoader(Numbers(), batch_size=2).settings
    assert (settings.mode, settings.num_workers) == ("processes", 1)
    assert "FASTLOAD_NUM_WORKERS=1" in settings.reasons["num_workers"]
    monkeypatch.setenv("FASTLOAD_NUM_WORKERS", "0")
    assert fastload.DataLoader(Numbers(), batch_size=2).settings.mode == "main"


def test_auto_defaults_leave_the_random_streams_alone():
    torch.manual_seed(5)
    state = torch.get_rng_state(), np.random.get_state()[1].copy()
    fastload.DataLoader(RandomNumbers(), batch_size=4)
    assert torch.equal(torch.get_rng_state(), state[0])
    assert np.array_equal(np.random.get_state()[1], state[1])
    # Deterministic samples: the same batches as torch's loader, with the workers auto chose.
    assert epoch(fastload.DataLoader(Numbers(), batch_size=4)) == epoch(TorchLoader(Numbers(), batch_size=4))


# --- device and normalisation ----------------------------------------------------------------------


@no_cuda
def test_cuda_without_cuda_warns_once_and_delivers_on_cpu(id_packed, monkeypatch):
    monkeypatch.setattr(fastload.loading.transfer, "_warned_no_cuda", False)
    ds = fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = fastload.DataLoader(ds, batch_size=8, device="cuda")
        again = fastload.DataLoader(ds, batch_size=8, device="cuda", mean=[0.5] * 3, std=[0.5] * 3)
    ours = [w for w in caught if "CUDA is not available" in str(w.message)]
    assert len(ours) == 1
    assert ours[0].filename == __file__  # points at the user's line, not into fastload
    images, labels = next(iter(loader))
    assert images.device.type == labels.device.type == "cpu" and images.dtype == torch.uint8
    images, _ = next(iter(again))
    assert images.device.type == "cpu" and images.dtype == torch.float32


@pytest.mark.parametrize("num_workers", [0, 2])
def test_mean_std_normalisation(id_packed, num_workers):
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    ds = fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True)
    plain = fastload.DataLoader(ds, batch_size=8, shuffle=True, num_workers=num_workers, seed=0)
    normed = fastload.DataLoader(ds, batch_size=8, shuffle=True, num_workers=num_workers, mean=mean, std=std,
                                 seed=0)
    raw_ids, raw = ids_and_pixels(plain)
    ids, got = ids_and_pixels(normed)
    assert ids == raw_ids  # same order and crops: only the normalisation differs
    m = torch.tensor(mean, dtype=torch.float64).view(3, 1, 1)
    s = torch.tensor(std, dtype=torch.float64).view(3, 1, 1)
    for x, y in zip(raw, got):
        assert y.dtype == torch.float32 and y.shape == x.shape
        torch.testing.assert_close(y.double(), (x.double() / 255 - m) / s, atol=1e-5, rtol=0)


def test_mean_without_std_is_refused():
    with pytest.raises(ValueError, match="mean and std"):
        fastload.DataLoader(Numbers(), mean=[0.5])
    with pytest.raises(ValueError, match="std"):
        fastload.DataLoader(Numbers(), mean=[0.5, 0.5], std=[0.5, 0.0])


# --- stats ----------------------------------------------------------------------------------------

STATS_KEYS = {"samples", "batches", "seconds", "samples_per_s", "mb_per_s", "wait_fraction", "skipped"}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stats_count_what_was_delivered(id_packed, num_workers):
    ds = fastload.PackedDataset(id_packed("hdf5"), image_size=32, train=True)
    loader = fastload.DataLoader(ds, batch_size=8, shuffle=True, num_workers=num_workers)
    assert loader.stats()["samples"] == 0 and loader.stats()["samples_per_s"] == 0
    for _ in range(2):
        for _ in loader:
            pass
    stats = loader.stats()
    assert set(stats) == STATS_KEYS
    assert (stats["samples"], stats["batches"], stats["skipped"]) == (2 * ID_RECORDS, 2 * 5, 0)
    assert stats["seconds"] > 0 and 0 <= stats["wait_fraction"] <= 1
    assert stats["samples_per_s"] == pytest.approx(stats["samples"] / stats["seconds"])
    payload = 2 * int(ds.index.size.sum())  # every record's stored bytes, twice
    assert stats["mb_per_s"] * stats["seconds"] * 1e6 == pytest.approx(payload)
    # reset=True: these figures once more, then counting starts again, also inside a running epoch
    assert loader.stats(reset=True)["samples"] == 2 * ID_RECORDS and loader.stats()["samples"] == 0
    it = iter(loader)
    next(it)
    loader.stats(reset=True)
    rest = sum(len(labels) for _, labels in it)
    assert loader.stats()["samples"] == rest == ID_RECORDS - 8


def test_stats_of_a_plain_dataset_count_samples_not_bytes():
    loader = fastload.DataLoader(Numbers(23), batch_size=4, num_workers=0)
    epoch(loader)
    stats = loader.stats()
    assert (stats["samples"], stats["batches"], stats["mb_per_s"]) == (23, 6, 0.0)


# --- tune -----------------------------------------------------------------------------------------


def measured_rates(best: LoaderSettings) -> dict[str, list[float]]:
    """tune's ``measured`` reason as ``{candidate: [median, slowest, fastest]}``."""
    entries = best.reasons["measured"].split("): ", 1)[1].split("; ")
    out = {}
    for entry in entries:
        name, numbers = entry.split(": ")
        out[name] = [float(x) for x in numbers.replace("(", "").replace(")", "").replace("–", " ").split()]
    return out


def test_tune_returns_settings_with_the_measured_grid(id_packed, monkeypatch):
    monkeypatch.setenv("FASTLOAD_CPUS", "2")  # the grid of this machine and CI, whatever runs it
    ds = fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True)
    best = fastload.tune(ds, batch_size=4, batches=2, repeats=2)
    assert isinstance(best, LoaderSettings)
    rates = measured_rates(best)
    assert best.reasons["measured"].startswith("samples/s, the median of 2 runs (slowest–fastest): ")
    assert len(rates) == 6  # main, auto (threads), then 1 and 2 workers x prefetch 2 and 4
    assert {"main/0w/pfNone", "threads/0w/pfNone", "processes/1w/pf4"} <= set(rates)
    assert all(r[0] > 0 and math.isfinite(r[0]) and (len(r) == 1 or r[1] <= r[0] <= r[2]) for r in rates.values())
    assert f"{best.mode}/{best.num_workers}w/pf{best.prefetch_factor}" in rates
    assert best.reasons["machine load"] and best.reasons["tune"]
    for name in ARGUMENTS:  # the winner keeps its own reasons too
        assert best.reasons[name]
    # Its values make a working loader that runs with them.
    loader = fastload.DataLoader(ds, batch_size=4, **best.as_kwargs())
    assert (loader.settings.mode, loader.settings.num_workers) == (best.mode, best.num_workers)
    assert sorted(ids_and_pixels(loader)[0]) == list(range(ID_RECORDS))
    assert "to use them: fastload.DataLoader(..., mode=" in str(best)


def test_tunes_grid_keeps_the_decode_threads_where_auto_is_processes(id_packed):
    from fastload.loading.tuner import default_candidates

    ds = fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True)
    threads = {"mode": "threads", "num_workers": 0}
    assert threads not in default_candidates(ds, 2)  # auto is the threads there
    grid = default_candidates(ds, 16)
    assert threads in grid and {"num_workers": "auto"} in grid and {"num_workers": 16, "prefetch_factor": 4} in grid
    assert threads not in default_candidates(Numbers(), 16)  # a Dataset of your own has no decode threads


@pytest.mark.parametrize("mode", ["main", "threads", "processes"])
def test_every_mode_can_be_asked_for_and_survives_a_rebuild_from_attributes(id_packed, mode):
    """What tune reports can be passed back, and Lightning, which rebuilds a loader from its
    attributes, gets the same mode: threads with num_workers=0 is no longer main."""
    from .test_rebuild import rebuild_like_lightning

    ds = fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True)
    loader = fastload.DataLoader(ds, batch_size=4, mode=mode, num_workers=2 if mode == "processes" else 0)
    rebuilt = rebuild_like_lightning(loader, loader.sampler)
    assert loader.settings.mode == rebuilt.settings.mode == mode
    assert loader.num_workers == rebuilt.num_workers == (2 if mode == "processes" else 0)
    assert sorted(ids_and_pixels(rebuilt)[0]) == list(range(ID_RECORDS))


def test_num_workers_0_alone_keeps_torchs_meaning_and_contradictions_are_refused(id_packed):
    ds = fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True)
    assert fastload.DataLoader(ds, num_workers=0).settings.mode == "main"
    with pytest.raises(ValueError, match="mode='threads' decodes in this process: num_workers must be 0"):
        fastload.DataLoader(ds, mode="threads", num_workers=2)
    with pytest.raises(ValueError, match="mode='processes' needs num_workers >= 1"):
        fastload.DataLoader(ds, mode="processes", num_workers=0)
    with pytest.raises(ValueError, match="mode='gpu': choose"):
        fastload.DataLoader(ds, mode="gpu")


def test_tune_with_given_candidates():
    best = fastload.tune(Numbers(40), batch_size=4, batches=3, repeats=1,
                         candidates=[{"num_workers": 0}, {"num_workers": 1}])
    assert list(measured_rates(best)) == ["main/0w/pfNone", "processes/1w/pf2"]
    assert best.num_workers in (0, 1)


def test_tune_measures_datasets_shorter_than_its_batches():
    # 10 samples in batches of 4: 3 batches per epoch, fewer than warm-up + 6 measured.
    best = fastload.tune(Numbers(10), batch_size=4, batches=6, repeats=1,
                         candidates=[{"num_workers": 0}, {"num_workers": 1}])
    rates = measured_rates(best)
    assert len(rates) == 2 and all(r[0] > 0 for r in rates.values())


def test_tune_leaves_the_batches_a_loader_holds_ready_out_of_its_measure():
    """After the warm-up batch a loader may hold workers x prefetch_factor batches made while
    it warmed up; they come at once and would inflate a deep queue's rate."""
    from fastload.loading.tuner import _measure

    taken = []

    class Batches:  # an epoch of 20 batches of 4, remembering how many were taken
        def __iter__(self):
            for k in range(20):
                taken.append(k)
                yield torch.zeros(4), torch.zeros(4, dtype=torch.int64)

    assert _measure(Batches(), batches=3, ahead=8) > 0
    assert len(taken) == 1 + 8 + 3


def test_tune_without_a_step_does_not_choose_main_and_says_what_chose_each_setting(id_packed, monkeypatch):
    """The reasons tune writes, on made-up rates and a quiet machine (the choice itself:
    tests/loading/test_tune_choice.py; beside a real CPU hog: tests/benchmark/test_busy_machine.py)."""
    from fastload.benchmark import machine_load
    from fastload.loading import tuner

    quiet = machine_load.MachineLoad(cores=2, seconds=1.0, others_cores=0.0, steal_cores=0.0, own_cores=1.0,
                                     load_average=0.1, machine_cores=2)
    monkeypatch.setattr(machine_load.LoadWatch, "stop", lambda self: quiet)
    rates = iter([900.0, 400.0, 500.0])  # main, threads, one worker: main fastest on data alone
    monkeypatch.setattr(tuner, "_measure", lambda loader, batches, ahead=0, step=None: next(rates))
    ds = fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True)
    grid = [{"num_workers": 0}, {"mode": "threads", "num_workers": 0}, {"num_workers": 1, "prefetch_factor": 2}]
    best = fastload.tune(ds, batch_size=4, batches=2, candidates=grid, repeats=1)
    assert (best.mode, best.num_workers) == ("processes", 1)
    assert best.reasons["num_workers"] == "1: chosen by tune" and best.reasons["prefetch_factor"] == "2: chosen by tune"
    assert ": given" not in str(best)  # nothing was given: tune chose
    assert best.reasons["training step"].startswith("2 timed batches per run, on data alone, no training "
                                                    "step given: mode='main' decodes between steps")
    assert best.reasons["machine load"].startswith("other processes used 0.0 of the 2 cores")
    rates = iter([900.0, 400.0, 500.0])
    weighed = fastload.tune(ds, batch_size=4, batches=2, candidates=grid, step=0.001, repeats=1)
    assert weighed.mode == "main" and "under a 1 ms stand-in step" in weighed.reasons["training step"]
    assert weighed.reasons["num_workers"] == "0: chosen by tune"


def test_tune_runs_the_step_after_each_batch(id_packed):
    seen = []
    best = fastload.tune(fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True), batch_size=4,
                         batches=2, candidates=[{"num_workers": 0}], repeats=2,
                         step=lambda images, labels: seen.append(len(labels)))
    assert seen == [4, 4, 4] * 2 and "under your training step" in best.reasons["training step"]


def test_a_timeout_makes_auto_choose_worker_processes(id_packed):
    # torch times out only worker processes (it refuses timeout > 0 with num_workers=0).
    ds = fastload.PackedDataset(id_packed("lmdb"), image_size=16, train=True)
    loader = fastload.DataLoader(ds, batch_size=4, timeout=60)
    assert loader.settings.mode == "processes" and loader.num_workers >= 1
    assert "timeout=60" in loader.settings.reasons["num_workers"]
    assert sorted(ids_and_pixels(loader)[0]) == list(range(ID_RECORDS))


def test_a_timeout_with_a_dataset_of_your_own_is_what_torch_makes_of_it():
    for dataset in (Stream(), Numbers()):
        theirs = _outcome(lambda: list(TorchLoader(dataset, batch_size=2, timeout=5)))
        assert theirs[0] != "ok" and _outcome(lambda: list(fastload.DataLoader(dataset, batch_size=2,
                                                                                timeout=5))) == theirs
