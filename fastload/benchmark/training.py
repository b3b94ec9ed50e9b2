"""The training step the loaders run under, and its headspace: the step's own rate on batches already on the device.

A step is a named torchvision model (forward, backward and an SGD step; bf16 autocast and
channels-last on CUDA, plain float32 on the CPU) or your ``fn(images, labels)``. Under a step,
each loader's batch goes to the step's device, the step runs and the device is synchronised, so
the loop's time splits into waiting for data (inside ``next()``) and the step.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from fastload.loading.tuner import images_and_labels
from fastload.optional import require

StepFn = Callable[[torch.Tensor, torch.Tensor], Any]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass
class TrainStep:
    """``fn(images, labels)`` on ``device``; called with a loader's batch, it moves the batch there,
    runs the step and waits for the device, so the step's time is the device's, not the launch's."""

    fn: StepFn
    label: str
    device: torch.device

    def __call__(self, batch: Any) -> None:
        images, labels = images_and_labels(batch)
        self.fn(images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True))
        _sync(self.device)


@dataclass(frozen=True)
class Headspace:
    """The step alone on one batch already on its device, over and over: the rate no loader can beat."""

    step: str
    device: str
    samples_per_s: float
    step_ms: float
    steps: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def step_of(step: StepFn | TrainStep, device: str | torch.device | None = None) -> TrainStep:
    """Your ``fn(images, labels)`` as a TrainStep on ``device`` (default: CUDA when there is one)."""
    if isinstance(step, TrainStep):
        return step
    if not callable(step):
        raise TypeError(f"step={step!r}: pass a function fn(images, labels) that runs one training step")
    return TrainStep(step, getattr(step, "__name__", "your step"), _device(device))


def named_step(name: str, device: str | torch.device | None = None) -> TrainStep:
    """A torchvision model's training step: forward, cross-entropy, backward, SGD with momentum;
    on CUDA in bf16 autocast and channels-last, on the CPU in float32. uint8 batches are
    normalised on the device first (as ``fastload.DataLoader(..., mean=, std=)`` would)."""
    from fastload.benchmark.torchvision_install import torchvision_hint

    models = require("torchvision.models", f"--model {name} (a torchvision model as the training step)",
                     install=torchvision_hint(torch.__version__))
    try:
        builder = models.get_model_builder(name)
    except ValueError:
        known = ", ".join(n for n in ("resnet18", "resnet50", "mobilenet_v3_large", "efficientnet_b0",
                                      "vit_b_16") if n in models.list_models())
        raise ValueError(f"--model {name}: not a torchvision model name (e.g. {known}); pass one, or a "
                         "step function from Python: fastload.benchmark.bench(..., step=fn)") from None
    where = _device(device)
    cuda = where.type == "cuda"
    model = builder(weights=None).to(where)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    optimiser = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mean = torch.tensor(MEAN, device=where).view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device=where).view(1, 3, 1, 1) * 255
    classes = int(getattr(model, "num_classes", 0) or 1000)

    def train(images: torch.Tensor, labels: torch.Tensor) -> None:
        x = (images.float() - mean) / std if images.dtype == torch.uint8 else images.float()
        if cuda:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x.contiguous(memory_format=torch.channels_last))
        else:
            out = model(x)
        loss = torch.nn.functional.cross_entropy(out.float(), labels.long() % classes)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()

    precision = "bf16 autocast, channels-last" if cuda else "float32"
    return TrainStep(train, f"{name} ({precision}, {where.type})", where)


def measure_headspace(step: TrainStep, batch_size: int, image_size: int, *, duration: float,
                      min_steps: int = 5, warmup: int = 3) -> Headspace:
    """The step on one uint8 batch of ``batch_size × 3 × image_size²`` (labels 0) made on its device:
    ``warmup`` untimed steps (cuDNN picks its kernels), then steps for ``duration`` seconds, at least
    ``min_steps``; the rate is from the median step, so a burst of load elsewhere does not set it."""
    images = torch.randint(0, 256, (batch_size, 3, image_size, image_size), dtype=torch.uint8,
                           device=step.device)
    labels = torch.zeros(batch_size, dtype=torch.int64, device=step.device)
    for _ in range(warmup):
        step.fn(images, labels)
    _sync(step.device)
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < min_steps or time.perf_counter() - started < duration:
        t = time.perf_counter()
        step.fn(images, labels)
        _sync(step.device)
        times.append(time.perf_counter() - t)
    median = statistics.median(times)
    return Headspace(step.label, step.device.type, batch_size / median, 1e3 * median, len(times))


def sleep_headspace(seconds: float, batch_size: int) -> Headspace:
    """A slept stand-in step's headspace: what it takes, by construction."""
    return Headspace(f"sleep {seconds * 1e3:g} ms (a stand-in)", "none", batch_size / seconds, seconds * 1e3, 0)


def _device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def training_step(model: str | None, step: StepFn | TrainStep | None,
                  model_step: Callable[[Any], None] | float | None) -> Callable[[Any], None] | float | None:
    """The one step the loaders run under: ``model`` (a torchvision name), ``step`` (your
    ``fn(images, labels)``) or ``model_step`` (seconds slept, or a callable given the batch)."""
    given = [name for name, value in (("model", model), ("step", step), ("model_step", model_step)) if value]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)} were all given: pass one training step (model= for a "
                         "torchvision model, step= for your fn(images, labels), model_step= for seconds)")
    if model:
        return named_step(model)
    if step is not None:
        return step_of(step)
    return model_step


def headspace_of(step: Callable[[Any], None] | float | None, batch_size: int, image_size: int,
                 duration: float) -> Headspace | None:
    """The headspace of a TrainStep (measured) or of a slept stand-in (by construction); None for
    no step, or a bare callable given whole batches, which cannot be run on a made-up one."""
    if isinstance(step, TrainStep):
        return measure_headspace(step, batch_size, image_size, duration=duration)
    if isinstance(step, (int, float)) and step > 0:
        return sleep_headspace(float(step), batch_size)
    return None


def step_device(step: Callable[[Any], None] | float | None) -> str | None:
    """Where the loaders under ``step`` deliver: 'cuda' for a step on the GPU, else None (the host)."""
    return "cuda" if isinstance(step, TrainStep) and step.device.type == "cuda" else None
