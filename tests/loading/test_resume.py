"""Resume and epochs: ``state_dict()`` → a new loader + ``load_state_dict()`` yields exactly the
samples not yet delivered, with the same crops; each new iteration is the next epoch."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import fastload

from .helpers import ID_RECORDS, Numbers, Stream, ids_and_pixels

BATCH = 5  # 37 records (ID_RECORDS): 7 full batches and one of 2


def make_loader(path, num_workers: int, *, drop_last: bool = False, shuffle: bool = True,
                seed: int = 0) -> fastload.DataLoader:
    ds = fastload.PackedDataset(path, image_size=32, train=True)
    return fastload.DataLoader(ds, batch_size=BATCH, shuffle=shuffle, drop_last=drop_last,
                               num_workers=num_workers, seed=seed)


def same_pixels(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("save_workers, resume_workers", [(0, 0), (2, 2), (0, 2)])
@pytest.mark.parametrize("consumed", [0, 3, 7, 8], ids=["start", "mid", "last-batch", "end"])
def test_resume_yields_exactly_what_was_not_delivered(id_packed, save_workers, resume_workers, consumed):
    path = id_packed("lmdb")
    reference = make_loader(path, 0)
    first, second = ids_and_pixels(reference), ids_and_pixels(reference)

    saver = make_loader(path, save_workers)
    it = iter(saver)
    for _ in range(consumed):
        next(it)  # workers and the prefetch thread may have read further than this
    state = saver.state_dict()
    del it
    state = json.loads(json.dumps(state))  # a checkpoint holds plain values

    resumed = make_loader(path, resume_workers)
    resumed.load_state_dict(state)
    ids, pixels = ids_and_pixels(resumed)
    if consumed < 8:
        assert state["epoch"] == 0 and state["position"] == consumed * BATCH
        assert ids == first[0][consumed * BATCH:]
        assert same_pixels(pixels, first[1][consumed * BATCH:])  # same crops: keyed by (seed, epoch, index)
        following = second
    else:  # the saved epoch was complete: resume at the next one
        assert ids == second[0] and same_pixels(pixels, second[1])
        following = ids_and_pixels(reference)
    # After the resumed epoch, the loader goes on to the next one, as the saver would have.
    assert ids_and_pixels(resumed)[0] == following[0]


@pytest.mark.parametrize("drop_last, shuffle", [(True, True), (False, False), (True, False)])
def test_resume_mid_epoch_with_other_policies(id_packed, drop_last, shuffle):
    path = id_packed("hdf5")
    expected = ids_and_pixels(make_loader(path, 0, drop_last=drop_last, shuffle=shuffle))
    saver = make_loader(path, 2, drop_last=drop_last, shuffle=shuffle)
    it = iter(saver)
    next(it), next(it)
    state = saver.state_dict()
    del it
    resumed = make_loader(path, 0, drop_last=drop_last, shuffle=shuffle)
    resumed.load_state_dict(state)
    batches = len(resumed)
    ids, pixels = ids_and_pixels(resumed)
    assert ids == expected[0][2 * BATCH:] and same_pixels(pixels, expected[1][2 * BATCH:])
    assert batches == len(expected[0]) // BATCH + (0 if drop_last else bool(len(expected[0]) % BATCH))


def test_resume_twice_in_one_epoch(id_packed):
    path = id_packed("lmdb")
    expected = ids_and_pixels(make_loader(path, 0))[0]
    loader = make_loader(path, 2)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    delivered = expected[:BATCH]
    for workers in (0, 2):
        loader = make_loader(path, workers)
        loader.load_state_dict(state)
        it = iter(loader)
        delivered += next(it)[1].tolist() + next(it)[1].tolist()
        state = loader.state_dict()
        del it
    loader = make_loader(path, 0)
    loader.load_state_dict(state)
    assert delivered + ids_and_pixels(loader)[0] == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_dict_before_any_iteration_and_after_set_epoch(id_packed, num_workers):
    path = id_packed("lmdb")
    loader = make_loader(path, num_workers)
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["position"] == 0
    ids_and_pixels(loader)  # epoch 0, complete
    it = iter(loader)  # epoch 1 begun (workers or the prefetch thread pull its order), nothing delivered
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (1, 0)
    del it
    loader.set_epoch(5)
    state = loader.state_dict()
    assert (state["epoch"], state["position"]) == (5, 0)  # the epoch the next iteration will run
    resumed = make_loader(path, 0)
    resumed.load_state_dict(state)
    assert ids_and_pixels(resumed)[0] == ids_and_pixels(loader)[0]


def test_load_state_dict_refuses_other_settings(id_packed):
    path = id_packed("lmdb")
    state = make_loader(path, 0).state_dict()
    for other in (make_loader(path, 0, seed=1), make_loader(path, 0, drop_last=True),
                  make_loader(path, 0, shuffle=False)):
        with pytest.raises(ValueError, match="load_state_dict"):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match="position"):
        make_loader(path, 0).load_state_dict({**state, "position": 38})


def test_any_dataset_resumes_and_a_state_of_the_other_kind_is_refused_clearly():
    loader = fastload.DataLoader(Numbers(), batch_size=4, shuffle=True, num_workers=0)
    it = iter(loader)
    first = [next(it)[0].tolist() for _ in range(2)]
    state = loader.state_dict()
    rest = [b[0].tolist() for b in it]
    resumed = fastload.DataLoader(Numbers(), batch_size=4, shuffle=True, num_workers=2)
    resumed.load_state_dict(state)
    assert [b[0].tolist() for b in resumed] == rest and len(first) == 2
    with pytest.raises(ValueError):  # an EpochSampler's state given to a RandomSampler's loader
        loader.load_state_dict({"epoch": 0, "position": 0})
    with pytest.raises(TypeError, match="set_epoch"):
        loader.set_epoch(1)
    with pytest.raises(TypeError, match="cannot be resumed"):
        fastload.DataLoader(Stream(), batch_size=2).state_dict()


# --- epochs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, 2])
def test_each_iteration_is_the_next_epoch_and_set_epoch_replays(id_packed, num_workers):
    loader = make_loader(id_packed("lmdb"), num_workers)
    first, second = ids_and_pixels(loader), ids_and_pixels(loader)
    assert sorted(first[0]) == sorted(second[0]) == list(range(ID_RECORDS))
    assert first[0] != second[0]  # a new order without set_epoch
    # The same record gets another crop in another epoch.
    by_id = [dict(zip(ids, pixels)) for ids, pixels in (first, second)]
    assert sum(not torch.equal(by_id[0][i], by_id[1][i]) for i in range(ID_RECORDS)) > 30
    loader.set_epoch(0)
    replay = ids_and_pixels(loader)
    assert replay[0] == first[0] and same_pixels(replay[1], first[1])
    assert ids_and_pixels(loader)[0] == second[0]  # and on to epoch 1 again
    loader.set_epoch(1)
    assert ids_and_pixels(loader)[0] == second[0]


def test_order_and_crops_do_not_depend_on_num_workers(id_packed):
    path = id_packed("hdf5")
    runs = [ids_and_pixels(make_loader(path, w)) for w in (0, 1, 2)]
    assert runs[0][0] == runs[1][0] == runs[2][0]
    assert same_pixels(runs[0][1], runs[1][1]) and same_pixels(runs[0][1], runs[2][1])


@pytest.mark.parametrize("storage", ["lmdb", "hdf5"])
def test_handles_opened_before_the_workers_fork_are_not_reused(id_packed, storage):
    """The main process reads first (opening its shard handles), then forked workers read the same
    dataset object: each must open its own handles and get the same bytes and pixels."""
    path = id_packed(storage)
    expected = ids_and_pixels(make_loader(path, 0))
    ds = fastload.PackedDataset(path, image_size=32, train=True)
    ids_and_pixels(fastload.DataLoader(ds, batch_size=BATCH, num_workers=0))  # handles open here
    for _ in range(2):  # and twice, so the second set of workers forks from a parent that forked
        got = ids_and_pixels(fastload.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2, seed=0))
        assert got[0] == expected[0] and same_pixels(got[1], expected[1])


def test_spawned_workers_give_the_same_order_and_crops(id_packed):
    path = id_packed("lmdb")
    expected = ids_and_pixels(make_loader(path, 0))
    ds = fastload.PackedDataset(path, image_size=32, train=True)
    loader = fastload.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2, seed=0,
                                 multiprocessing_context="spawn")
    got = ids_and_pixels(loader)
    assert got[0] == expected[0] and same_pixels(got[1], expected[1])


def test_an_abandoned_iteration_still_moves_to_the_next_epoch(id_packed):
    path = id_packed("lmdb")
    reference = make_loader(path, 0)
    first, second = ids_and_pixels(reference)[0], ids_and_pixels(reference)[0]
    loader = make_loader(path, 2)
    it = iter(loader)
    assert next(it)[1].tolist() == first[:BATCH]
    del it
    assert ids_and_pixels(loader)[0] == second


def test_persistent_workers_follow_the_epochs(id_packed):
    path = id_packed("lmdb")
    reference = make_loader(path, 0)
    expected = [ids_and_pixels(reference) for _ in range(3)]
    ds = fastload.PackedDataset(path, image_size=32, train=True)
    loader = fastload.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2, seed=0, persistent_workers=True)
    for want in expected:
        got = ids_and_pixels(loader)
        assert got[0] == want[0] and same_pixels(got[1], want[1])


def test_seed_changes_order_and_crops(id_packed):
    path = id_packed("lmdb")
    a, b = ids_and_pixels(make_loader(path, 0, seed=0)), ids_and_pixels(make_loader(path, 0, seed=1))
    assert a[0] != b[0]


def test_state_dict_warns_when_batches_may_arrive_out_of_order(id_packed):
    """Only a count of delivered samples is saved: exact while batches arrive in sampler order."""
    ds = fastload.PackedDataset(id_packed("lmdb"), image_size=32, train=True)
    loader = fastload.DataLoader(ds, batch_size=BATCH, num_workers=2, in_order=False)
    with pytest.warns(UserWarning, match="in_order=False"):
        loader.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fastload.DataLoader(ds, batch_size=BATCH, num_workers=0, in_order=False).state_dict()
        make_loader(id_packed("lmdb"), 2).state_dict()


def test_len_keeps_torchs_meaning_while_a_resumed_epoch_yields_the_rest(id_packed):
    """``len(loader)`` is the batches of a whole epoch, as torch's, also after a resume: trainers
    (Lightning) count an epoch's batches from it and add those they ran before the checkpoint."""
    path = id_packed("lmdb")
    loader = make_loader(path, 0)
    assert len(loader) == 8
    state = {**loader.state_dict(), "position": 2 * BATCH}
    loader.load_state_dict(state)
    assert len(loader) == 8
    assert sum(1 for _ in loader) == 6
    assert len(loader) == 8
    assert sum(1 for _ in loader) == 8


@pytest.mark.parametrize("num_workers", [0, 2])
def test_iter_then_set_epoch_as_lightning_does_keeps_the_state_right(id_packed, num_workers):
    """Lightning calls iter(loader) and then sampler.set_epoch(epoch): the prefetch thread (or
    the workers) may have drawn the order already. state_dict() must still say where the loop is;
    it once said position 0 after a whole epoch (2 of 7 runs). Run many times: it was a race."""
    loader = make_loader(id_packed("lmdb"), num_workers)
    share = len(loader.epoch_sampler.share(0))
    for run in range(50 if num_workers == 0 else 8):
        epoch = run
        it = iter(loader)
        loader.epoch_sampler.set_epoch(epoch)
        taken = sum(len(batch[1]) for _, batch in zip(range(3), it))
        assert loader.state_dict()["epoch"] == epoch and loader.state_dict()["position"] == taken
        taken += sum(len(batch[1]) for batch in it)
        state = loader.state_dict()
        assert (state["epoch"], state["position"]) == (epoch, share), run
