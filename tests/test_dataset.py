"""PackedDataset: the map-style Dataset API, and use from DataLoader workers under fork and spawn."""

from __future__ import annotations

import io
import json
import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from fastload.converters import pack
from fastload import CorruptRecordError, PackedDataset
from fastload.verifier import verify
from tests.conftest import copy_dataset, flip_payload_byte, imagefolder_files, write_tree

STORAGES = ["lmdb", "hdf5"]


@pytest.fixture(params=STORAGES)
def dataset(packed, request):
    out, files = packed(request.param)
    return PackedDataset(out), files


def decoded(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_len_classes_and_targets(dataset):
    ds, files = dataset
    assert len(ds) == len(files)
    assert ds.classes == ["cat", "dog", "emu"] and ds.class_to_idx == {"cat": 0, "dog": 1, "emu": 2}
    targets = ds.targets
    assert targets.dtype == np.int64 and not targets.flags.writeable
    assert targets.tolist() == [ds.classes.index(p.split("/")[0]) for p in sorted(files)]
    assert isinstance(ds, torch.utils.data.Dataset)


def test_getitem_gives_an_rgb_image_and_its_label(dataset):
    ds, files = dataset
    for i, path in enumerate(sorted(files)):
        image, label = ds[i]
        assert isinstance(image, Image.Image) and image.mode == "RGB"
        assert np.array_equal(np.asarray(image), decoded(files[path]))
        assert label == ds.classes.index(path.split("/")[0]) and type(label) is int


def test_record_gives_the_stored_bytes_and_metadata(dataset):
    ds, files = dataset
    for i, path in enumerate(sorted(files)):
        record = ds.record(i)
        assert record["data"] == files[path] and record["path"] == path
        assert (record["width"], record["height"]) == Image.open(io.BytesIO(files[path])).size
        assert record["label"] == ds.targets[i]


def test_indexing_like_a_sequence(dataset):
    ds, files = dataset
    n = len(ds)
    assert ds.record(-1)["path"] == ds.record(n - 1)["path"] == sorted(files)[-1]
    assert ds[-n][1] == ds[0][1]
    for bad in (n, -n - 1, 10**9):
        with pytest.raises(IndexError, match=f"record index {bad} is out of range for a dataset of {n}"):
            ds[bad]
        with pytest.raises(IndexError):
            ds.record(bad)
    assert ds[np.int64(1)][1] == ds[1][1]


def test_transforms_apply_to_image_and_label(packed):
    out, files = packed("lmdb")
    ds = PackedDataset(out, transform=lambda img: img.size, target_transform=lambda y: f"class {y}")
    size, label = ds[0]
    assert size == Image.open(io.BytesIO(files[sorted(files)[0]])).size and label == "class 0"


def test_pickles_without_its_arrays_and_reopens(dataset):
    ds, _ = dataset
    ds[0]  # open handles: they must not travel
    blob = pickle.dumps(ds)
    assert b"numpy" not in blob and len(blob) < 2000
    copy = pickle.loads(blob)
    assert len(copy) == len(ds) and copy.record(3) == ds.record(3)
    assert repr(copy) == repr(ds) and f"storage={ds.manifest.storage!r}" in repr(ds)


def test_two_datasets_over_one_directory_and_verify_while_open(dataset):
    ds, _ = dataset
    other = PackedDataset(ds.root)
    assert [other.record(i)["data"] for i in range(len(ds))] == [ds.record(i)["data"] for i in range(len(ds))]
    assert verify(ds.root).ok  # a third reader of the same files, in the same process
    assert ds.record(0)["data"] == other.record(0)["data"]


def test_extra_fields_come_back_with_python_types(tmp_path):
    files = write_tree(tmp_path / "data", imagefolder_files({"x": 3}))
    rows = [{"path": p, "label": "b" if i else "a", "score": i / 4, "rank": i, "tag": f"t{i}"}
            for i, p in enumerate(sorted(files))]
    (tmp_path / "data" / "list.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pack(tmp_path / "data" / "list.jsonl", tmp_path / "out", progress=False)
    ds = PackedDataset(tmp_path / "out")
    got = [ds.record(i) for i in range(3)]
    assert [(r["score"], r["rank"], r["tag"]) for r in got] == [(0.0, 0, "t0"), (0.25, 1, "t1"), (0.5, 2, "t2")]
    assert [type(got[1][k]) for k in ("score", "rank", "tag")] == [float, int, str]
    assert ds.classes == ["a", "b"] and ds.targets.tolist() == [0, 1, 1]


def test_a_damaged_record_raises_naming_it(packed, tmp_path):
    out = copy_dataset(packed("hdf5")[0], tmp_path / "ds")
    shard = flip_payload_byte(out, 4)
    ds = PackedDataset(out)
    with pytest.raises(CorruptRecordError, match=rf"{shard} record 4 \({ds.index.path[4]}\): checksum mismatch"):
        ds[4]
    assert ds[3] and ds[5]  # the rest still read


def test_a_dataset_of_other_files_yields_their_bytes(tmp_path):
    write_tree(tmp_path / "src", {"a.bin": b"plain bytes"})
    pack(tmp_path / "src", tmp_path / "out", extensions=["bin"], progress=False)
    ds = PackedDataset(tmp_path / "out")
    assert ds.manifest.kind == "files" and ds.record(0)["width"] == -1
    assert ds[0] == (b"plain bytes", -1)
    with pytest.raises(ValueError, match="not all images"):
        PackedDataset(tmp_path / "out", image_size=32, train=True)


# --- DataLoader workers -------------------------------------------------------------------------------

def _expected_pixels(files: dict[str, bytes]) -> torch.Tensor:
    return torch.stack([torch.from_numpy(decoded(files[p]).copy()) for p in sorted(files)])


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_dataloader_with_two_workers(packed, context):
    # Both storage kinds in one loader (a ConcatDataset): spawned workers cost seconds to start.
    parts = [PackedDataset(packed(storage)[0], transform=np.asarray) for storage in STORAGES]
    files = packed("lmdb")[1]  # the same source for both; every image 40x32, so batches stack
    expected_images = torch.cat([_expected_pixels(files)] * 2)
    expected_labels = torch.cat([torch.tensor(ds.targets) for ds in parts])
    for ds in parts:
        ds[0]  # handles opened in the parent before the workers start (the fork trap)
    loader = DataLoader(torch.utils.data.ConcatDataset(parts), batch_size=4, num_workers=2,
                        multiprocessing_context=context, timeout=120, persistent_workers=True)
    for _ in range(2):  # two epochs through the same workers
        batches = list(loader)
        images = torch.cat([b[0] for b in batches])
        labels = torch.cat([b[1] for b in batches])
        assert images.dtype == torch.uint8 and images.shape == (2 * len(files), 32, 40, 3)
        assert torch.equal(images, expected_images) and torch.equal(labels, expected_labels)
    assert all(ds[len(ds) - 1][0].shape == (32, 40, 3) for ds in parts)  # the parent still reads


class _Records(torch.utils.data.Dataset):
    """Stored bytes by index through ``record``: what the workers read, before any decode."""

    def __init__(self, ds: PackedDataset) -> None:
        self.ds = ds

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> bytes:
        return self.ds.record(i)["data"]


@pytest.mark.parametrize("storage", STORAGES)
def test_forked_workers_read_bit_exact_bytes_in_any_order(packed, storage):
    out, files = packed(storage)
    ds = PackedDataset(out)
    ds.record(0)
    order = torch.randperm(len(files), generator=torch.Generator().manual_seed(0)).tolist()
    loader = DataLoader(_Records(ds), batch_size=None, sampler=order, num_workers=2,
                        multiprocessing_context="fork", timeout=120)
    assert list(loader) == [files[sorted(files)[i]] for i in order]


def test_dataloader_reports_a_worker_error_naming_the_record(packed, tmp_path):
    out = copy_dataset(packed("lmdb")[0], tmp_path / "ds")
    flip_payload_byte(out, 2)
    loader = DataLoader(PackedDataset(out, transform=np.asarray), batch_size=2, num_workers=2,
                        multiprocessing_context="fork", timeout=120)
    with pytest.raises(CorruptRecordError, match=r"record 2 \(.*\): checksum mismatch"):
        list(loader)


def test_a_relative_path_still_reads_after_the_working_directory_changes(packed, tmp_path, monkeypatch):
    dataset, files = packed("lmdb")
    monkeypatch.chdir(dataset.parent)
    ds = PackedDataset(dataset.name)  # relative; shards open lazily, at the first read
    monkeypatch.chdir(tmp_path)
    assert ds.record(0)["data"] == files[ds.record(0)["path"]]
    assert ds.root == dataset


def test_the_built_in_pipeline_asks_which_it_is_for(packed):
    """Issue 47 item 4: ``image_size=`` without ``train=`` gave a validation set training's random
    crops and flips, silently. Now it asks; each answer gives what it names."""
    packed, _ = packed("lmdb")
    with pytest.raises(ValueError) as raised:
        PackedDataset(packed, image_size=16)
    message = str(raised.value)
    assert message.startswith(f"PackedDataset({str(packed)!r}, image_size=16): say which pipeline, train=True (")
    assert "random crop and flip" in message and "train=False (resize and centre crop, the same every time" in message
    evaluation = PackedDataset(packed, image_size=16, train=False)
    assert torch.equal(evaluation[0][0], evaluation[0][0])  # the same crop every time
    assert PackedDataset(packed, image_size=16, train=True).pipeline.train
    assert PackedDataset(packed)[0][0].mode == "RGB"  # without image_size there is nothing to choose
