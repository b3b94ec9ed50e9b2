"""Samples with any fields (issue 17): ``PackedDataset(fields=...)`` gives dict samples, and batches
whose fields are collated by type: numbers as tensors, text as lists, arrays stacked, listed, or
padded with their lengths (``pad_fields``)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fastload
from fastload.converters import pack
from tests.conftest import make_jpeg

ROWS = [{"path": f"{i}.jpg", "label": i % 2, "boxes": [[i, k, i + 10, k + 20] for k in range(i % 3)],
         "embedding": [i / 8, 1.0], "score": i * 0.5, "caption": f"photo {i}"} for i in range(7)]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("fields")
    for i in range(len(ROWS)):
        (root / f"{i}.jpg").write_bytes(make_jpeg(48, 40, seed=i))
    (root / "list.jsonl").write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    pack(root / "list.jsonl", root / "d.fl", progress=False)
    return root / "d.fl"


ALL = ("image", "label", "boxes", "embedding", "score", "caption")


def test_a_sample_is_the_dict_of_the_fields_asked_for(dataset):
    ds = fastload.PackedDataset(dataset, image_size=32, train=False, fields=ALL)
    sample = ds[2]
    assert list(sample) == list(ALL)
    assert sample["image"].shape == (3, 32, 32) and sample["label"] == 0 and sample["caption"] == "photo 2"
    assert torch.equal(sample["boxes"], torch.tensor([[2.0, 0, 12, 20], [2, 1, 12, 21]], dtype=torch.float64))
    assert sample["score"] == 1.0 and torch.equal(sample["embedding"], torch.tensor([0.25, 1.0], dtype=torch.float64))
    plain = fastload.PackedDataset(dataset, fields=("caption", "image"))[1]
    assert list(plain) == ["caption", "image"] and plain["image"].size == (48, 40)  # a PIL image


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_collate_each_field_by_its_type(dataset, workers):
    ds = fastload.PackedDataset(dataset, image_size=32, train=False, fields=ALL, pad_fields={"boxes": -1.0})
    batches = list(fastload.DataLoader(ds, batch_size=4, shuffle=False, num_workers=workers,
                                       mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25)))
    first = batches[0]
    assert first["image"].dtype == torch.float32 and first["image"].shape == (4, 3, 32, 32)  # normalised
    assert first["label"].tolist() == [0, 1, 0, 1]
    assert first["caption"] == ["photo 0", "photo 1", "photo 2", "photo 3"]
    assert first["score"].dtype == torch.float64 and first["score"].tolist() == [0, 0.5, 1.0, 1.5]
    assert first["embedding"].shape == (4, 2)  # a fixed shape: stacked
    assert first["boxes_lengths"].tolist() == [0, 1, 2, 0]
    assert first["boxes"].shape == (4, 2, 4) and bool((first["boxes"][0] == -1).all())
    assert first["boxes"][2].tolist() == ROWS[2]["boxes"]
    assert sum(len(b["caption"]) for b in batches) == len(ROWS)


def test_variable_length_fields_come_as_lists_unless_padded(dataset):
    ds = fastload.PackedDataset(dataset, image_size=32, train=True, fields=("image", "boxes"))
    batch = next(iter(fastload.DataLoader(ds, batch_size=3, shuffle=False)))
    assert isinstance(batch["boxes"], list) and [b.shape for b in batch["boxes"]] == [(0, 4), (1, 4), (2, 4)]


def test_field_arguments_are_checked(dataset):
    with pytest.raises(ValueError, match="has no field 'mask'; it has image, label, boxes"):
        fastload.PackedDataset(dataset, fields=("image", "mask"))
    with pytest.raises(ValueError, match=r"pad_fields: 'embedding' is not one of the variable-length array "
                                         r"fields asked for \(boxes\)"):
        fastload.PackedDataset(dataset, fields=("boxes", "embedding"), pad_fields={"embedding": 0})
    with pytest.raises(TypeError, match=r"pass a sequence of names, e.g. fields=\('boxes',\)"):
        fastload.PackedDataset(dataset, fields="boxes")
    with pytest.raises(ValueError, match="pass fields= too"):
        fastload.PackedDataset(dataset, pad_fields={"boxes": 0})
    with pytest.raises(ValueError, match="target_transform= is for"):
        fastload.PackedDataset(dataset, fields=("label",), target_transform=str)
    assert np.array_equal(fastload.PackedDataset(dataset).record(1)["boxes"], [[1, 0, 11, 20]])


def test_fields_are_read_once_and_each_asked_for_once(dataset):
    """A generator gives the same samples as the tuple of its names; a name twice is refused
    (before, the dataset's fields listed it twice while samples, tuples and batches held it once)."""
    ds = fastload.PackedDataset(dataset, fields=(name for name in ("label", "caption")), sample_as="tuple")
    assert ds.fields == ("label", "caption") and ds[1] == (1, ds.record(1)["caption"])
    for twice in (("image", "label", "label"), ["label", "label"]):
        with pytest.raises(ValueError, match=r"'label' is asked for 2 times; name each field once"):
            fastload.PackedDataset(dataset, fields=twice)
    with pytest.raises(TypeError, match=r"3 is not a field name"):
        fastload.PackedDataset(dataset, fields=("label", 3))


def test_skipped_records_leave_dict_batches_counted_and_dali_refuses_fields(dataset, tmp_path):
    from tests.conftest import copy_dataset, flip_payload_byte

    damaged = copy_dataset(dataset, tmp_path / "damaged.fl")
    flip_payload_byte(damaged, 3)
    ds = fastload.PackedDataset(damaged, image_size=32, train=True, fields=("image", "caption"), on_error="skip")
    loader = fastload.DataLoader(ds, batch_size=4, shuffle=False, mode="threads")  # the warning in this process
    with pytest.warns(fastload.errors.SkippedRecordWarning):
        batches = list(loader)
    captions = [c for b in batches for c in b["caption"]]
    assert "photo 3" not in captions and len(captions) == len(ROWS) - 1
    assert batches[0]["image"].shape == (3, 3, 32, 32) and loader.stats()["skipped"] == 1
    with pytest.raises(ValueError, match="fields= .* need backend='torch'"):
        fastload.DataLoader(fastload.PackedDataset(dataset, image_size=32, train=True, fields=("image",)), batch_size=2,
                            backend="dali")

