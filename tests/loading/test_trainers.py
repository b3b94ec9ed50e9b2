"""Real trainers resume a fastload loader mid-epoch: PyTorch Lightning from a checkpoint saved
after some batches, Accelerate by skipping the batches it already ran. Every sample of the
interrupted epoch is trained exactly once, and ``len(loader)`` keeps torch's meaning."""

from __future__ import annotations

import json

import pytest
import torch

import fastload

from .helpers import ID_RECORDS

BATCH = 4  # 37 records (ID_RECORDS): 9 full batches and one of 1 per epoch
STOP_AFTER = 3  # batches run before the checkpoint


class Killed(Exception):
    """The training job dying after a checkpoint."""


def make_loader(path, num_workers: int | str) -> fastload.DataLoader:
    ds = fastload.PackedDataset(path, image_size=16, train=True)
    return fastload.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=num_workers, seed=3)


def lightning_module(seen: list[int]):
    import lightning

    class Recorder(lightning.LightningModule):
        """Records the labels (record numbers) of every batch it trains on."""

        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, batch_idx):
            images, labels = batch
            seen.extend(labels.tolist())
            return (self.w * images.float().mean()).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    return Recorder()


def lightning_trainer(**kwargs):
    import lightning

    return lightning.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                             **kwargs)


@pytest.mark.parametrize("num_workers", [0, 2, "auto"])  # auto: decode threads in the main process
def test_lightning_mid_epoch_checkpoint_resumes_every_sample_exactly_once(id_packed, tmp_path, num_workers):
    pytest.importorskip("lightning", reason="the trainer tests need lightning: pip install -e '.[dev]'")
    import lightning

    path, ckpt = id_packed("lmdb"), tmp_path / "mid.ckpt"
    whole_epoch = [int(label) for _, labels in make_loader(path, 0) for label in labels]

    class CheckpointAndStop(lightning.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if batch_idx == STOP_AFTER - 1:
                trainer.save_checkpoint(ckpt)  # as ModelCheckpoint(every_n_train_steps=3) does
                raise Killed  # the job dies here

    first: list[int] = []
    loader = make_loader(path, num_workers)
    with pytest.raises(Killed):
        lightning_trainer(callbacks=[CheckpointAndStop()]).fit(lightning_module(first), loader)
    assert first == whole_epoch[:STOP_AFTER * BATCH]

    second: list[int] = []
    resumed = make_loader(path, num_workers)
    lightning_trainer().fit(lightning_module(second), resumed, ckpt_path=ckpt)
    assert first + second == whole_epoch  # the rest of the epoch, each sample once
    assert sorted(first + second) == list(range(ID_RECORDS))
    assert len(resumed) == -(-ID_RECORDS // BATCH)  # torch's meaning: batches of a whole epoch


@pytest.mark.parametrize("num_workers", [0, 2, "auto"])
def test_accelerate_skip_first_batches_resumes_every_sample_exactly_once(id_packed, tmp_path, num_workers):
    pytest.importorskip("accelerate", reason="the trainer tests need accelerate: pip install -e '.[dev]'")
    from accelerate import Accelerator

    path = id_packed("lmdb")
    whole_epoch = [int(label) for _, labels in make_loader(path, 0) for label in labels]

    accelerator = Accelerator(cpu=True)
    loader = accelerator.prepare(make_loader(path, num_workers))
    first = []
    for step, (_, labels) in enumerate(loader):
        first.extend(labels.tolist())
        if step == STOP_AFTER - 1:
            break
    accelerator.save_state(tmp_path / "state")

    resumed_accelerator = Accelerator(cpu=True)
    resumed = resumed_accelerator.prepare(make_loader(path, num_workers))
    resumed_accelerator.load_state(tmp_path / "state")
    second = [int(label) for _, labels in resumed_accelerator.skip_first_batches(resumed, STOP_AFTER)
              for label in labels]
    assert first + second == whole_epoch
    assert json.loads(json.dumps(first))  # plain ints: what a checkpoint holds
