"""What decides a PackedDataset loader's order, as torch's: ``generator=``, else torch's global RNG
(``torch.manual_seed``), unless ``seed=`` is given; a resume follows the saved run's order."""

from __future__ import annotations

import json

import torch

import fastload


def loader(path, **kwargs) -> fastload.DataLoader:
    return fastload.DataLoader(fastload.PackedDataset(path, image_size=16, train=True), batch_size=5,
                               shuffle=True, num_workers=0, **kwargs)


def order(loader: fastload.DataLoader) -> list[int]:
    return [i for _, labels in loader for i in labels.tolist()]


def test_torch_manual_seed_decides_the_order(id_packed):
    path = id_packed("lmdb")
    torch.manual_seed(1)
    first = order(loader(path))
    torch.manual_seed(1)
    again = order(loader(path))
    torch.manual_seed(2)
    other = order(loader(path))
    assert first == again and first != other and sorted(first) == sorted(other)


def test_a_generator_decides_the_order_whatever_the_global_rng(id_packed):
    path = id_packed("lmdb")
    torch.manual_seed(1)
    first = order(loader(path, generator=torch.Generator().manual_seed(5)))
    torch.manual_seed(2)
    again = order(loader(path, generator=torch.Generator().manual_seed(5)))
    other = order(loader(path, generator=torch.Generator().manual_seed(6)))
    assert first == again and first != other


def test_an_explicit_seed_decides_the_order_alone(id_packed):
    path = id_packed("lmdb")
    torch.manual_seed(1)
    first = order(loader(path, seed=3, generator=torch.Generator().manual_seed(5)))
    torch.manual_seed(2)
    assert order(loader(path, seed=3)) == first
    assert order(loader(path, seed=4)) != first


def test_each_epoch_is_a_new_order_and_a_resume_follows_the_saved_runs(id_packed):
    path = id_packed("lmdb")
    torch.manual_seed(1)
    saver = loader(path)
    epoch0, epoch1 = order(saver), order(saver)
    assert epoch0 != epoch1
    it = iter(saver)
    next(it), next(it)
    state = json.loads(json.dumps(saver.state_dict()))
    torch.manual_seed(99)  # the resumed process's RNG is another: the saved seed decides
    resumed = loader(path)
    resumed.load_state_dict(state)
    torch.manual_seed(1)
    reference = loader(path)
    order(reference), order(reference)
    assert order(resumed) == order(reference)[10:]
