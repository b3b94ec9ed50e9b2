"""Train, save a checkpoint in the middle of an epoch, and finish that epoch in a fresh process.

    python examples/train_resume.py                     # packs a tiny generated dataset first
    python examples/train_resume.py --data my.fl        # or trains on your own packed dataset

The checkpoint holds the model, the optimizer and ``loader.state_dict()`` (the epoch, its order's
seed and how many samples were delivered). The second process builds a new model, optimizer and
loader, loads all three, and its loader yields exactly the samples the first one had not delivered.
The generated dataset labels each picture with its record number, so the printout shows which
samples each run trained.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import fastload

IMAGE_SIZE = 32


def make_dataset(folder: Path, count: int) -> Path:
    """``count`` small pictures and a ``list.csv`` labelling each with its row number, packed."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = ["path,label"]
    for i in range(count):
        # A gradient whose colour depends on i: a valid JPEG, distinct per record.
        ramp = np.linspace(0, 255, 48, dtype=np.uint8)
        pixels = np.stack([np.add.outer(ramp, ramp) // 2, np.full((48, 48), 5 * i % 256, np.uint8),
                           np.add.outer(ramp, ramp[::-1]) // 2], axis=-1).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:04d}.jpg", quality=90)
        rows.append(f"{i:04d}.jpg,{i}")
    (folder / "list.csv").write_text("\n".join(rows) + "\n")

    from fastload.converters import pack  # the library call behind `fastload pack`

    out = folder.with_suffix(".fl")
    pack(folder / "list.csv", out, progress=False)
    return out


def build(data: str, batch_size: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, fastload.DataLoader]:
    dataset = fastload.PackedDataset(data, image_size=IMAGE_SIZE, train=True)
    classes = len(dataset)  # the generated labels are record numbers; a real set has fewer classes
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * IMAGE_SIZE * IMAGE_SIZE, classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = fastload.DataLoader(dataset, batch_size=batch_size, shuffle=True)
    return model, optimizer, loader


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, images: torch.Tensor,
               labels: torch.Tensor) -> float:
    loss = torch.nn.functional.cross_entropy(model(images.float() / 255), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def first_run(data: str, checkpoint: Path, batch_size: int, stop_after: int) -> None:
    """Train epoch 0 for ``stop_after`` batches, then save everything needed to go on."""
    model, optimizer, loader = build(data, batch_size)
    trained = []
    for step, (images, labels) in enumerate(loader):
        loss = train_step(model, optimizer, images, labels)
        trained += labels.tolist()
        if step + 1 == stop_after:
            # As a job would at a time limit or on a preemption signal: save, then stop mid-epoch.
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "loader": loader.state_dict()}, checkpoint)
            break
    print(f"first run: {step + 1} of {len(loader)} batches of epoch 0, loss {loss:.3f}, "
          f"saved {checkpoint}")
    print("first run trained labels:", *trained)


def resumed_run(data: str, checkpoint: Path, batch_size: int) -> None:
    """A fresh model, optimizer and loader, restored from the checkpoint: finish the epoch."""
    model, optimizer, loader = build(data, batch_size)
    state = torch.load(checkpoint)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    loader.load_state_dict(state["loader"])
    trained = []
    for images, labels in loader:  # only the batches the first run had not reached
        loss = train_step(model, optimizer, images, labels)
        trained += labels.tolist()
    print(f"resumed run: finished epoch 0 with {len(trained)} more samples, loss {loss:.3f}")
    print("resumed run trained labels:", *trained)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="a packed dataset (default: pack a tiny generated one)")
    parser.add_argument("--work", help="where the generated dataset and the checkpoint go "
                                       "(default: a temporary folder)")
    parser.add_argument("--samples", type=int, default=40, help="pictures in the generated dataset")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--stop-after", type=int, default=2, help="batches before the checkpoint")
    parser.add_argument("--resume", metavar="CHECKPOINT", help=argparse.SUPPRESS)  # the second process
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.resume:
        resumed_run(args.data, Path(args.resume), args.batch_size)
        return 0
    with tempfile.TemporaryDirectory() as temp:
        work = Path(args.work or temp)
        data = args.data or str(make_dataset(work / "pictures", args.samples))
        checkpoint = work / "checkpoint.pt"
        first_run(data, checkpoint, args.batch_size, args.stop_after)
        # A new process, as after a restart: nothing survives but the checkpoint file.
        subprocess.run([sys.executable, __file__, "--data", data, "--resume", str(checkpoint),
                        "--batch-size", str(args.batch_size)], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
