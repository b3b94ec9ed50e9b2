"""Masks cut straight into their batch (fastload.samples.field_slots): a batch's mask field is the
tensor its samples' masks were cut into (each sample's mask a view of its row), uint8 and int32,
stored as rows or as PNG files; a record met twice in a batch, a sample transform that replaces
a mask, and a skipped record give the same batches as one sample at a time."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from fastload.converters import pack

import fastload
from fastload.samples.field_slots import FieldSlots
from tests.samples.test_mask_rows import png, sample

N, SIZE = 8, 24
FIELDS = ("image", "label", "mask", "deep")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("mask_slots")
    rng = np.random.default_rng(11)
    rows = []
    for i in range(N):
        image, mask, deep = sample(rng)
        (root / f"{i}.png").write_bytes(image)
        (root / f"{i}.m.png").write_bytes(png(mask))
        (root / f"{i}.d.png").write_bytes(png(deep))
        rows.append({"path": f"{i}.png", "label": 0, "mask": f"{i}.m.png", "deep": f"{i}.d.png"})
    (root / "list.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pack(root / "list.jsonl", root / "d.fl", file_columns=("mask", "deep"), progress=False)
    pack(root / "list.jsonl", root / "png.fl", file_columns=("mask", "deep"), mask_storage="file", progress=False)
    return root


def dataset(root, name="d.fl", **kw):
    return fastload.PackedDataset(root / name, image_size=SIZE, train=True, fields=FIELDS, **kw)


def alone(ds, keys):
    """Each key's sample on its own: the reference a batch must equal."""
    return [ds[key] for key in keys]


@pytest.mark.parametrize("name", ["d.fl", "png.fl"])  # masks stored as rows, as PNG files
def test_a_batch_of_masks_is_the_tensor_they_were_cut_into(root, name):
    ds = dataset(root, name)
    keys = [(i, 0, 9) for i in range(N)]
    batch = ds.__getitems__(keys)
    for name, dtype in (("mask", torch.uint8), ("deep", torch.int32)):
        whole = batch.fields[name]
        assert whole.dtype == dtype and whole.shape == (N, SIZE, SIZE)
        for k, one in enumerate(alone(ds, keys)):
            assert batch.samples[k][name].data_ptr() == whole[k].data_ptr()  # a view of its row: no stack
            assert torch.equal(whole[k], one[name])


def transform_replacing_masks(sample, generator):
    sample["mask"] = sample["mask"].flip(0) if sample["index"] % 2 else sample["mask"]
    return sample


@pytest.mark.parametrize("case", ["record twice", "transform", "skip"])
def test_batches_that_cannot_be_their_slots_are_still_right(root, tmp_path, case):
    keys = [(i, 0, 9) for i in range(N)]
    kw = {}
    if case == "record twice":
        keys = [(3, 0, 9), (3, 0, 2), *keys[4:]]  # two crops of record 3
    elif case == "transform":
        kw = {"sample_transform": transform_replacing_masks}
    batch = dataset(root, **kw).__getitems__(keys)
    if case == "skip":
        pack(root / "list.jsonl", tmp_path / "d.fl", file_columns=("mask", "deep"), format="hdf5", progress=False)
        ds = dataset(tmp_path, on_error="skip")
        start = ds.manifest.shards[0].data_offset + int(ds.index.files["mask"].offset[2])
        with open(tmp_path / "d.fl" / "shard-00000.h5", "r+b") as f:
            f.seek(start + 30)
            f.write(b"\xff\xff")  # record 2's mask fails its checksum
        with pytest.warns(fastload.errors.SkippedRecordWarning, match="record 2"):
            batch = ds.__getitems__(keys)
        keys = [key for key in keys if key[0] != 2]
    reference = alone(dataset(root, **kw), keys)
    for name in ("mask", "deep"):
        assert batch.fields[name].shape[0] == len(keys)
        for k, one in enumerate(reference):
            assert torch.equal(batch.fields[name][k], one[name]), (name, k)


def test_slots_of_another_dtype_or_a_replaced_mask_are_not_the_batch():
    slots = FieldSlots([4, 7, 4, 9], (2, 3))
    assert slots.slot_of("mask", 4)(torch.uint8) is None  # met twice: no slot
    first = slots.slot_of("mask", 7)(torch.uint8)
    assert first.shape == (2, 3) and slots.slot_of("mask", 9)(torch.int32) is None  # the batch is uint8
    values = [torch.zeros(2, 3, dtype=torch.uint8), first, torch.zeros(2, 3, dtype=torch.uint8),
              slots.slot_of("mask", 9)(torch.uint8)]
    assert slots.collated("mask", values) is None  # samples 0 and 2 are tensors of their own
    everyone = FieldSlots([1, 2], (3, 3))
    mine = [everyone.slot_of("mask", i)(torch.uint8) for i in (1, 2)]
    assert everyone.collated("mask", mine) is everyone.tensors["mask"]
    for replaced in (mine[1].clone(), mine[1].t()):  # a copy; the slot seen transposed
        assert everyone.collated("mask", [mine[0], replaced]) is None
    assert everyone.collated("other", mine) is None
