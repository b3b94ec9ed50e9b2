"""Your own augmentations in the pipeline: ``sample_transform`` in the decode threads or workers and
``batch_transform`` on delivered batches, drawing from generators keyed by (seed, epoch, position):
the same results for 0 and 2 workers and after a resume; errors name the record."""

from __future__ import annotations

import json

import pytest
import torch

import fastload
from fastload.samples.user_transforms import sample_generator

from .helpers import ID_RECORDS

BATCH = 5


def speckle(sample: dict, generator: torch.Generator) -> dict:
    """A random augmentation that also checks what it is given, and moves the label."""
    image = sample["image"]
    assert image.dtype == torch.uint8 and image.shape == (3, 32, 32) and sample["index"] == sample["label"]
    image ^= torch.randint(0, 256, image.shape, generator=generator, dtype=torch.uint8)  # in place: the slot
    return {**sample, "label": sample["label"] + 1000}


def shifted(sample: dict, generator: torch.Generator) -> dict:
    """Returns a new tensor instead of writing in place (fastload copies it into the slot)."""
    return {**sample, "image": torch.roll(sample["image"], int(torch.randint(1, 9, (), generator=generator)), 2)}


def jitter_labels(batch: tuple, generator: torch.Generator) -> tuple:
    images, labels = batch
    assert images.dtype == torch.float32  # after mean/std
    noise = torch.rand(images.shape[0], generator=generator, device=generator.device)
    return images * 2, labels.to(torch.float32) + noise


def loader(path, workers: int, *, sample=speckle, batch=None, seed: int = 3) -> fastload.DataLoader:
    ds = fastload.PackedDataset(path, image_size=32, train=True, sample_transform=sample)
    extra = {"mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25)} if batch else {}
    return fastload.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers, seed=seed,
                               batch_transform=batch, **extra)


def epoch(it) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = zip(*[(x.clone(), y.clone()) for x, y in it])
    return torch.cat(images), torch.cat(labels)


@pytest.mark.parametrize("sample", [speckle, shifted])
def test_sample_transform_gives_the_same_samples_for_0_and_2_workers(id_packed, sample):
    path = id_packed("lmdb")
    threads, workers = epoch(loader(path, 0, sample=sample)), epoch(loader(path, 2, sample=sample))
    plain = epoch(loader(path, 0, sample=None))
    assert torch.equal(threads[0], workers[0]) and torch.equal(threads[1], workers[1])
    assert not torch.equal(threads[0], plain[0])  # it ran
    if sample is speckle:
        assert torch.equal(threads[1], plain[1] + 1000)  # the label it returned is the one delivered
        # the draws were those of (seed, epoch, index): XOR-ing them again gives the plain crops
        undone = torch.stack([image ^ torch.randint(0, 256, image.shape, dtype=torch.uint8,
                                                    generator=sample_generator(3, 0, int(i)))
                              for image, i in zip(threads[0], plain[1])])
        assert torch.equal(undone, plain[0])


def test_sample_transform_draws_differ_by_epoch_and_match_after_resume(id_packed):
    path = id_packed("lmdb")
    reference = loader(path, 0)
    first, second = epoch(reference), epoch(reference)
    assert not torch.equal(first[0], second[0])
    saver = loader(path, 2)
    it = iter(saver)
    for _ in range(3):
        next(it)
    state = json.loads(json.dumps(saver.state_dict()))
    del it
    resumed = loader(path, 0)
    resumed.load_state_dict(state)
    rest = epoch(resumed)
    assert torch.equal(rest[0], first[0][3 * BATCH:]) and torch.equal(rest[1], first[1][3 * BATCH:])


def test_batch_transform_runs_after_normalisation_and_resumes_with_the_same_draws(id_packed):
    path = id_packed("lmdb")
    reference = loader(path, 0, sample=None, batch=jitter_labels)
    images, labels = epoch(reference)
    plain = epoch(loader(path, 0, sample=None, batch=None))
    normalised = (plain[0].float() / 255 - 0.5) / 0.25
    assert torch.allclose(images, normalised * 2, atol=1e-5)
    noise = labels - plain[1].float()
    assert bool(((noise >= 0) & (noise < 1)).all()) and noise.unique().numel() > 1
    assert torch.equal(epoch(loader(path, 2, sample=None, batch=jitter_labels))[1], labels)  # workers
    saver = loader(path, 0, sample=None, batch=jitter_labels)
    it = iter(saver)
    for _ in range(4):
        next(it)
    state = saver.state_dict()
    del it
    resumed = loader(path, 2, sample=None, batch=jitter_labels)
    resumed.load_state_dict(state)
    assert torch.equal(epoch(resumed)[1], labels[4 * BATCH:])


def test_a_sample_transform_that_returns_the_wrong_thing_names_the_record(id_packed):
    path = id_packed("lmdb")

    def smaller(sample, generator):
        return {**sample, "image": sample["image"][:, :16]}

    with pytest.raises(TypeError, match=r"shard-\d+\.lmdb record \d+ .*sample_transform must return .*"
                                        r"\(3, 32, 32\).*uint8 \(3, 16, 32\)"):
        next(iter(loader(path, 0, sample=smaller)))

    def broken(sample, generator):
        raise KeyError("boxes")

    with pytest.raises(KeyError) as raised:
        next(iter(loader(path, 0, sample=broken)))
    assert any("raised by sample_transform on" in note and "record" in note for note in raised.value.__notes__)


def test_transform_arguments_are_checked(id_packed):
    path = id_packed("lmdb")
    with pytest.raises(ValueError, match="sample_transform= runs on the built-in pipeline"):
        fastload.PackedDataset(path, sample_transform=speckle)
    with pytest.raises(TypeError, match="sample_transform=3: must be a callable"):
        fastload.PackedDataset(path, image_size=32, train=True, sample_transform=3)
    ds = fastload.PackedDataset(path, image_size=32, train=True, sample_transform=speckle)
    with pytest.raises(TypeError, match="batch_transform='x': must be a callable"):
        fastload.DataLoader(ds, batch_size=4, batch_transform="x")
    with pytest.raises(ValueError, match="backend='dali'.*sample_transform would not run"):
        fastload.DataLoader(ds, batch_size=4, backend="dali")
    assert len(ds) == ID_RECORDS


def test_the_ready_made_augmentations_run_in_the_loader(id_packed):
    from fastload.augment import ColorJitter, Compose, CutMix, Mixup, RandomGrayscale

    path = id_packed("lmdb")
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)

    def run(workers: int) -> tuple[torch.Tensor, torch.Tensor]:
        ds = fastload.PackedDataset(path, image_size=32, train=True,
                                    sample_transform=Compose(ColorJitter(0.4, 0.4, 0.4, 0.1), RandomGrayscale(0.2)))
        return epoch(fastload.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=workers, seed=3,
                                         mean=mean, std=std,
                                         batch_transform=Compose(Mixup(0.2, num_classes=ID_RECORDS),
                                                                 CutMix(1.0, num_classes=ID_RECORDS))))

    images, labels = run(0)
    assert images.dtype == torch.float32 and labels.shape == (ID_RECORDS, ID_RECORDS)
    assert torch.allclose(labels.sum(1), torch.ones(ID_RECORDS))
    again = run(2)
    assert torch.equal(images, again[0]) and torch.equal(labels, again[1])

