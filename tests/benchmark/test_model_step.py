"""The model's own ceiling: `bench`/`doctor` under a real training step (a tiny CPU net), its headspace
row, the verdict naming what bounds training, and every printed ratio saying what it is of."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from fastload.benchmark import bench, doctor, validate
from fastload.benchmark.report import BenchReport
from fastload.benchmark.runs import RunResult
from fastload.benchmark.training import TrainStep, measure_headspace, named_step, training_step
from fastload.benchmark.verdict import Evidence, diagnose
from tests.benchmark.test_cli_bench import flat, header, table_rows

QUICK = {"batch_size": 4, "image_size": 32, "duration": 0.3, "samples": 8, "stage_budget": 0.1, "repeats": 1,
         "progress": False}
CLI_QUICK = ["--batch-size", "4", "--image-size", "32", "--duration", "0.3", "--samples", "8", "--repeats", "1"]
BOUNDS = ("the model bounds training", "the loader bounds training")


class TinyNet(torch.nn.Module):
    """A conv, a pool and a linear layer: a training step of a millisecond on 32 px images."""

    def __init__(self, weights: object = None, num_classes: int = 10) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                        torch.nn.Flatten(), torch.nn.Linear(8, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def tiny_step() -> TrainStep:
    net = TinyNet()
    optimiser = torch.optim.SGD(net.parameters(), lr=0.01)

    def train(images: torch.Tensor, labels: torch.Tensor) -> None:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 32, 32)
        loss = torch.nn.functional.cross_entropy(net(images.float() / 255), labels % 10)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()

    return train


@pytest.fixture
def fake_torchvision(monkeypatch):
    """torchvision is not installed here (it is on the lent GPU machine): a stand-in with one model."""
    models = types.ModuleType("torchvision.models")

    def get_model_builder(name: str):
        if name != "tinynet":
            raise ValueError(f"Unknown model {name}")
        return TinyNet

    models.get_model_builder = get_model_builder
    models.list_models = lambda: ["tinynet"]
    package = types.ModuleType("torchvision")
    package.models = models
    monkeypatch.setitem(sys.modules, "torchvision", package)
    monkeypatch.setitem(sys.modules, "torchvision.models", models)


def test_bench_with_a_step_function_has_the_headspace_row_and_names_the_bound(photos, tmp_path):
    report = bench(photos("folder"), [photos("lmdb")], dali=False, torch_grid=[(1, 2)], step=tiny_step(), **QUICK)
    assert report.headspace is not None and report.headspace.device == "cpu" and report.headspace.steps >= 5
    assert report.headspace.samples_per_s > 0 and report.headspace.step_ms > 0
    text = report.table()
    rows = table_rows(text)
    assert next(iter(rows)).startswith("headspace: train") and "1.00x" in rows[next(iter(rows))]
    head = next(ln for ln in text.splitlines() if ln.startswith("run "))
    assert "data wait" in head and "step ms" in head and "× headspace" in head
    for r in report.runs:  # the step ran under every decoded row, never under raw reads
        assert (r.step_ms is not None) == (r.kind != "raw"), r
    assert "× headspace: a row's samples/s under the step over the step's own" in flat(text)
    assert report.verdict is not None and report.verdict.loader == "fastload lmdb"
    assert any(bound in report.verdict.reason for bound in BOUNDS), report.verdict.reason
    assert "data alone: no training step" not in text
    doc = json.loads(json.dumps(report.to_dict()))
    assert validate(doc) == [] and doc["headspace"]["samples_per_s"] > 0 and doc["config"]["model_step_callable"]
    from fastload.benchmark.plot import write_plot

    assert write_plot(report, tmp_path / "b.png").read_bytes().startswith(b"\x89PNG")


def test_doctor_with_a_step_function_weighs_it(photos):
    report = doctor(photos("lmdb"), step=tiny_step(), **QUICK)
    assert report.headspace is not None and report.runs[0].step_ms is not None
    assert report.verdict is not None and any(bound in report.verdict.reason for bound in BOUNDS)
    assert "headspace: train" in report.table() and validate(report.to_dict()) == []


def test_doctor_without_a_step_says_it_did_not_weigh_one(photos):
    report = doctor(photos("lmdb"), **QUICK)
    assert report.headspace is None
    assert "note: data alone: no training step was given" in flat(report.table())
    assert "--model NAME" in flat(report.table())


def test_bench_model_through_the_cli(cli, photos, fake_torchvision, tmp_path):
    out = tmp_path / "m.json"
    result = cli("bench", photos("lmdb"), *CLI_QUICK, "--no-dali", "--torch-workers", "1", "--model", "tinynet",
                 "--json", out)
    assert result.rc == 0, result.out + result.err
    assert "model step: tinynet (float32, cpu)" in header(result.out)
    rows = table_rows(result.out)
    assert "headspace: tinynet (float32, cpu)" in rows
    assert "\nverdict: " in result.out and any(bound in flat(result.out) for bound in BOUNDS)
    doc = json.loads(out.read_text())
    assert validate(doc) == [] and doc["config"]["model"] == "tinynet"
    assert doc["headspace"]["step"] == "tinynet (float32, cpu)" and doc["headspace"]["device"] == "cpu"


def test_a_model_without_torchvision_or_with_a_wrong_name_fails_clearly(cli, photos, monkeypatch, fake_torchvision):
    result = cli("bench", photos("lmdb"), *CLI_QUICK, "--model", "resnet9000")
    assert result.rc == 2
    assert "--model resnet9000: not a torchvision model name (e.g. " in result.err
    monkeypatch.setitem(sys.modules, "torchvision", None)  # importing it now raises ImportError
    monkeypatch.setitem(sys.modules, "torchvision.models", None)
    result = cli("doctor", photos("lmdb"), *CLI_QUICK[:-2], "--model", "resnet50")
    assert result.rc == 2
    assert "--model resnet50 (a torchvision model as the training step) needs the torchvision package" in result.err
    from fastload.benchmark.torchvision_install import torchvision_install

    assert f"install it: {torchvision_install(torch.__version__)} (" in result.err  # the one made for this torch


def test_one_training_step_at_a_time():
    with pytest.raises(ValueError, match="model and model_step were all given: pass one training step"):
        training_step("resnet50", None, 0.1)
    assert training_step(None, None, 0.25) == 0.25 and training_step(None, None, None) is None


def test_the_headspace_of_a_named_step_on_the_cpu(fake_torchvision):
    step = named_step("tinynet", "cpu")
    assert step.label == "tinynet (float32, cpu)" and step.device.type == "cpu"
    room = measure_headspace(step, 4, 32, duration=0.0, min_steps=3)
    assert room.steps == 3 and room.samples_per_s == pytest.approx(4e3 / room.step_ms)


# --- the verdict under a step ----------------------------------------------------------------------


def _stages():
    from tests.benchmark.test_verdict import stages

    return stages()


def test_a_loader_below_the_headspace_bounds_training_by_how_much():
    v = diagnose(Evidence(_stages(), cores=2, batch_size=64, loader_rate=100, wait_fraction=0.6,
                          model_step_s=0.1, headspace_rate=640))
    assert v.bottleneck == "cpu"
    assert v.reason.startswith("the loader bounds training: under the step the loop trains at 100 samples/s, "
                               "0.16x the step's headspace (640 samples/s) and waits for data 60% of the time; "
                               "a loader that kept up would train up to 6.4x faster")


def test_a_loop_that_barely_waits_is_bound_by_the_model_and_a_slowed_step_is_named():
    fair = diagnose(Evidence(_stages(), cores=2, batch_size=64, loader_rate=600, wait_fraction=0.02,
                             model_step_s=0.105, headspace_rate=640))
    assert fair.label == "model-bound" and fair.reason.startswith("the model bounds training")
    assert "0.94x the step's headspace (640 samples/s" in fair.reason
    slowed = diagnose(Evidence(_stages(), cores=2, batch_size=64, loader_rate=200, wait_fraction=0.02,
                               model_step_s=0.3, headspace_rate=640))
    assert slowed.label == "model-bound, the step slowed by the loader"
    assert "3.0x: they share the CPU" in slowed.reason and "slower beside the loader" in slowed.advice[0]


def test_gpu_decode_advice_is_nvimgcodec_where_it_imports():
    advice = " ".join(diagnose(Evidence(_stages(), cores=2, batch_size=64, cuda=True,
                                        nvimgcodec_installed=True)).advice)
    assert "backend='nvimgcodec', device='cuda'" in advice and "dali" not in advice


# --- issue 39 item 5: advice that misleads ---------------------------------------------------------


def test_stages_that_allow_less_than_the_loader_delivered_are_unsure():
    # decode + transform + collate on 2 cores, read alone: together about 394 samples/s
    v = diagnose(Evidence(_stages(), cores=2, batch_size=64, loader_rate=410.0))
    assert v.doubt is not None and v.doubt.startswith("unsure: timed alone, the stages together allow about 394")
    assert "delivered 410" in v.doubt and "timed alone, the stages allow about 394" in v.reason


def _paired(name: str, kind: str, rates: list[float]) -> RunResult:
    import statistics

    median = statistics.median(rates)
    return RunResult(name, kind, "folder" if kind == "baseline" else "lmdb", samples=100, batches=10, seconds=1.0,
                     samples_per_s=median, mb_per_s=median / 100, median=median, min=min(rates), max=max(rates),
                     per_repeat=rates, per_repeat_mb_s=[r / 100 for r in rates])


def test_every_ratio_says_what_it_is_of_and_a_contradicted_one_is_marked():
    config = {"source": "imgs", "packed": [], "batch_size": 8, "image_size": 32, "duration_s": 1.0,
              "samples": None, "cold": False, "model_step_ms": None, "model_step_callable": False, "repeats": 3}
    # the median is higher than torch's (300 against 160), yet run by run it lost twice
    runs = [_paired("torch tuned", "baseline", [160.0, 490.0, 100.0]),
            _paired("fastload lmdb", "fastload", [100.0, 300.0, 310.0])]
    report = BenchReport("bench", config, runs)
    report.compute_speedups()
    assert runs[1].speedup == pytest.approx(0.625)
    text = report.table()
    assert "0.62x?" in table_rows(text)["fastload lmdb"]
    assert ("× ref: a row's samples/s over those of 'torch tuned' (ref), run by run (each run's ratio to the "
            "same round's run of it), the median of those") in flat(text)
    assert "? fastload lmdb: its median samples/s is 1.88x 'torch tuned''s, its runs paired one by one 0.62x" in flat(text)


def test_a_step_takes_a_dict_batch_as_tune_does():
    """A dataset with fields= delivers dict batches: the step gets their image and label."""
    seen = []
    step = TrainStep(lambda images, labels: seen.append((tuple(images.shape), labels.tolist())), "fn",
                     torch.device("cpu"))
    step({"image": torch.zeros(2, 3, 4, 4, dtype=torch.uint8), "label": torch.tensor([1, 2]), "caption": ["a", "b"]})
    step((torch.zeros(1, 3, 4, 4, dtype=torch.uint8), torch.tensor([5])))
    assert seen == [((2, 3, 4, 4), [1, 2]), ((1, 3, 4, 4), [5])]
