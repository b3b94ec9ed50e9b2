"""on_error: a damaged record raises naming shard, record and source path ("raise", the default),
or is left out of its batch, counted in loader.stats() and warned about once per shard ("skip"),
in every loader mode: main process, threads, forked and spawned worker processes."""

from __future__ import annotations

import math
import pickle
import warnings

import numpy as np
import pytest
import torch

import fastload
from fastload.samples.collate import SkipCountedList, SkipCountedTuple, keep_skips
from fastload.errors import CorruptRecordError, ManifestError, SkippedRecordWarning
from fastload.loading.stats import batch_size_of

from .conftest import RECORDS, shard_of

BATCH = 6


def small_array(image) -> np.ndarray:
    """A transform= for the PIL path: every image to the same 8x8 RGB array (so batches stack)."""
    return np.array(image.resize((8, 8)))


def labels_only(batch: list) -> list:
    """A user collate_fn: just the labels, as a plain list."""
    return [label for _, label in batch]


def labels_tensor(batch: list) -> torch.Tensor:
    return torch.tensor([label for _, label in batch])


# --- on_error="raise": the error names shard, record and source path --------------------------------

@pytest.mark.parametrize("damage", ["checksum", "decode"])
@pytest.mark.parametrize("image_size", [None, 32])
def test_raise_names_shard_record_and_source_path(damaged, undecodable, damage, image_size):
    bad = 9
    dataset = damaged(bad) if damage == "checksum" else undecodable(bad)
    ds = fastload.PackedDataset(dataset, image_size=image_size, train=True)
    assert ds.on_error == "raise"
    expected = f"{shard_of(dataset, bad)} record {bad} (img{bad:04d}.png): "
    for read in (lambda: ds[bad], lambda: ds.__getitems__([bad - 1, bad, bad + 1])):
        with pytest.raises(CorruptRecordError) as info:
            read()
        assert str(info.value).startswith(expected)
        assert ("checksum mismatch" if damage == "checksum" else "data is corrupt or truncated") in str(info.value)
    assert ds[bad - 1] and ds[bad + 1]  # its neighbours still read


def test_on_error_and_max_pixels_are_checked(id_set):
    with pytest.raises(ValueError, match="on_error='ignore': must be 'raise' or 'skip'"):
        fastload.PackedDataset(id_set(), on_error="ignore")
    with pytest.raises(ValueError, match="max_pixels=0: must be a positive integer"):
        fastload.PackedDataset(id_set(), max_pixels=0)


# --- on_error="skip" -------------------------------------------------------------------------------

def delivered(loader) -> tuple[list[int], list[int]]:
    """Record ids delivered, and the size of every batch."""
    ids, sizes = [], []
    for _, labels in loader:
        ids += labels.tolist()
        sizes.append(len(labels))
    return ids, sizes


@pytest.mark.parametrize("num_workers, context", [(0, None), ("auto", None), (2, "fork"), (2, "spawn")],
                         ids=["main", "auto", "fork", "spawn"])
def test_skip_leaves_damaged_records_out_and_counts_them(damaged, num_workers, context):
    bad = [3, 4, 17, 30]
    dataset = damaged(*bad)
    ds = fastload.PackedDataset(dataset, image_size=24, train=True, on_error="skip")
    loader = fastload.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=num_workers,
                                 multiprocessing_context=context, timeout=120 if num_workers == 2 else 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedRecordWarning)
        ids, sizes = delivered(loader)
    assert sorted(ids) == sorted(set(range(RECORDS)) - set(bad))  # every sound record exactly once
    assert len(sizes) == math.ceil(RECORDS / BATCH)  # as many batches as ever: ranks stay in step
    stats = loader.stats()
    assert stats["skipped"] == len(bad) and stats["samples"] == RECORDS - len(bad)
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["position"] == RECORDS


def test_skip_warns_once_per_shard_naming_the_first_record(damaged):
    dataset = damaged(0, 1, RECORDS - 1)
    assert shard_of(dataset, 0) == shard_of(dataset, 1) != shard_of(dataset, RECORDS - 1)
    ds = fastload.PackedDataset(dataset, image_size=24, train=True, on_error="skip")
    loader = fastload.DataLoader(ds, batch_size=BATCH, shuffle=False, num_workers=0)
    with pytest.warns(SkippedRecordWarning) as caught:
        for _ in range(2):  # and not again in a second epoch
            ids, _ = delivered(loader)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2, messages
    assert messages[0].startswith(f"{shard_of(dataset, 0)} record 0 (img0000.jpg): checksum mismatch")
    assert messages[1].startswith(f"{shard_of(dataset, RECORDS - 1)} record {RECORDS - 1} (")
    assert "counted in loader.stats()['skipped']" in messages[0]
    assert loader.stats()["skipped"] == 6 and ds.skipped == 6


def test_records_that_do_not_decode_are_skipped_too(undecodable):
    dataset = undecodable(4, 24)
    ds = fastload.PackedDataset(dataset, image_size=24, train=True, on_error="skip", decode_threads=2)
    loader = fastload.DataLoader(ds, batch_size=BATCH, shuffle=False, num_workers=0)
    with pytest.warns(SkippedRecordWarning) as caught:
        ids, sizes = delivered(loader)
    assert [str(w.message).split(": ")[0].split(".lmdb ")[1] for w in caught] == [
        "record 4 (img0004.png)", "record 24 (img0024.png)"]  # two shards
    assert "PNG data is corrupt" in str(caught[0].message)
    assert ids == [i for i in range(RECORDS) if i not in (4, 24)]
    assert sizes[0] == BATCH - 1 and loader.stats()["skipped"] == 2


def test_resume_after_a_skip_continues_where_the_loop_was(damaged):
    """The resume position counts skipped records as consumed: nothing is read twice or lost."""
    dataset = damaged(2, 7)
    ds = fastload.PackedDataset(dataset, image_size=24, train=True, on_error="skip")
    loader = fastload.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=5, num_workers=0)
    it = iter(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedRecordWarning)
        first = [next(it)[1].tolist() for _ in range(3)]
        state = loader.state_dict()
        resumed = fastload.DataLoader(ds, batch_size=BATCH, shuffle=True, seed=5, num_workers=0)
        resumed.load_state_dict(state)
        after = delivered(resumed)[0]
    assert state["position"] == 3 * BATCH
    seen = [i for batch in first for i in batch] + after
    assert sorted(seen) == [i for i in range(RECORDS) if i not in (2, 7)]


def test_a_batch_of_only_damaged_records_arrives_empty(damaged):
    dataset = damaged(6, 7)
    ds = fastload.PackedDataset(dataset, image_size=24, train=True, on_error="skip")
    loader = fastload.DataLoader(ds, batch_size=2, shuffle=False, num_workers=0)
    with pytest.warns(SkippedRecordWarning):
        batches = list(loader)
    assert len(batches) == RECORDS // 2
    images, labels = batches[3]
    assert images.shape == (0, 3, 24, 24) and labels.shape == (0,)
    assert loader.stats()["skipped"] == 2 and loader.state_dict()["position"] == RECORDS


def test_single_item_access_raises_whatever_on_error_says(damaged):
    dataset = damaged(5)
    for image_size in (None, 24):
        ds = fastload.PackedDataset(dataset, image_size=image_size, train=True, on_error="skip")
        with pytest.raises(CorruptRecordError, match=r"record 5 \(img0005.jpg\)"):
            ds[5]
        with pytest.warns(SkippedRecordWarning):
            batch = ds.__getitems__([4, 5, 5, 6])  # a record twice (as DDP padding can do)
        assert [label for _, label in batch] == [4, 6] and batch.skipped == 2 and ds.skipped == 2


def test_dataset_level_damage_is_never_skipped(damaged):
    dataset = damaged()
    ds = fastload.PackedDataset(dataset, image_size=24, train=True, on_error="skip")
    last = ds.manifest.shards[-1].file
    (dataset / last).unlink()  # after the open-time check: found by the first read of that shard
    with pytest.raises(ManifestError, match=last):
        list(fastload.DataLoader(ds, batch_size=BATCH, shuffle=False, num_workers=0))


# --- the count rides with the batch, whatever collates it --------------------------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
def test_skip_without_the_builtin_pipeline(damaged, num_workers):
    """transform= (the PIL path) and torch's default_collate: batches are lists, counts kept."""
    dataset = damaged(1, 20)
    ds = fastload.PackedDataset(dataset, transform=small_array, on_error="skip")
    loader = fastload.DataLoader(ds, batch_size=BATCH, shuffle=False, num_workers=num_workers,
                                 timeout=120 if num_workers else 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedRecordWarning)
        batches = list(loader)
    assert all(isinstance(b, list) and b[0].shape[1:] == (8, 8, 3) for b in batches)
    assert [i for _, y in batches for i in y.tolist()] == [i for i in range(RECORDS) if i not in (1, 20)]
    assert loader.stats()["skipped"] == 2


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_custom_collate_fn_keeps_the_count(damaged, num_workers):
    dataset = damaged(1, 2, 20)
    ds = fastload.PackedDataset(dataset, image_size=16, train=True, on_error="skip")
    loader = fastload.DataLoader(ds, batch_size=BATCH, shuffle=False, num_workers=num_workers,
                                 collate_fn=labels_only, timeout=120 if num_workers else 0)
    assert loader.collate_fn.collate_fn is labels_only
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedRecordWarning)
        batches = list(loader)
    assert batches[0] == [0, 3, 4, 5] and isinstance(batches[0], list)
    assert loader.stats()["skipped"] == 3
    # What a framework passes back when it rebuilds the loader is not wrapped twice.
    assert keep_skips(loader.collate_fn) is loader.collate_fn


@pytest.mark.filterwarnings("ignore::fastload.errors.SkippedRecordWarning")
def test_a_collate_fn_whose_batch_cannot_carry_the_count_is_refused(damaged):
    ds = fastload.PackedDataset(damaged(1), image_size=16, train=True, on_error="skip")
    loader = fastload.DataLoader(ds, batch_size=BATCH, num_workers=0, collate_fn=labels_tensor)
    with pytest.raises(TypeError, match="collate_fn returned a Tensor: with on_error='skip' a batch must "
                                        "be a tuple, list or dict"):
        next(iter(loader))


def test_counted_batches_pickle_with_their_count():
    """What carries the count out of a worker process: the collated batch, pickled."""
    for batch in (SkipCountedTuple((torch.arange(3), torch.zeros(3)), 2), SkipCountedList([1, 2], 5)):
        again = pickle.loads(pickle.dumps(batch))
        assert type(again) is type(batch) and again.skipped == batch.skipped
        assert batch_size_of(again) == batch_size_of(batch)


def test_without_skip_nothing_changes_type(id_set):
    ds = fastload.PackedDataset(id_set(), image_size=16, train=True)
    batch = next(iter(fastload.DataLoader(ds, batch_size=4, num_workers=0)))
    assert type(batch) is tuple


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a lent GPU)")
def test_pinned_batches_keep_the_count(damaged):
    ds = fastload.PackedDataset(damaged(3, 33), image_size=16, train=True, on_error="skip")
    loader = fastload.DataLoader(ds, batch_size=BATCH, num_workers=2, pin_memory=True, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SkippedRecordWarning)
        ids, _ = delivered(loader)
    assert len(ids) == RECORDS - 2 and loader.stats()["skipped"] == 2
